"""A decision against the evidence asks twice, and its consequence is checked (issue 55, case 5).

Real parts throughout: the writer (a child process killed after the message went out, its receipt
left prepared), a real import, the settle form posted through Django's test client, the decision
written into the run directory as the project writes it, and the runtime resuming through the
writer's command line.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from evidence.ingest import delivery, importer
from evidence.models import AuditEntry, Call, Finding, HumanDecision, Run
from evidence.review import inbox, kinds
from receipts.demo import run_writer
from tests.helpers import content, join, settle_form
from tests.ledger import events_of
from tests.writer import MESSAGE, cli_call, only_receipt, outbox_lines

pytestmark = pytest.mark.django_db

SENT_LINE = 'line <span translate="no">1</span>: message <span translate="no">msg-'  # a page's fact of the outbox


@pytest.fixture
def as_confirmer(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("erin", password="a-long-password-1"), "confirmer"))
    return client


def sent_in_doubt(run_dir: Path) -> Call:
    """The writer killed after the message was sent, before its receipt said so; imported."""
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    assert len(outbox_lines(run_dir)) == 1
    importer.run_import(path=run_dir)
    call = Call.objects.get(call_id=only_receipt(run_dir))
    assert call.status == "prepared" and call.in_doubt
    return call


# The reason each decision here gives, which the audit quotes.
REASON = "the mail server has no record of it"


def call_url(call: Call) -> str:
    return reverse("call", args=[call.run.run_id, call.call_id])


def confirm_url(call: Call) -> str:
    return reverse("confirm", args=[call.run.run_id, call.call_id])


def resume_as_the_runtime(run_dir: Path) -> None:
    """What a runtime does next: the call again at its attempt, then (told it did not happen) the next attempt."""
    again = cli_call(run_dir, "send_message", MESSAGE)
    assert again.returncode == 3 and json.loads(again.stdout)["status"] == "rejected", again.stdout
    assert run_writer("state", str(run_dir), "retrying", "--attempts", "1").returncode == 0
    retried = cli_call(run_dir, "send_message", MESSAGE, attempt=None)
    assert retried.returncode == 0, retried.stdout


def test_did_not_happen_against_a_target_that_shows_the_message_needs_a_second_confirmation(run_dir, as_confirmer):
    call = sent_in_doubt(run_dir)
    page = content(as_confirmer.get(call_url(call)))
    assert 'badge-info">present' in page and SENT_LINE in page

    refused = as_confirmer.post(confirm_url(call), settle_form(call, "rejected", REASON))
    assert refused.status_code == HTTPStatus.BAD_REQUEST
    page = content(refused)
    assert "You chose “It did not happen”, and the target shows the effect." in page
    assert 'name="confirm_against_evidence"' in page and page.count(SENT_LINE) == 2  # the panel's and the warning's
    assert "What the target shows contradicts your answer." in page  # in the summary and beside the box
    assert not HumanDecision.objects.exists()
    assert not (run_dir / "confirmations").exists() or not any((run_dir / "confirmations").iterdir())
    assert events_of(run_dir, "confirmation") == []
    # What the evidence agrees with needs no second confirmation (and the form with the tick is the same one).
    assert 'id="id_confirm_against_evidence"' in page

    ticked = settle_form(call, "rejected", REASON, confirm_against_evidence="on")
    settled = as_confirmer.post(confirm_url(call), ticked)
    assert settled.status_code == HTTPStatus.SEE_OTHER
    decision = HumanDecision.objects.get()
    assert decision.resolution == "rejected" and decision.delivered_at is not None  # written into the run at once
    assert len(events_of(run_dir, "confirmation")) == 1


def test_happened_against_a_target_that_shows_nothing_needs_a_second_confirmation(run_dir, as_confirmer):
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    importer.run_import(path=run_dir)
    call = Call.objects.get(call_id=only_receipt(run_dir))
    url = confirm_url(call)
    refused = as_confirmer.post(url, settle_form(call, "committed", REASON))
    assert refused.status_code == HTTPStatus.BAD_REQUEST
    assert "You chose “It happened”, and the target does not show the effect." in content(refused)
    assert not HumanDecision.objects.exists()
    # The answer the evidence agrees with goes through at once.
    assert as_confirmer.post(url, settle_form(call, "rejected", REASON)).status_code == HTTPStatus.SEE_OTHER
    assert HumanDecision.objects.get().resolution == "rejected"


def test_a_message_sent_again_after_did_not_happen_is_a_finding_and_an_inbox_item(run_dir, as_confirmer):
    call = sent_in_doubt(run_dir)
    ticked = settle_form(call, "rejected", REASON, confirm_against_evidence="on")
    assert as_confirmer.post(confirm_url(call), ticked).status_code == 303

    resume_as_the_runtime(run_dir)
    assert len(outbox_lines(run_dir)) == 2, "sent twice: what the decision made happen"
    importer.run_import(path=run_dir)

    finding = Finding.objects.get(run__run_id=run_dir.name, code="decision_contradicted", closed_at__isnull=True)
    assert finding.call_id == call.call_id and finding.severity == "error"
    assert finding.sentence == "decision_contradicted.not_done" and "line 1: message msg-" in finding.detail
    [item] = [item for item in inbox.inbox_items(run_id=run_dir.name) if item.code == "decision_contradicted"]
    assert item.kind == kinds.CONTRADICTED
    run_page = content(as_confirmer.get(reverse("run", args=[run_dir.name])))
    assert "Nothing in this run needs a person" not in run_page
    assert "decision_contradicted" in run_page
    # The call page keeps what the target shows after the decision, and says it contradicts it.
    call_page = content(as_confirmer.get(call_url(call)))
    assert "What the target shows now" in call_page and SENT_LINE in call_page
    assert 'id="target-contradicts"' in call_page

    importer.run_import(path=run_dir, force=True)
    assert Finding.objects.filter(code="decision_contradicted").count() == 1, "said once, however often imported"


def test_a_target_that_shows_one_call_twice_is_a_finding_whatever_the_decision(run_dir, as_confirmer):
    call = sent_in_doubt(run_dir)
    settled = as_confirmer.post(confirm_url(call), settle_form(call, "committed", REASON))
    assert settled.status_code == HTTPStatus.SEE_OTHER, "the answer the evidence agrees with: no second tick"
    resumed = cli_call(run_dir, "send_message", MESSAGE)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["reused"] is True
    importer.run_import(path=run_dir)
    assert not Finding.objects.filter(code="decision_contradicted").exists(), "one line: the decision holds"

    # Another sender (a second runtime, a script) sent it again under the same call_id.
    outbox = run_dir / "outbox.jsonl"
    outbox.write_bytes(outbox.read_bytes() * 2)
    (run_dir / "events.jsonl").touch()  # the import looks again at a run whose files changed
    importer.run_import(path=run_dir, force=True)
    finding = Finding.objects.get(code="decision_contradicted", closed_at__isnull=True)
    assert finding.sentence == "decision_contradicted.more_than_once" and "2 times" in finding.detail


# --- a decision not yet written can be withdrawn ------------------------------------------------


@pytest.fixture
def settled_elsewhere(run_dir, as_confirmer, settings):
    """The run imported by its host; the person settles on a web process on another machine, so the
    decision waits for the run's host to write it (evidence.ingest.delivery)."""
    call = sent_in_doubt(run_dir)
    settings.EVIDENCE_HOST_NAME = "web-host"
    settled = as_confirmer.post(confirm_url(call), settle_form(call, "committed", REASON))
    assert settled.status_code == HTTPStatus.SEE_OTHER
    decision = HumanDecision.objects.get()
    assert decision.pending and not (run_dir / "confirmations" / f"{call.call_id}.json").exists()
    return call


def withdraw_url(call: Call) -> str:
    return reverse("withdraw", args=[call.run.run_id, call.call_id])


def test_a_decision_not_yet_written_is_withdrawn_audited_and_never_delivered(run_dir, as_confirmer, settled_elsewhere):
    call = settled_elsewhere
    page = content(as_confirmer.get(call_url(call)))
    assert "waiting for host" in page and f'action="{withdraw_url(call)}"' in page

    withdrawn = as_confirmer.post(withdraw_url(call))
    assert withdrawn.status_code == HTTPStatus.SEE_OTHER and withdrawn["Location"] == call_url(call)
    assert not HumanDecision.objects.exists()
    entry = AuditEntry.objects.get(action=AuditEntry.DECISION_WITHDRAWN)
    assert (entry.subject, entry.actor, entry.run_id) == (call.call_id, "erin", call.run.pk)
    assert entry.reason.startswith("committed, decided by erin at ") and "no record of it" in entry.reason
    assert Call.objects.get(pk=call.pk).in_doubt, "in doubt again"
    page = content(as_confirmer.get(call_url(call)))
    assert "Withdrawn: the decision that this call happened was never written into the run." in page
    assert "This call is in doubt" in page and 'name="resolution"' in page, "anyone may decide afresh"
    audit = content(as_confirmer.get(reverse("audit") + f"?run={run_dir.name}"))
    assert "a decision withdrawn before it was written into the run" in audit

    host = Run.objects.get(run_id=run_dir.name).host
    assert host is not None
    assert delivery.deliver_pending(host=host) == delivery.DeliveryReport(), "nothing left to write"
    assert events_of(run_dir, "confirmation") == []


def test_a_decision_written_into_the_run_cannot_be_withdrawn(run_dir, as_confirmer, settled_elsewhere):
    call = settled_elsewhere
    host = Run.objects.get(run_id=run_dir.name).host
    assert host is not None
    assert delivery.deliver_pending(host=host) == delivery.DeliveryReport(delivered=1)
    assert f'action="{withdraw_url(call)}"' not in content(as_confirmer.get(call_url(call)))
    refused = as_confirmer.post(withdraw_url(call))
    assert refused.status_code == HTTPStatus.CONFLICT
    assert "cannot be withdrawn. Nothing was changed." in content(refused)
    assert HumanDecision.objects.get().delivered_at is not None
    assert not AuditEntry.objects.filter(action=AuditEntry.DECISION_WITHDRAWN).exists()


def test_a_decision_withdrawn_after_its_host_listed_it_is_not_written(run_dir, as_confirmer, settled_elsewhere):
    host = Run.objects.get(run_id=run_dir.name).host
    assert host is not None
    [listed] = delivery.pending_for(host)
    assert as_confirmer.post(withdraw_url(settled_elsewhere)).status_code == HTTPStatus.SEE_OTHER
    assert delivery.deliver(listed, host_name=host.name) == delivery.WITHDRAWN
    assert not (run_dir / "confirmations").exists() or not any((run_dir / "confirmations").iterdir())


def test_withdrawing_is_guarded_like_every_write(run_dir, settled_elsewhere, client, django_user_model, settings):
    url = withdraw_url(settled_elsewhere)
    client.logout()  # the fixture's client settled; now nobody is logged in
    anonymous = client.post(url)
    assert anonymous.status_code == HTTPStatus.FOUND and anonymous["Location"].startswith(reverse("login"))
    viewer = join(django_user_model.objects.create_user("vic", password="a-long-password-1"), "viewer")
    client.force_login(viewer)
    assert client.post(url).status_code == HTTPStatus.FORBIDDEN
    assert f'action="{url}"' not in content(client.get(call_url(settled_elsewhere)))
    confirmer = django_user_model.objects.get(username="erin")
    client.force_login(confirmer)
    assert client.get(url).status_code == HTTPStatus.METHOD_NOT_ALLOWED
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(confirmer)
    assert strict.post(url).status_code == HTTPStatus.FORBIDDEN
    settings.EVIDENCE_READ_ONLY = True
    assert client.post(url).status_code == HTTPStatus.FORBIDDEN
    assert HumanDecision.objects.get().pending, "nothing was withdrawn"
