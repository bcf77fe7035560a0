"""The inbox: every kind of item that needs a person, their order, filters, twins, and leaving."""

from __future__ import annotations

import json
from http import HTTPStatus

import pytest
from django.urls import reverse

from evidence.models import Call
from evidence.review import inbox
from tests.helpers import content, first_call_of, join

pytestmark = pytest.mark.django_db


def kinds_by_run() -> set[tuple[str, str]]:
    return {(item.kind, item.run_id) for item in inbox.inbox_items()}


def test_the_demo_inbox_holds_each_kind_of_item(demo):
    assert kinds_by_run() == {
        (inbox.IN_DOUBT, "send-message-killed"),
        (inbox.IN_DOUBT, "write-file-killed"),
        (inbox.TAMPERED, "tampered-receipt"),
        (inbox.CONFLICT, "conflict-same-id"),
        (inbox.STALE, "stale-reservation"),
    }
    # One item an item: the conflict (a conflict disposition and a second digest) is one.
    assert inbox.inbox_total() == 5 == sum(inbox.inbox_counts().values())


def test_a_submission_conflict_is_one_item_with_both_digests(logged_in, demo):
    [item] = inbox.inbox_items(kind=inbox.CONFLICT)
    assert item.subject == "submission conflict-submission" and item.finding_id is not None
    first, then = item.stored_value, item.recomputed_value
    assert len(first) == len(then) == 64 and first != then
    assert "disposition conflict" in item.detail and "two request digests" in item.detail
    page = content(logged_in.get("/inbox/?kind=conflict"))
    assert page.count("submission conflict-submission") == 1
    assert f'title="{first}"' in page and f'title="{then}"' in page


def test_items_are_most_serious_first_then_oldest_first(demo):
    items = inbox.inbox_items()
    severities = [item.severity for item in items]
    assert severities == sorted(severities, key=lambda severity: severity != "error")
    query = next(item for item in items if item.run_id == "write-file-killed")
    assert query.severity == "warning" and "the runtime can ask the target" in query.detail


def test_a_broken_ledger_is_an_item(demo):
    from evidence.ingest import importer

    ledger = demo / "clean-run" / "events.jsonl"
    lines = ledger.read_bytes().splitlines()
    ledger.write_bytes(
        b"\n".join(
            [
                lines[0],
                b'{"seq":2,"ts":"2026-11-30T00:00:00Z","type":"note","prev_sha256":"' + b"0" * 64 + b'"}',
                *lines[2:],
            ]
        )
        + b"\n"
    )
    importer.run_import(path=demo / "clean-run")
    assert (inbox.LEDGER, "clean-run") in kinds_by_run()


def test_the_inbox_page_has_filters_twins_and_a_count_in_every_header(logged_in, demo):
    page = content(logged_in.get("/inbox/"))
    assert 'title="items that need a person">5</span>' in page
    assert "Settle" in page and "Look at the reservation" in page and "Look at the finding" in page
    only = content(logged_in.get("/inbox/?kind=tampered"))
    assert "tampered-receipt" in only and "send-message-killed</a>" not in only
    items = json.loads(content(logged_in.get("/inbox/?format=json&severity=warning")))["items"]
    assert items and {item["severity"] for item in items} == {"warning"}
    assert 'title="items that need a person">5</span>' in content(logged_in.get("/findings/"))


def test_the_home_page_starts_with_the_inbox(logged_in, demo):
    page = content(logged_in.get("/"))
    assert page.index("5 items need a person") < page.index("<h1>Runs</h1>")


def test_settling_an_item_takes_it_out_of_the_inbox(client, demo, user):
    join(user, "confirmer")
    client.force_login(user)
    call = first_call_of("send-message-killed")
    form = {
        "resolution": "rejected",
        "reason": "bounced",
        "confirm_call_id": call.call_id[:12],
        "receipt_sha256": call.file_sha256,
        "confirm_against_evidence": "on",  # its outbox shows the message: "did not happen" asks twice
    }
    assert client.post(reverse("confirm", args=["send-message-killed", call.call_id]), form).status_code == 303
    assert (inbox.IN_DOUBT, "send-message-killed") not in kinds_by_run()
    polled = client.get("/inbox/", headers={"HX-Request": "true"})
    assert polled.status_code == HTTPStatus.OK and "send-message-killed" not in content(polled)
    assert content(polled).lstrip().startswith('<section id="inbox-list"')
    assert Call.objects.get(pk=call.pk).decision == "retry"
