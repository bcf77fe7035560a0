"""Hosts (evidence.lib.hosts): registered by their importer, silent when they stop reporting, and
shown so on the Hosts page, on /metrics, in the inbox and in the header's count."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.urls import reverse

from evidence.lib import hosts
from evidence.models import AuditEntry, Finding, Host, HumanDecision, Run
from evidence.review import inbox, settle
from receipts import protocol
from tests.helpers import PROJECT, content, first_call_of, join
from tests.subprocess_db import child_env, database_url_for_children, manage_command, this_database_url
from tests.test_operations import scrape

pytestmark = pytest.mark.django_db


def shipping(name: str, *, seen_ago: float = 0.0, stopped: bool = False) -> Host:
    now = protocol.utc_now()
    return Host.objects.create(
        name=name, runs_root=f"/srv/{name}", version="0.1.0", started_at=now - dt.timedelta(hours=1),
        last_seen_at=now - dt.timedelta(seconds=seen_ago), last_pass_seconds=0.4, watching=True,
        stopped_at=now if stopped else None,
    )  # fmt: skip


def test_a_host_is_silent_when_it_stops_reporting_or_says_it_stopped(db, settings):
    settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS = 60
    fresh, quiet, stopped = (
        shipping("fresh", seen_ago=5),
        shipping("quiet", seen_ago=61),
        shipping("gone", stopped=True),
    )
    one_off = Host.objects.create(name="cron", runs_root="", version="0.1.0", started_at=protocol.utc_now(),
                                  last_seen_at=protocol.utc_now() - dt.timedelta(days=3))  # fmt: skip
    assert set(hosts.silent().values_list("name", flat=True)) == {"quiet", "gone"}
    states = {host.name: hosts.state_of(host) for host in (fresh, quiet, stopped, one_off)}
    assert states == {"fresh": "shipping", "quiet": "silent", "gone": "stopped", "cron": "one-off"}
    assert {host.name for host in Host.objects.all() if hosts.is_silent(host)} == {"quiet", "gone"}


def test_a_silent_host_is_an_inbox_item_and_down_on_metrics(demo, logged_in, client):
    before = inbox.inbox_total()
    shipping("host-a", seen_ago=3600)
    shipping("host-b")
    [item] = [item for item in inbox.inbox_items() if item.kind == inbox.HOST]
    assert (item.subject, item.severity, item.action) == ("host-a", "error", "host")
    assert inbox.inbox_total() == before + 1 and inbox.inbox_counts()[inbox.HOST] == 1
    page = content(logged_in.get("/inbox/"))
    assert "host <code>host-a</code>" in page and reverse("hosts") in page
    values = scrape(client)
    assert values[("callproof_host_up", (("host", "host-a"),))] == 0
    assert values[("callproof_host_up", (("host", "host-b"),))] == 1
    hosts_page = content(logged_in.get("/hosts/"))
    assert "host-a" in hosts_page and 'badge-bad">silent' in hosts_page and 'badge-ok">shipping' in hosts_page


def test_a_hosts_deliveries_and_last_error_are_on_metrics_the_hosts_page_and_the_api(
    demo, logged_in, client, settings, django_user_model
):
    confirmer = join(django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer")
    owner = settings.EVIDENCE_HOST_NAME
    settings.EVIDENCE_HOST_NAME = "web-host"  # decided away from the runs' host: they wait for it
    for run_id in ("send-message-killed", "write-file-killed"):
        call = first_call_of(run_id)
        settle.settle_call(run=call.run, call=call, user=confirmer, resolution="rejected", reason="bounced",
                           typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256,
                           confirm_queryable=True)  # fmt: skip
    settings.EVIDENCE_HOST_NAME = owner
    host = Host.objects.get(name=owner)
    Host.objects.filter(pk=host.pk).update(watching=True)
    an_hour_ago = protocol.utc_now() - dt.timedelta(hours=1)
    waiting = HumanDecision.objects.filter(run__host=host)
    waiting.filter(run__run_id="send-message-killed").update(decided_at=an_hour_ago, delivery_error="OSError: full")
    waiting.filter(run__run_id="write-file-killed").update(undeliverable="the run directory already holds another")
    hosts.record_error(host, "OperationalError: the connection is closed")

    values = scrape(client)
    label = (("host", owner),)
    assert 3590 < values[("callproof_decision_oldest_undelivered_seconds", label)] < 3700
    assert values[("callproof_decisions_awaiting_delivery", label)] == 1
    assert values[("callproof_decisions_failing_delivery", label)] == 1
    assert values[("callproof_decisions_refused_total", label)] == 1
    assert values[("callproof_host_info", (("host", owner), ("version", host.version)))] == 1
    assert abs(values[("callproof_host_last_error_timestamp_seconds", label)] - time.time()) < 60
    page = content(logged_in.get("/hosts/"))
    assert "a pass failed at" in page and "the connection is closed" in page
    assert "oldest" in page and "1 failing to be written" in page and "1 refused" in page
    [row] = [row for row in logged_in.get("/api/hosts").json()["items"] if row["name"] == owner]
    assert (row["awaiting_delivery"], row["failing_delivery"], row["refused_deliveries"]) == (1, 1, 1)
    assert row["last_error"] == "OperationalError: the connection is closed" and row["last_error_at"]
    assert row["oldest_undelivered_at"].startswith(an_hour_ago.strftime("%Y-%m-%dT%H:%M"))


def test_a_superuser_retires_a_host_that_will_not_report_again(demo, client, django_user_model):
    gone = shipping("gone", stopped=True)
    client.force_login(django_user_model.objects.create_superuser("root", password="a-long-password-1"))
    response = client.post("/admin/receipts/host/", {"action": "retire", "_selected_action": [gone.pk]})
    assert response.status_code == 302
    gone.refresh_from_db()
    assert not gone.watching and not hosts.silent().exists()
    assert hosts.state_of(gone) == hosts.ONE_OFF


@pytest.mark.django_db(transaction=True)
def test_a_watching_importer_registers_beats_and_says_it_stopped(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    env = child_env(url) | {"EVIDENCE_HOST_NAME": "agent-7"}
    watch = subprocess.Popen(manage_command("import_runs", str(demo_root), "--watch", "--interval", "0.2"),
                             cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        query = (
            "from evidence.models import Host; h = Host.objects.get(name='agent-7');"
            "print(h.last_pass_seconds is not None, h.watching, h.stopped_at is None, h.runs.count())"
        )
        deadline, seen = time.monotonic() + 60, ""
        while time.monotonic() < deadline and not seen.startswith("True True True"):
            seen = subprocess.run(manage_command("shell", "-v", "0", "-c", query), env=env, capture_output=True,
                                  text=True, check=False).stdout.strip()  # fmt: skip
            time.sleep(0.2)
        assert seen == f"True True True {len(list(demo_root.iterdir()))}"
    finally:
        watch.send_signal(signal.SIGTERM)
        _, said = watch.communicate(timeout=30)
        assert watch.returncode == 0, said
    stopped = subprocess.run(manage_command("shell", "-v", "0", "-c", "from evidence.models import Host; "
                             "print(Host.objects.get(name='agent-7').stopped_at is not None)"),
                             env=env, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert stopped == "True", said


def start_watch(root, url, name: str, *extra_env: tuple[str, str]) -> subprocess.Popen[str]:
    env = child_env(url) | {"EVIDENCE_HOST_NAME": name} | dict(extra_env)
    return subprocess.Popen(manage_command("import_runs", str(root), "--watch", "--interval", "0.2"), cwd=PROJECT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip


def host_row(name: str) -> Host | None:
    return Host.objects.filter(name=name).first()


def passed_once(name: str) -> bool:
    row = host_row(name)
    return row is not None and row.last_pass_seconds is not None


def wait_for_a_pass(name: str) -> Host:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if passed_once(name):
            return Host.objects.get(name=name)
        time.sleep(0.2)
    raise AssertionError(f"host {name} never finished a pass")


def end(watch: subprocess.Popen[str]) -> str:
    if watch.poll() is None:
        watch.send_signal(signal.SIGTERM)
    return watch.communicate(timeout=30)[1]


@pytest.mark.django_db(transaction=True)
def test_a_second_watch_under_a_shipping_hosts_name_is_refused_and_shown(demo_root, tmp_path, user, client):
    url = this_database_url()
    other_root = tmp_path / "other-runs"
    other_root.mkdir()
    first = start_watch(demo_root, url, "twin")
    try:
        before = wait_for_a_pass("twin")
        second = start_watch(other_root, url, "twin")
        assert second.wait(60) == 1
        said = second.communicate()[1]
        assert "host 'twin' is already shipping" in said and f"pid {first.pid}" in said, said
        # A one-off import under the name changes nothing of the shipping host either.
        one_off = subprocess.run(manage_command("import_runs", str(other_root)), cwd=PROJECT, text=True,
                                 env=child_env(url) | {"EVIDENCE_HOST_NAME": "twin"}, capture_output=True)  # fmt: skip
        assert one_off.returncode == 0, one_off.stderr
        after = Host.objects.get(name="twin")
        assert (after.pid, after.runs_root, after.watching, after.stopped_at) == (first.pid, str(demo_root), True, None)
        assert after.lease == before.lease and after.refused_from == str(other_root) and after.refused_at is not None
        client.force_login(user)
        page = content(client.get("/hosts/"))
        assert "a second importer under this name was refused at" in page and f"<code>{other_root}</code>" in page
        assert first.poll() is None, "the first watch ships on"
    finally:
        said = end(first)
    assert first.returncode == 0, said
    assert Host.objects.get(name="twin").stopped_at is not None, "the holder's SIGTERM says the host stopped"


@pytest.mark.django_db(transaction=True)
def test_a_watch_silent_past_the_limit_loses_the_name_to_the_next_and_stops(demo_root, tmp_path):
    url = this_database_url()
    quick = ("EVIDENCE_HOST_SILENT_AFTER_SECONDS", "2")
    first = start_watch(demo_root, url, "relay", quick)
    try:
        wait_for_a_pass("relay")
        first.send_signal(signal.SIGSTOP)  # a machine that froze: it reports nothing
        time.sleep(2.5)
        second = start_watch(demo_root, url, "relay", quick)
        try:
            taken = Host.objects.get(name="relay")
            deadline = time.monotonic() + 60
            while taken.pid != second.pid and time.monotonic() < deadline:
                time.sleep(0.2)
                taken = Host.objects.get(name="relay")
            assert taken.pid == second.pid, "the silent host's name went to the next importer"
            first.send_signal(signal.SIGCONT)
            assert first.wait(60) == 1, "the first stops, never ships beside the second"
            said = first.communicate()[1]
            assert "another importer took host 'relay'" in said, said
            time.sleep(1)
            row = Host.objects.get(name="relay")
            assert (row.pid, row.lease, row.stopped_at) == (second.pid, taken.lease, None), "its exit changed nothing"
        finally:
            said = end(second)
        assert second.returncode == 0, said
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("clock_off", [-300, 3600], ids=["behind", "ahead"])
def test_a_hosts_clock_is_not_what_judges_it(demo_root, tmp_path, settings, clock_off):
    """Every host time is the database's: a host 5 minutes behind ships, one an hour ahead and
    killed goes silent."""
    settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS = 3
    url = this_database_url()
    its_clock = protocol.format_time(protocol.utc_now() + dt.timedelta(seconds=clock_off))
    watch = start_watch(
        demo_root, url, "skewed", ("RECEIPTS_CLOCK", its_clock), ("EVIDENCE_HOST_SILENT_AFTER_SECONDS", "3")
    )
    try:
        host = wait_for_a_pass("skewed")
        time.sleep(0.5)
        assert hosts.state_of(Host.objects.get(name="skewed")) == hosts.SHIPPING
        assert abs((host.last_seen_at - protocol.utc_now()).total_seconds()) < 60, "stamped on the server's clock"
    finally:
        watch.kill()
        watch.communicate()
    time.sleep(3.5)
    assert hosts.state_of(Host.objects.get(name="skewed")) == hosts.SILENT


@pytest.mark.django_db(transaction=True)
def test_a_watch_restarted_after_a_crash_takes_its_name_back_at_once(demo_root):
    """systemd restarts a killed importer within seconds: its dead predecessor on this machine
    holds the name no longer (a live one elsewhere would, until silent)."""
    url = this_database_url()
    crashed = start_watch(demo_root, url, "phoenix")
    wait_for_a_pass("phoenix")
    crashed.kill()
    crashed.communicate()
    restarted = start_watch(demo_root, url, "phoenix")
    try:
        deadline = time.monotonic() + 60
        while Host.objects.get(name="phoenix").pid != restarted.pid and restarted.poll() is None:
            assert time.monotonic() < deadline, "the restarted watch never took the name"
            time.sleep(0.2)
        assert restarted.poll() is None, "refused: " + restarted.communicate()[1]
        registered = Host.objects.get(name="phoenix")
        assert registered.machine == hosts.this_machine()
        while Host.objects.get(name="phoenix").last_seen_at == registered.last_seen_at:  # its first pass ends
            assert time.monotonic() < deadline, "the restarted watch never finished a pass"
            time.sleep(0.2)
    finally:
        said = end(restarted)
    assert restarted.returncode == 0, said


@pytest.mark.django_db(transaction=True)
def test_a_host_renamed_by_host_move_ships_its_runs_and_delivers_their_decisions(
    demo_root, settings, django_user_model
):
    url = this_database_url()
    old = start_watch(demo_root, url, "box-1")
    wait_for_a_pass("box-1")
    refused = subprocess.run(manage_command("host", "move", "box-1", "box-2", "--reason", "renamed"), cwd=PROJECT,
                             env=child_env(url), capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and "host 'box-1' is shipping" in refused.stderr, refused.stderr
    assert end(old) is not None and old.returncode == 0
    runs = set(Run.objects.filter(host__name="box-1").values_list("run_id", flat=True))
    assert runs == {path.name for path in demo_root.iterdir()}

    # A decision made away from the host waits for box-1 to write it.
    confirmer = join(django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer")
    call = first_call_of("send-message-killed")
    settings.EVIDENCE_HOST_NAME = "web-host"
    settle.settle_call(run=call.run, call=call, user=confirmer, resolution="committed", reason="the mail log shows it",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    confirmation = Path(call.run.path) / "confirmations" / f"{call.call_id}.json"
    assert not confirmation.exists()

    moved = subprocess.run(manage_command("host", "move", "box-1", "box-2", "--reason", "the machine was renamed"),
                           cwd=PROJECT, env=child_env(url), capture_output=True, text=True)  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.strip() == f"{len(runs)} run(s) of host box-1 are host box-2's now"
    new = start_watch(demo_root, url, "box-2")
    try:
        wait_for_a_pass("box-2")
        deadline = time.monotonic() + 60
        while not confirmation.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert confirmation.exists(), "the renamed host delivers the decision about its run"
    finally:
        said = end(new)
    assert new.returncode == 0, said
    assert set(Run.objects.filter(host__name="box-2").values_list("run_id", flat=True)) == runs
    assert not Finding.objects.filter(code="duplicate_run_id", closed_at__isnull=True).exists(), "its own runs"
    entries = AuditEntry.objects.filter(action=AuditEntry.HOST_MOVED)
    assert entries.count() == len(runs) and {e.reason for e in entries} == {
        "host box-1 moved to box-2: the machine was renamed"
    }
    assert hosts.state_of(Host.objects.get(name="box-1")) == hosts.ONE_OFF, "the old name is retired"
