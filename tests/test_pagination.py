"""Keyset pages (evidence.lib.pagination) over every list of the site: walked forward from the
first page and backward from the last, page by page as a person follows the links, each list
gives every item exactly once, in its order, whatever its segments and their keys."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.exceptions import BadRequest
from django.test import RequestFactory

from evidence.lib import pagination
from evidence.lib.pagination import cursor_page, every_row, first_rows
from evidence.models import Run
from evidence.retention import actions, plans
from evidence.review import listings, settle
from receipts import protocol
from tests.helpers import CONTRACT, first_call_of, import_as_seen_later, join
from tests.volume import synthetic_run

pytestmark = pytest.mark.django_db


def page_at(segments, cursor: str, per_page: int):
    request = RequestFactory().get("/", {"page": cursor} if cursor else {})
    return cursor_page(request, segments, per_page=per_page)


def cursor_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["page"][0]


def walk(segments, per_page: int, *, backward: bool = False) -> list:
    seen: list = []
    cursor = "last" if backward else ""
    for _ in range(10_000):
        page = page_at(segments, cursor, per_page)
        assert len(page.object_list) <= per_page
        seen = page.object_list + seen if backward else seen + page.object_list
        following = page.newer_url if backward else page.older_url
        if following is None:
            assert page.is_first if backward else page.is_last
            return seen
        cursor = cursor_of(following)
    raise AssertionError("the pages never end")


def every_listing(now) -> dict[str, listings.Listing]:
    run = Run.objects.get(run_id="many-calls")
    policy = plans.RetentionPolicy.from_settings()
    return {
        "runs": listings.runs(),
        "runs needing attention": listings.runs(attention=True),
        "events": listings.events(run=run),
        "calls": listings.calls(run=run),
        "decisions": listings.decisions(run=run),
        "findings": listings.findings(),
        "stale": listings.stale(),
        "inbox": listings.inbox(),
        "audit": listings.audit_decisions(),
        "actions": listings.audit_actions(),
        "retention": listings.retention(policy=policy, now=now),
    }


@pytest.fixture
def many(demo_root, django_user_model):
    """The demo, a run of 300 events and 120 calls, and a dozen more runs (two with no event yet)."""
    synthetic_run(demo_root / "many-calls", events=300, receipts=120, contract=CONTRACT)
    for index in range(10):
        synthetic_run(demo_root / f"more-{index:02d}", events=5, receipts=1, contract=CONTRACT)
    import_as_seen_later(demo_root)
    for index in range(2):
        Run.objects.create(run_id=f"empty-{index}", path=str(demo_root / f"empty-{index}"))
    person = join(django_user_model.objects.create_user("carol"), "confirmer")
    for run_id in ("send-message-killed", "write-file-killed"):
        call = first_call_of(run_id)
        settle.settle_call(run=call.run, call=call, user=person, resolution="rejected", reason="not sent",
                           typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256,
                           confirm_queryable=True, confirm_against_evidence=True)  # fmt: skip
    for run_id in ("clean-run", "a2-lost-response", "legacy-task"):
        actions.set_legal_hold(run=Run.objects.get(run_id=run_id), user=person, hold=True, reason="a case",
                                 now=protocol.utc_now())  # fmt: skip


@pytest.mark.parametrize("per_page", [1, 3, 7])
def test_every_list_pages_to_its_end_and_back_with_every_item_once(many, per_page, monkeypatch):
    now = protocol.utc_now()
    for name, listing in every_listing(now).items():
        whole = list(every_row(listing.segments))
        assert whole, name
        monkeypatch.setattr(pagination, "CHUNK", 4)  # a twin reads by key, chunk after chunk
        assert [listing.item(row) for row in every_row(listing.segments)] == [listing.item(row) for row in whole]
        monkeypatch.undo()
        forward = walk(listing.segments, per_page)
        assert [listing.item(row) for row in forward] == [listing.item(row) for row in whole], name
        if name not in ("events", "calls", "decisions", "stale", "inbox") or per_page == 7:
            backward = walk(listing.segments, per_page, backward=True)
            assert [listing.item(row) for row in backward] == [listing.item(row) for row in whole], name
        assert [listing.item(row) for row in first_rows(listing.segments, 2)] == [
            listing.item(row) for row in whole[:2]
        ], name


def test_the_runs_list_puts_the_latest_activity_first_and_runs_with_no_event_last(many):
    runs = [run for run, _ in every_row(listings.runs().segments)]
    active = [run for run in runs if run.last_event_at is not None]
    assert (
        runs[-2:]
        == [run for run in runs if run.last_event_at is None]
        == list(Run.objects.filter(last_event_at__isnull=True).order_by("run_id"))
    )
    assert [run.last_event_at for run in active] == sorted((run.last_event_at for run in active), reverse=True)


def test_the_inbox_pages_errors_before_warnings_and_each_kind_oldest_first(many):
    items = list(every_row(listings.inbox().segments))
    severities = [item.severity for item in items]
    assert severities == sorted(severities, key=lambda severity: severity != "error")
    assert len({(item.kind, item.run_id, item.subject) for item in items}) == len(items)


def encoded(values) -> str:
    import base64
    import json

    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        f"after.9.{encoded(['2026-11-30T00:00:00+00:00', 'a'])}",  # no such segment
        "after.0.bm9wZQ",  # not JSON
        f"after.0.{encoded(['x'])}",  # one key where the segment has two
        f"before.0.{encoded(['2026-13-01T00:00:00+00:00', 'a'])}",  # no such day
        f"before.0.{encoded(['2026-11-30T00:00:00', 'a'])}",  # a time with no zone
        f"after.0.{encoded([5, 'a'])}",  # a number where the key is a time
        f"after.1.{encoded([5])}",  # a number where the key is text
        "after.0." + encoded(["2026-11-30T00:00:00+00:00", "a\x00"]),  # a NUL
        "sideways",
    ],
)
def test_a_cursor_this_site_did_not_make_is_a_400(many, cursor):
    with pytest.raises(BadRequest):
        page_at(listings.runs().segments, cursor, 5)
