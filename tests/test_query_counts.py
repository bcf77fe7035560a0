"""Every page makes a fixed number of queries, whatever the size of what it shows.

Each page is asked for twice: once over the demo and one small synthetic run,
and again after that run has grown tenfold and thirty more runs have come.
The counts must be equal, and within each page's budget: a query per row, or
a count over a run, would show up as a difference.
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evidence.models import Call, Event, Run
from tests.helpers import CONTRACT, first_call_of, import_as_seen_later
from tests.volume import synthetic_ledger, synthetic_run

BIG = "volume-run"


def ledger_pages(client) -> dict[str, str]:
    """The run page's ledger at its first, middle and last page, and the call list's second page."""
    run = Run.objects.get(run_id=BIG)
    base = f"/runs/{BIG}/"
    last = client.get(base, {"page": "last"})
    older = [url for rel, url in last.context["timeline"].links if rel == "first"]
    calls = client.get(base).context["calls"]
    return {
        "run, ledger first page": base,
        "run, ledger middle (go to seq)": base + "?" + urlencode({"seq": run.ledger_last_seq // 2}),
        "run, ledger last page": base + "?page=last",
        "run, ledger filtered": base + "?type=receipt",
        "run, ledger page by htmx": base + "?type=note&page=last",
        "run, calls second page": base + calls.older_url,
        "run, first page again": base + older[0],
    }


def pages(client) -> dict[str, str]:
    big_call = Call.objects.filter(run__run_id=BIG).order_by("call_id").first()
    assert big_call is not None
    doubt = first_call_of("send-message-killed")
    return {
        "runs": "/",
        "runs needing attention": "/?attention=1",
        **ledger_pages(client),
        "call": f"/runs/{BIG}/calls/{big_call.call_id}/",
        "call in doubt": f"/runs/send-message-killed/calls/{doubt.call_id}/",
        "recovery": f"/runs/{BIG}/replay/",
        "recovery, second page": f"/runs/{BIG}/replay/?page=last",
        "findings": "/findings/",
        "stale": "/reservations/",
        "search": "/search/?q=run",
        "inbox": "/inbox/",
        "audit": "/audit/",
        "retention": "/retention/",
    }


def query_counts(client) -> dict[str, int]:
    counts = {}
    for name, url in pages(client).items():
        with CaptureQueriesContext(connection) as queries:
            htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "timeline"} if "htmx" in name else {}
            response = client.get(url, **htmx)
        assert response.status_code == 200, (name, url, response.status_code)
        counts[name] = len(queries)
    return counts


@pytest.mark.django_db(transaction=False)
def test_no_page_makes_more_queries_for_a_bigger_run(logged_in, demo_root, tmp_path):
    run_dir = demo_root / BIG
    synthetic_run(run_dir, events=400, receipts=120, contract=CONTRACT)
    import_as_seen_later(demo_root)
    small = query_counts(logged_in)

    synthetic_ledger(run_dir, 4_000, start_seq=401)
    for index in range(30):
        synthetic_run(demo_root / f"more-{index:02d}", events=20, receipts=2, contract=CONTRACT)
    import_as_seen_later(demo_root)
    assert Event.objects.filter(run__run_id=BIG).count() == 4_400 and Run.objects.count() >= 40
    big = query_counts(logged_in)

    assert big == small
    # The budget, page by page: the session and user (2), the inbox count in the header (3: calls, findings,
    # hosts silent or stalled), and the page's own (an inbox table's "I'm on it" claims: 1, on the runs page's;
    # an inbox's sources: a segment each, silent and stalled hosts two of them).
    assert max(big.values()) <= 19, big
