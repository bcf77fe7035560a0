"""The counts kept at import time agree with the rows they count, however the rows came."""

from __future__ import annotations

import importlib
from collections import Counter

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Count

from receipts import importer, stats
from receipts.models import Event, EventTally, Run
from tests.helpers import CONTRACT
from tests.volume import synthetic_ledger, synthetic_run


def counted_from_rows(run: Run) -> tuple[dict, dict]:
    """Events by type and by minute, counted over the events themselves."""
    events = Event.objects.filter(run=run)
    types = dict(events.values_list("type").annotate(n=Count("id")).order_by())
    minutes = Counter(stats.minute_of(ts) for ts in events.exclude(ts=None).values_list("ts", flat=True))
    return types, dict(minutes)


def stored(run: Run) -> tuple[dict, dict]:
    run.refresh_from_db()
    return run.event_type_counts, dict(EventTally.objects.filter(run=run).values_list("minute", "count"))


def test_counts_follow_the_ledger_batch_by_batch_and_across_imports(tmp_path, db):
    run_dir = tmp_path / "growing"
    synthetic_run(run_dir, events=2_500, receipts=40, contract=CONTRACT)
    importer.run_import(path=run_dir, batch_size=300)
    run = Run.objects.get(run_id="growing")
    assert stored(run) == counted_from_rows(run)
    synthetic_ledger(run_dir, 700, start_seq=2_501)
    importer.run_import(path=run_dir, batch_size=300)
    assert stored(run) == counted_from_rows(run)
    assert run.event_type_counts == {"note": 2_460 + 700, "receipt": 40}


def test_a_rewritten_ledger_starts_its_counts_again(tmp_path, db):
    run_dir = tmp_path / "rewritten"
    synthetic_run(run_dir, events=500, receipts=5, contract=CONTRACT)
    importer.run_import(path=run_dir)
    (run_dir / "events.jsonl").write_bytes(b"")
    synthetic_ledger(run_dir, 120)
    importer.run_import(path=run_dir)
    run = Run.objects.get(run_id="rewritten")
    assert stored(run) == counted_from_rows(run) and run.event_type_counts == {"note": 120}


def test_the_histogram_is_the_tallies_spread_over_the_runs_span(tmp_path, db):
    run_dir = tmp_path / "spread"
    synthetic_run(run_dir, events=3_000, receipts=0, contract=CONTRACT)
    importer.run_import(path=run_dir)
    run = Run.objects.get(run_id="spread")
    from receipts import selectors

    buckets = selectors.events_histogram(run=run)
    assert len(buckets) == 24 and sum(count for _, count in buckets) == 3_000
    starts = [start for start, _ in buckets]
    assert starts[0] <= run.first_event_at and starts == sorted(starts)


def test_the_migration_counts_runs_imported_before_it(demo):
    expected = {run.run_id: (stored(run), run.summary) for run in Run.objects.all()}
    EventTally.objects.all().delete()
    Run.objects.update(event_type_counts={}, summary=None, needs_attention=False)
    migration = importlib.import_module("receipts.migrations.0009_run_stats_and_keyset_indexes")
    state = MigrationExecutor(connection).loader.project_state(("receipts", "0009_run_stats_and_keyset_indexes"))
    migration.count_what_was_imported(state.apps, None)
    assert {run.run_id: (stored(run), run.summary) for run in Run.objects.all()} == expected
    assert Run.objects.filter(needs_attention=True).exists()
