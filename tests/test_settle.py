"""Settling a call in doubt: every guard, the effects all or nothing, two people at once."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
import time
from http import HTTPStatus
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from evidence.ingest import importer
from evidence.models import Call, Confirmation, Finding, HumanDecision
from evidence.review import settle
from receipts import protocol, runtime
from tests.helpers import content, first_call_of, join
from tests.ledger import events_of

pytestmark = pytest.mark.django_db

RUN = "send-message-killed"


@pytest.fixture
def confirmer(django_user_model):
    """A person in the "confirmers" group."""
    user = django_user_model.objects.create_user("carol", password="a-long-password-1")
    join(user, "confirmer")
    return user


@pytest.fixture
def as_confirmer(client, confirmer):
    client.force_login(confirmer)
    return client


def form_for(call: Call, **changes: str) -> dict[str, str]:
    data = {
        "resolution": "committed",
        "reason": "the mail server's log shows the message",
        "confirm_call_id": call.call_id[:12],
        "receipt_sha256": call.file_sha256,
    }
    return data | changes


def confirm_url(call: Call) -> str:
    return reverse("confirm", args=[call.run.run_id, call.call_id])


def nothing_recorded(run_dir: Path, call: Call) -> None:
    assert not HumanDecision.objects.exists()
    assert not (run_dir / "confirmations" / f"{call.call_id}.json").exists()
    assert events_of(run_dir, "confirmation") == []


def test_settling_writes_the_file_the_event_and_the_audit_row(as_confirmer, demo):
    call = first_call_of(RUN)
    run_dir = demo / RUN
    response = as_confirmer.post(confirm_url(call), form_for(call), REMOTE_ADDR="192.0.2.7")
    assert response.status_code == HTTPStatus.SEE_OTHER
    assert response["Location"] == reverse("call", args=[RUN, call.call_id])
    document = json.loads((run_dir / "confirmations" / f"{call.call_id}.json").read_bytes())
    receipt_bytes = (run_dir / "receipts" / f"{call.call_id}.json").read_bytes()
    assert protocol.confirmation_problem(document, call.call_id, protocol.sha256_hex(receipt_bytes)) is None
    assert (document["actor"], document["resolution"]) == ("carol", "committed")
    [event] = events_of(run_dir, "confirmation")
    assert event["confirmation_id"] == document["confirmation_id"] and event["actor"] == "carol"
    decision = HumanDecision.objects.get()
    assert decision.user is not None
    assert (decision.actor, decision.user.username, decision.client_address) == ("carol", "carol", "192.0.2.7")
    assert protocol.format_time(decision.decided_at) == document["confirmed_at"]
    call.refresh_from_db()
    assert call.decision == "reuse"
    assert not Finding.objects.filter(call_id=call.call_id, code="stale_call", closed_at__isnull=True).exists()
    page = content(as_confirmer.get(response["Location"]))
    assert "Settled as committed" in page and "Settled by a person" in page and "Audit entry" in page
    assert 'action="/runs/' not in page, "a settled call offers no form"


def test_the_next_import_agrees_with_what_settling_wrote(as_confirmer, demo):
    call = first_call_of(RUN)
    as_confirmer.post(confirm_url(call), form_for(call))
    before = list(Call.objects.filter(pk=call.pk).values_list("decision", "decision_reason"))
    importer.run_import(path=demo / RUN)
    assert list(Call.objects.filter(pk=call.pk).values_list("decision", "decision_reason")) == before
    assert Finding.objects.filter(run__run_id=RUN, closed_at__isnull=True).count() == 0


@pytest.mark.parametrize(("proxies", "recorded"), [(0, "127.0.0.1"), (1, "203.0.113.9"), (2, "198.51.100.4")])
def test_the_audit_records_the_address_the_throttle_sees(as_confirmer, demo, settings, proxies, recorded):
    """One rule for the client's address (evidence/lib/proxy.py): the entry the outermost declared
    proxy appended; what the client put in front of it is never read."""
    settings.PROXY_COUNT = proxies
    call = first_call_of(RUN)
    forwarded = "6.6.6.6, 198.51.100.4, 203.0.113.9"  # the client's own claim, then two proxies' entries
    response = as_confirmer.post(confirm_url(call), form_for(call), REMOTE_ADDR="127.0.0.1",
                                 HTTP_X_FORWARDED_FOR=forwarded)  # fmt: skip
    assert response.status_code == HTTPStatus.SEE_OTHER
    assert HumanDecision.objects.get().client_address == recorded


def test_get_is_405_and_csrf_is_enforced(confirmer, demo):
    call = first_call_of(RUN)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(confirmer)
    assert strict.get(confirm_url(call)).status_code == HTTPStatus.METHOD_NOT_ALLOWED
    assert strict.post(confirm_url(call), form_for(call)).status_code == HTTPStatus.FORBIDDEN
    nothing_recorded(demo / RUN, call)
    page = content(strict.get(reverse("call", args=[RUN, call.call_id])))
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.split('class="settle"')[1])
    assert found, page
    token = found.group(1)
    response = strict.post(confirm_url(call), form_for(call, csrfmiddlewaretoken=token))
    assert response.status_code == HTTPStatus.SEE_OTHER


def test_without_the_permission_there_is_no_form_and_a_post_is_403(logged_in, demo):
    call = first_call_of(RUN)
    page = content(logged_in.get(reverse("call", args=[RUN, call.call_id])))
    assert "This call is in doubt" in page and "Settle this call" not in page
    assert logged_in.post(confirm_url(call), form_for(call)).status_code == HTTPStatus.FORBIDDEN
    nothing_recorded(demo / RUN, call)


def test_anonymous_posts_go_to_the_login(client, demo):
    call = first_call_of(RUN)
    response = client.post(confirm_url(call), form_for(call))
    assert response.status_code == HTTPStatus.FOUND and response["Location"].startswith("/accounts/login/")
    nothing_recorded(demo / RUN, call)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"confirm_call_id": "000000000000"}, "Type the first 12 characters"),
        ({"reason": "   "}, "Give the reason for your decision"),
        ({"resolution": "maybe"}, "Select a valid choice"),
        ({"receipt_sha256": "not a digest"}, "did not come back with the form"),
    ],
)
def test_a_form_that_does_not_hold_is_400_and_records_nothing(as_confirmer, demo, changes, message):
    call = first_call_of(RUN)
    response = as_confirmer.post(confirm_url(call), form_for(call, **changes))
    assert response.status_code == HTTPStatus.BAD_REQUEST
    assert message in content(response)
    nothing_recorded(demo / RUN, call)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"confirm_call_id": "000000000000"}, "confirm_call_id", "call_id to confirm"),
        ({"reason": "   "}, "reason", "Give the reason for your decision"),
    ],
)
def test_an_error_sits_beside_its_field_which_says_it_is_invalid(as_confirmer, demo, changes, field, message):
    call = first_call_of(RUN)
    html = content(as_confirmer.post(confirm_url(call), form_for(call, **changes)))
    widget = re.search(rf'<(?:input|textarea)[^>]*name="{field}"[^>]*>', html)
    assert widget and 'aria-invalid="true"' in widget.group(0)
    described = re.search(r'aria-describedby="([^"]+)"', widget.group(0))
    assert described and f"id_{field}_error" in described.group(1).split()
    beside = re.search(rf'<[^>]+id="id_{field}_error"[^>]*>([^<]*)<', html)
    assert beside and message in beside.group(1)
    summary = re.search(r'<div class="error-summary" id="settle-errors" role="alert".*?</div>', html, re.S)
    assert summary and f'href="#id_{field}"' in summary.group(0) and message in summary.group(0)
    assert html.count(message) == 2, "said beside the field, and in the summary that links to it"


def test_every_field_that_does_not_hold_is_said_at_once(as_confirmer, demo):
    """What the form refuses (an unknown answer) and what the settle needs (a reason, the call_id
    typed) in one answer, each beside its field: not one a post."""
    call = first_call_of(RUN)
    response = as_confirmer.post(confirm_url(call), form_for(call, resolution="maybe", reason="", confirm_call_id="x"))
    html = content(response)
    assert response.status_code == HTTPStatus.BAD_REQUEST
    for field, message in [
        ("resolution", "Select a valid choice"),
        ("reason", "Give the reason for your decision"),
        ("confirm_call_id", "Type the first 12 characters of this call"),
    ]:
        beside = re.search(rf'id="id_{field}_error"[^>]*>([^<]*)<', html)
        assert beside and message in beside.group(1), field
    assert 'value="x"' in html, "what was typed is kept"
    nothing_recorded(demo / RUN, call)


def test_an_old_form_posted_again_after_the_call_was_settled_says_it_was_settled(as_confirmer, demo):
    """Back to the page a mistyped settle answered, then reload: the browser posts that old form
    again. The answer is the decision on record, not the old form's complaint."""
    call = first_call_of(RUN)
    mistyped = form_for(call, confirm_call_id="000000000000")
    assert as_confirmer.post(confirm_url(call), mistyped).status_code == HTTPStatus.BAD_REQUEST
    assert as_confirmer.post(confirm_url(call), form_for(call)).status_code == HTTPStatus.SEE_OTHER
    again = as_confirmer.post(confirm_url(call), mistyped | {"resolution": "rejected"})
    html = content(again)
    assert again.status_code == HTTPStatus.CONFLICT
    assert "already settled this call as committed" in html
    assert "Type the first 12 characters" not in html and 'aria-invalid="true"' not in html
    assert HumanDecision.objects.get().resolution == "committed"


def test_a_decision_about_other_bytes_than_the_imported_receipt_is_refused(as_confirmer, demo):
    """The form carries the digest of the receipt now on disk (edited since the import): the
    writer's own check would pass, but nobody was shown that receipt."""
    call = first_call_of(RUN)
    path = demo / RUN / "receipts" / f"{call.call_id}.json"
    receipt = json.loads(path.read_bytes())
    receipt.update(updated_at="2026-11-30T13:00:00.000000Z")
    path.write_text(json.dumps(receipt))
    on_disk = hashlib.sha256(path.read_bytes()).hexdigest()
    response = as_confirmer.post(confirm_url(call), form_for(call, receipt_sha256=on_disk))
    assert response.status_code == HTTPStatus.CONFLICT
    assert "The receipt changed since this page showed it" in content(response)
    nothing_recorded(demo / RUN, call)


def test_a_receipt_that_changed_since_the_page_is_409_and_says_how(as_confirmer, demo):
    call = first_call_of(RUN)
    path = demo / RUN / "receipts" / f"{call.call_id}.json"
    receipt = json.loads(path.read_bytes())
    receipt.update(status="unknown", updated_at="2026-11-30T13:00:00.000000Z")
    path.write_text(json.dumps(receipt))
    response = as_confirmer.post(confirm_url(call), form_for(call))
    assert response.status_code == HTTPStatus.CONFLICT
    page = content(response)
    assert "The receipt changed since this page showed it (prepared): it now says unknown" in page
    nothing_recorded(demo / RUN, call)


def test_a_call_that_is_not_in_doubt_cannot_be_settled(as_confirmer, demo):
    call = first_call_of("clean-run")
    response = as_confirmer.post(confirm_url(call), form_for(call))
    assert response.status_code == HTTPStatus.CONFLICT and "not in doubt" in content(response)
    nothing_recorded(demo / "clean-run", call)


def test_a_decision_is_never_changed_and_the_same_one_is_recorded_once(as_confirmer, demo):
    call = first_call_of(RUN)
    assert as_confirmer.post(confirm_url(call), form_for(call)).status_code == HTTPStatus.SEE_OTHER
    again = as_confirmer.post(confirm_url(call), form_for(call))
    assert again.status_code == HTTPStatus.SEE_OTHER, "a double click is not an error"
    other = as_confirmer.post(confirm_url(call), form_for(call, resolution="rejected", reason="no, it did not"))
    assert other.status_code == HTTPStatus.CONFLICT
    assert "carol already settled this call as committed at" in content(other)
    assert HumanDecision.objects.count() == 1
    assert len(events_of(demo / RUN, "confirmation")) == 1


def test_a_queryable_call_needs_a_second_tick(as_confirmer, demo):
    call = first_call_of("write-file-killed")
    page = content(as_confirmer.get(reverse("call", args=["write-file-killed", call.call_id])))
    assert "the runtime can ask this tool&#x27;s target" in page.lower() or "can ask this tool" in page
    response = as_confirmer.post(confirm_url(call), form_for(call))
    assert response.status_code == HTTPStatus.BAD_REQUEST and "Tick the box" in content(response)
    nothing_recorded(demo / "write-file-killed", call)
    ticked = as_confirmer.post(confirm_url(call), form_for(call, confirm_queryable="on"))
    assert ticked.status_code == HTTPStatus.SEE_OTHER


def test_a_read_only_deployment_shows_no_form_and_refuses_posts(as_confirmer, demo, settings):
    settings.EVIDENCE_READ_ONLY = True
    call = first_call_of(RUN)
    page = content(as_confirmer.get(reverse("call", args=[RUN, call.call_id])))
    assert "This call is in doubt" in page and "Settle this call" not in page and "only browses" in page
    assert as_confirmer.post(confirm_url(call), form_for(call)).status_code == HTTPStatus.FORBIDDEN
    nothing_recorded(demo / RUN, call)


def test_a_run_directory_that_cannot_take_the_file_records_nothing(as_confirmer, demo):
    call = first_call_of(RUN)
    run_dir = demo / RUN
    (run_dir / "confirmations").rmdir()
    (run_dir / "confirmations").write_text("a file where the folder belongs")
    response = as_confirmer.post(confirm_url(call), form_for(call))
    # Not a folder where the writer makes its files: refused before a byte is written.
    assert response.status_code == HTTPStatus.CONFLICT
    assert "odd file where the writer records" in content(response) and "nothing was recorded" in content(response)
    assert not HumanDecision.objects.exists() and events_of(run_dir, "confirmation") == []


def test_a_ledger_that_cannot_take_the_event_leaves_no_confirmation_file(as_confirmer, demo):
    call = first_call_of(RUN)
    run_dir = demo / RUN
    ledger = run_dir / "events.jsonl"
    kept = ledger.read_bytes()
    ledger.unlink()
    ledger.mkdir()  # a real failure: appending to a directory
    response = as_confirmer.post(confirm_url(call), form_for(call))
    assert response.status_code == HTTPStatus.CONFLICT
    assert not (run_dir / "confirmations" / f"{call.call_id}.json").exists()
    assert not HumanDecision.objects.exists()
    ledger.rmdir()
    ledger.write_bytes(kept)


def test_the_audit_lists_every_decision_with_its_twins(as_confirmer, demo):
    call = first_call_of(RUN)
    as_confirmer.post(confirm_url(call), form_for(call))
    page = content(as_confirmer.get("/audit/"))
    assert "carol" in page and "the mail server&#x27;s log shows the message" in page
    assert content(as_confirmer.get("/audit/?resolution=rejected")).count("<tr id=") == 0
    items = json.loads(content(as_confirmer.get("/audit/?format=json&actor=carol")))["items"]
    fields = ("actor", "run_id", "call_id", "resolution")
    assert [tuple(item[f] for f in fields) for item in items] == [("carol", RUN, call.call_id, "committed")]
    assert "carol" in content(as_confirmer.get("/audit/?format=csv"))


def test_the_admin_shows_the_audit_read_only(client, demo, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="a-long-password-1")
    client.force_login(admin)
    call = first_call_of(RUN)
    client.post(confirm_url(call), form_for(call))
    decision = HumanDecision.objects.get()
    assert client.get("/admin/receipts/humandecision/").status_code == HTTPStatus.OK
    change = client.get(f"/admin/receipts/humandecision/{decision.pk}/change/")
    assert change.status_code == HTTPStatus.OK and 'name="reason"' not in content(change)
    deleted = client.post(f"/admin/receipts/humandecision/{decision.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == HTTPStatus.FORBIDDEN and HumanDecision.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_people_at_once_exactly_one_wins(demo, django_user_model):
    call = first_call_of(RUN)
    people = [django_user_model.objects.create_user(name) for name in ("dana", "erin")]
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def decide(user, resolution: str) -> None:
        try:
            barrier.wait()
            outcomes[user.username] = settle.settle_call(
                run=call.run,
                call=call,
                user=user,
                resolution=resolution,
                reason=f"{user.username} looked",
                typed_call_id=call.call_id[:12],
                receipt_sha256=call.file_sha256,
                confirm_against_evidence=True,  # its outbox shows the message: "rejected" asks twice
            )
        except settle.SettleError as refused:
            outcomes[user.username] = refused
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=pair) for pair in zip(people, ("committed", "rejected"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    wins = [o for o in outcomes.values() if isinstance(o, settle.Settlement)]
    losses = [o for o in outcomes.values() if isinstance(o, settle.SettleError)]
    assert len(wins) == 1 and len(losses) == 1, outcomes
    assert losses[0].status == HTTPStatus.CONFLICT and losses[0].code == settle.ALREADY_DECIDED
    [decision] = HumanDecision.objects.all()
    [event] = events_of(demo / RUN, "confirmation")
    assert event["actor"] == decision.actor == wins[0].decision.actor
    document = json.loads((demo / RUN / "confirmations" / f"{call.call_id}.json").read_bytes())
    assert document["resolution"] == decision.resolution


def lock_wait_of(backend_pid: list[int], seconds: float = 30) -> tuple[str, str, str] | None:
    """What the PostgreSQL backend in ``backend_pid`` waits on, once it waits on a lock (None: it never did)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if backend_pid:
            with connection.cursor() as cursor:
                query = "SELECT wait_event_type, wait_event, query FROM pg_stat_activity WHERE pid = %s"
                cursor.execute(query, backend_pid)
                row = cursor.fetchone()
            if row is not None and row[0] == "Lock":
                return row
        time.sleep(0.01)
    return None


@pytest.mark.postgresql(
    reason="SQLite takes its write lock at BEGIN (IMMEDIATE): settle_call waits before its check, then sees "
    "the other decision there; no connection can insert between its check and its insert"
)
@pytest.mark.django_db(transaction=True)
def test_a_decision_inserted_after_the_check_loses_the_other_settle_on_the_unique_constraint(demo, django_user_model):
    """The row lock queues two settle_calls on PostgreSQL, so the second finds the first decision in its
    check and never reaches its insert. The unique constraint is for a decision that no row lock queued:
    a second real connection inserts one and holds its transaction open; dana's settle_call, past its
    check (an uncommitted row is invisible to it), waits on the unique index at its own insert, and gets
    the IntegrityError when erin's transaction commits, with her confirmation written by the writer."""
    call = first_call_of(RUN)
    run_dir = demo / RUN
    dana, erin = (django_user_model.objects.create_user(name) for name in ("dana", "erin"))
    inserted, commit = threading.Event(), threading.Event()
    dana_backend: list[int] = []
    outcomes: dict[str, object] = {}

    def erin_decides() -> None:
        """A decision inserted with no lock on the call's row, committed (with its file) when told."""
        try:
            with transaction.atomic():
                decided_at = protocol.utc_now()
                decision = HumanDecision.objects.create(
                    run=call.run,
                    call_id=call.call_id,
                    resolution="committed",
                    reason="erin looked",
                    user=erin,
                    actor="erin",
                    decided_at=decided_at,
                    receipt_sha256=call.file_sha256,
                    confirmation_id=protocol.confirmation_id(call.call_id, "committed", call.file_sha256),
                )
                inserted.set()
                if not commit.wait(30):
                    raise TimeoutError("never told to commit")
                runtime.confirm_call(
                    run_dir,
                    call.call_id,
                    resolution="committed",
                    reason="erin looked",
                    actor="erin",
                    receipt_sha256=call.file_sha256,
                    confirmed_at=protocol.format_time(decided_at),
                )
            outcomes["erin"] = decision
        except Exception as error:  # noqa: BLE001 - the outcome the test checks
            outcomes["erin"] = error
        finally:
            connection.close()

    def dana_decides() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                dana_backend.append(cursor.fetchone()[0])
            outcomes["dana"] = settle.settle_call(
                run=call.run,
                call=call,
                user=dana,
                resolution="rejected",
                reason="dana looked",
                typed_call_id=call.call_id[:12],
                receipt_sha256=call.file_sha256,
                confirm_against_evidence=True,  # its outbox shows the message: "rejected" asks twice
            )
        except Exception as error:  # noqa: BLE001 - a SettleError, or an IntegrityError that got through
            outcomes["dana"] = error
        finally:
            connection.close()

    erin_thread = threading.Thread(target=erin_decides)
    dana_thread = threading.Thread(target=dana_decides)
    erin_thread.start()
    try:
        assert inserted.wait(30), outcomes
        dana_thread.start()
        waiting = lock_wait_of(dana_backend)
    finally:
        commit.set()
        erin_thread.join(30)
        dana_thread.join(30)
    assert waiting is not None, f"dana's settle_call never waited on a lock: {outcomes}"
    _, wait_event, query = waiting
    assert wait_event == "transactionid" and query.startswith('INSERT INTO "receipts_humandecision"'), waiting
    [decision] = HumanDecision.objects.all()
    assert outcomes["erin"] == decision and decision.actor == "erin"
    refused = outcomes["dana"]
    assert isinstance(refused, settle.SettleError), refused
    assert refused.status == HTTPStatus.CONFLICT and refused.existing == decision
    assert (refused.code, refused.values["actor"], refused.values["resolution"]) == (
        settle.ALREADY_DECIDED,
        "erin",
        "committed",
    )
    assert [path.name for path in (run_dir / "confirmations").iterdir()] == [f"{call.call_id}.json"]
    document = json.loads((run_dir / "confirmations" / f"{call.call_id}.json").read_bytes())
    assert (document["actor"], document["resolution"]) == ("erin", "committed")
    [event] = events_of(run_dir, "confirmation")
    assert event["actor"] == "erin" and event["confirmation_id"] == decision.confirmation_id
    assert not Confirmation.objects.exists(), "dana's transaction, rolled back, brought no confirmation in"
    importer.run_import(path=run_dir)
    assert Confirmation.objects.get().actor == "erin", "the next import reads erin's, the one on disk"


def test_a_tampered_receipt_settled_by_a_person_is_followed_by_the_runtime(as_confirmer, demo):
    from receipts.demo import run_writer

    call = first_call_of("tampered-receipt")
    assert call.verification == "mismatch" and call.status == "committed"
    page = content(as_confirmer.get(reverse("call", args=["tampered-receipt", call.call_id])))
    assert "Altered after it was written: investigate" in page and 'name="resolution"' in page
    response = as_confirmer.post(confirm_url(call), form_for(call, confirm_queryable="on"))
    assert response.status_code == HTTPStatus.SEE_OTHER
    call.refresh_from_db()
    assert call.decision == "reuse"
    run_dir = demo / "tampered-receipt"
    written = (run_dir / "workspace" / "deploy.sh").stat().st_mtime_ns
    runtime.run_set_state(run_dir, state="running", attempts=1)
    original = json.dumps({"path": "deploy.sh", "content": "echo deploy\n"})  # what the demo's call was
    resumed = run_writer("call", str(run_dir), "--tool", "write_file", "--args", original, "--attempt", "1")
    assert resumed.returncode == 0, resumed.stderr
    output = json.loads(resumed.stdout)
    assert (output["call_id"], output["reused"]) == (call.call_id, True)
    assert (run_dir / "workspace" / "deploy.sh").stat().st_mtime_ns == written, "never executed again"


def test_a_call_settled_with_the_command_line_shows_who_and_offers_no_form(as_confirmer, demo):
    from receipts.demo import run_writer

    call = first_call_of(RUN)
    settled = run_writer(
        "confirm", str(demo / RUN), call.call_id, "--resolution", "rejected", "--reason", "bounced",
        "--actor", "ops-oncall", "--receipt-sha256", call.file_sha256,
    )  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    assert json.loads(settled.stdout)["written"] is True
    importer.run_import(path=demo / RUN)
    page = content(as_confirmer.get(reverse("call", args=[RUN, call.call_id])))
    assert "ops-oncall decided at" in page and "with the writer's command line" in page
    assert "Settle this call" not in page
    again = run_writer(
        "confirm", str(demo / RUN), call.call_id, "--resolution", "committed", "--reason", "no",
        "--actor", "someone", "--receipt-sha256", call.file_sha256,
    )  # fmt: skip
    assert again.returncode == 3 and b"another decision" in again.stderr


READ_ONLY_SETTLE = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from evidence.models import Call
call = Call.objects.get(run__run_id={run!r})
client = Client(HTTP_HOST="localhost")
client.force_login(get_user_model().objects.get(username="carol"))
response = client.post(reverse("confirm", args=[{run!r}, call.call_id]), {form!r})
print(json.dumps([response.status_code, response.content.decode()]))
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_directory_on_a_read_only_filesystem_is_a_503_and_nothing_is_recorded(confirmer, demo, settings):
    """The dashboard owns the run (one machine) but its filesystem refuses the write: a real
    read-only bind mount over the run directory, in the web process's own mount namespace."""
    from tests.subprocess_db import child_env, manage_command, this_database_url

    call = first_call_of(RUN)
    run_dir = demo / RUN
    script = READ_ONLY_SETTLE.format(run=RUN, form=form_for(call))
    web = (
        f"mount --bind {run_dir} {run_dir} && mount -o remount,ro,bind {run_dir} {run_dir} && "
        f'touch {run_dir}/probe 2>/dev/null && exit 99; exec "$@"'
    )
    environment = child_env(this_database_url()) | {"EVIDENCE_HOST_NAME": settings.EVIDENCE_HOST_NAME}
    completed = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", web, "web",
         *manage_command("shell", "-v", "0", "-c", script)],
        env=environment, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    status, page = json.loads(completed.stdout.strip().splitlines()[-1])
    assert status == HTTPStatus.SERVICE_UNAVAILABLE
    assert "The run directory cannot be written" in page and "Read-only file system" in page
    assert "nothing was recorded" in page and "Traceback" not in page
    nothing_recorded(run_dir, call)
    assert Call.objects.get(pk=call.pk).in_doubt, "the call still waits for a person"


REFUSAL_VALUES = {
    settle.ALREADY_DECIDED: {
        "actor": "erin",
        "resolution": "committed",
        "time": "2026-12-06T05:00:00Z",
        "reason": "<b>seen</b>",
    },
    settle.NO_RECEIPT: {},
    settle.NOT_IN_DOUBT: {"reason": "committed: reuse, never execute again"},
    settle.RECEIPT_CHANGED: {"status": "unknown", "now_status": "committed", "now_updated_at": "2026-12-06T05:00:00Z"},
    settle.ANOTHER_DECISION_THERE: {
        "actor": "<i>frank</i>",
        "resolution": "rejected",
        "time": "2026-12-06T05:00:00Z",
        "reason": "bounced",
    },
    settle.WRITER_REFUSED: {"problem": "<script>x</script>"},
    settle.CANNOT_WRITE: {"problem": "Read-only file system"},
    settle.UNSAFE_PATH: {"problem": "confirmations is a symlink"},
    settle.WRITER_CANNOT: {"problem": "the run is signed and its key is not here"},
}


@pytest.mark.parametrize("code", sorted(REFUSAL_VALUES))
def test_every_refusal_of_a_settle_is_data_the_page_words_in_both_languages(code):
    """settle_call refuses with a code and the values it quotes; the page's sentence for each
    is in the catalogue (English and Chinese differ), and the values in it are escaped data."""
    from django.utils import translation

    from evidence.web import settle_words

    refused = settle.SettleError(HTTPStatus.CONFLICT, code, REFUSAL_VALUES[code])
    said = {}
    for language in ("en", "zh-hans"):
        with translation.override(language):
            said[language] = str(settle_words.refusal(refused))
    assert said["en"] != said["zh-hans"], said
    for text in said.values():
        assert "<script>" not in text and "<b>" not in text and "<i>" not in text, text
    if code == settle.ALREADY_DECIDED:
        assert said["en"].startswith("erin already settled this call as committed at 2026-12-06 05:00:00 UTC")
        assert "&lt;b&gt;seen&lt;/b&gt;" in said["en"]
    with pytest.raises(ValueError, match="no sentence"):
        settle_words.refusal(settle.SettleError(HTTPStatus.CONFLICT, "a_code_nobody_wrote"))


def test_each_field_problem_of_a_settle_is_a_code_the_form_words():
    from django.utils import translation

    from evidence.web import settle_words

    call = Call(call_id="0" * 64, decision="query")
    problems = settle.field_problems(call, resolution="maybe", reason=" ", typed_call_id="x", confirm_queryable=False)
    assert problems == {"resolution": settle.CHOOSE_RESOLUTION, "reason": settle.GIVE_REASON,
                        "confirm_call_id": settle.TYPE_CALL_ID, "confirm_queryable": settle.TICK_QUERYABLE}  # fmt: skip
    with translation.override("zh-hans"):
        shown = settle_words.field_problems(problems)
    assert set(shown) == set(problems) and all(message and message.isascii() is False for message in shown.values())
