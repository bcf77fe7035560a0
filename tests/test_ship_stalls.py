"""Every stuck path between an agent host and a person raises its hand: a run that does not
arrive, a shipper whose every push is refused, a decision its host does not write, a host whose
clock is off. Each is provoked with a real shipper that keeps shipping (``callproof ship``
against pytest-django's live server) and found where an operator looks: the inbox ("stalled
host"), /metrics, and the Prometheus rule that pages on it (its expression held against the
values scraped; promtool's own unit tests are tests/test_prometheus_rules.py).
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from evidence.models import Finding, HumanDecision, Run
from evidence.review import inbox
from receipts import durable, protocol
from tests.helpers import until
from tests.shipping import stalled_item, start_shipper
from tests.test_prometheus_rules import rule_expressions
from tests.test_ship_converges import settled

pytestmark = pytest.mark.django_db(transaction=True)


def scraped(client) -> dict[tuple[str, str], float]:
    """/metrics as Prometheus reads it: each series by name and host."""
    response = client.get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, sample.labels.get("host", "")): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def fires(alert: str, values: dict[tuple[str, str], float], host: str) -> bool:
    """Whether the rule ``alert`` (``[abs(]metric[)] > N``) holds on the host's scraped value."""
    found = re.fullmatch(r"(abs\()?(callproof_[a-z_]+)\)? > ([0-9.]+)", rule_expressions()[alert])
    assert found, rule_expressions()[alert]
    value = values[(found[2], host)]
    return (abs(value) if found[1] else value) > float(found[3])


def test_a_full_quota_refuses_every_push_and_the_run_that_waits_raises_its_hand(shipping_host, logged_in, settings):
    settings.EVIDENCE_SHIP_QUOTA_MIB = 1
    durable.append_event(shipping_host["root"] / "clean-run", "note", {"blob": "x" * 1_500_000})
    start_shipper(shipping_host)
    # Two facts, each in its own time: the host's check-in (its ledger ahead of the mirror) and a
    # refused push. Whichever the inbox sees first, both must come.
    item = until(lambda: (found := stalled_item()) and "run not arriving" in found.detail
                 and "pushes refused since" in found.detail and found, "the stalled host in the inbox")  # fmt: skip
    assert isinstance(item, inbox.InboxItem)
    assert "1 run not arriving (clean-run: " in item.detail and "pushes refused since" in item.detail
    assert "EVIDENCE_SHIP_QUOTA_MIB" in item.detail and item.action == "host"
    values = scraped(logged_in)
    assert values[("callproof_host_runs_not_arriving", "agent-a")] == 1
    host_ledger = (shipping_host["root"] / "clean-run" / "events.jsonl").stat().st_size
    mirrored = (shipping_host["mirror"] / "agent-a" / "clean-run" / "events.jsonl").stat().st_size
    assert values[("callproof_host_mirror_behind_bytes", "agent-a")] == host_ledger - mirrored > 0
    assert fires("CallproofRunsNotArriving", values, "agent-a")
    assert values[("callproof_host_pushes_refused_seconds", "agent-a")] > 0
    assert not fires("CallproofShipperRefused", values, "agent-a"), "refused for seconds, not five minutes"
    with_time = scraped_later(logged_in, minutes=6)
    assert fires("CallproofShipperRefused", with_time, "agent-a")
    page = logged_in.get("/hosts/").content.decode()
    assert "1 run not arriving:" in page and "every push refused since" in page

    settings.EVIDENCE_SHIP_QUOTA_MIB = 0  # the quota grows: the run arrives, and the hand goes down
    until(lambda: stalled_item() is None, "the stalled host to leave the inbox")
    values = scraped(logged_in)
    assert values[("callproof_host_runs_not_arriving", "agent-a")] == 0
    assert values[("callproof_host_pushes_refused_seconds", "agent-a")] == 0


def scraped_later(logged_in, *, minutes: int) -> dict[tuple[str, str], float]:
    """/metrics as a scrape ``minutes`` from now would read it (the server's clock moved on)."""
    later = protocol.format_time(protocol.utc_now() + dt.timedelta(minutes=minutes))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RECEIPTS_CLOCK", later)
        return scraped(logged_in)


def test_a_decision_its_host_does_not_write_raises_its_hand(shipping_host, client, django_user_model):
    decision = settled("send-message-killed", django_user_model)
    run_dir = shipping_host["root"] / "send-message-killed"
    run_dir.rename(shipping_host["tmp"] / "moved-away")  # the host cannot write it: it tries every pass
    start_shipper(shipping_host)
    item = until(lambda: (found := stalled_item()) and "decision not written" in found.detail and found,
                 "the stalled host in the inbox")  # fmt: skip
    assert isinstance(item, inbox.InboxItem) and "1 decision not written since" in item.detail
    assert HumanDecision.objects.get(pk=decision.pk).pending
    assert fires("CallproofDecisionUndelivered", scraped_later(client, minutes=11), "agent-a")

    (shipping_host["tmp"] / "moved-away").rename(run_dir)
    until(lambda: not HumanDecision.objects.get(pk=decision.pk).pending, "the decision written")
    until(lambda: stalled_item() is None, "the stalled host to leave the inbox")


def test_a_host_whose_clock_is_off_is_said_and_its_runs_times_are_the_servers(shipping_host, logged_in, monkeypatch):
    ahead = protocol.utc_now() + dt.timedelta(hours=1)
    # The host's clock an hour ahead: its writer stamps its events so, its shipper its requests.
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(ahead))
    durable.append_event(shipping_host["root"] / "clean-run", "note", {"text": "an hour ahead"})
    monkeypatch.delenv("RECEIPTS_CLOCK")
    start_shipper(shipping_host, RECEIPTS_CLOCK=protocol.format_time(ahead))
    item = until(lambda: (found := stalled_item()) and "clock" in found.detail and found, "the stalled host")
    assert isinstance(item, inbox.InboxItem)
    assert re.search(r"its clock is 3[56]\d\d s ahead of the server's", item.detail), item.detail
    finding = Finding.objects.get(code="host_clock_off", subject="agent-a", closed_at__isnull=True)
    # An hour less the moments between the append and the push: +3599 s on a slow day.
    assert finding.run is None and finding.root == "host agent-a" and re.search(r"\+3[56]\d\d s", finding.detail)
    values = scraped(logged_in)
    assert 3500 < values[("callproof_host_clock_offset_seconds", "agent-a")] <= 3600
    assert fires("CallproofHostClockOff", values, "agent-a")
    assert re.search(r"its clock is 3[56]\d\d s ahead of the server", logged_in.get("/hosts/").content.decode())

    # The run's time as its host wrote it is kept, and what retention and "abandoned" judge it by
    # is when the server received it: not an hour in the future.
    ledger = shipping_host["root"] / "clean-run" / "events.jsonl"
    copy = shipping_host["mirror"] / "agent-a" / "clean-run" / "events.jsonl"
    until(lambda: copy.read_bytes() == ledger.read_bytes(), "the run's new line in the mirror")
    call_command("import_mirrors")
    run = Run.objects.get(run_id="clean-run")
    assert run.last_event_at is not None and abs((run.last_event_at - ahead).total_seconds()) < 1, "the host's word"
    assert run.activity_at is not None and run.activity_at <= protocol.utc_now() < ahead
    assert run.retention_clock_from == run.activity_at

    start_shipper(shipping_host)  # the clock set right: the finding closes, the hand goes down
    until(lambda: stalled_item() is None, "the stalled host to leave the inbox")
    until(lambda: not Finding.objects.filter(code="host_clock_off", closed_at__isnull=True).exists(), "closed")
