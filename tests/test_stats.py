"""The counts kept at import time agree with the rows they count, however the rows came."""

from __future__ import annotations

import json
import os
from collections import Counter

from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from evidence.ingest import importer, reading
from evidence.lib import hosts, stats
from evidence.models import Call, Event, EventTally, Finding, Run
from tests.helpers import CONTRACT
from tests.volume import synthetic_ledger, synthetic_run


def counted_from_rows(run: Run) -> tuple[dict, dict]:
    """Events by type and by minute, counted over the events themselves."""
    events = Event.objects.filter(run=run)
    types = dict(events.values_list("type").annotate(n=Count("id")).order_by())
    minutes = Counter(stats.minute_of(ts) for ts in events.values_list("ts", flat=True) if ts is not None)
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
    from evidence.review import selectors

    buckets = selectors.events_histogram(run=run)
    assert len(buckets) == 24 and sum(count for _, count in buckets) == 3_000
    starts = [start for start, _ in buckets]
    assert run.first_event_at is not None and starts[0] <= run.first_event_at and starts == sorted(starts)


def test_the_counts_an_import_keeps_are_the_counts_of_its_rows(demo):
    """Every demo run, its events by type and by minute, and its summary counted again from its rows."""
    for run in Run.objects.all():
        assert stored(run) == counted_from_rows(run), run.run_id
        kept = run.summary
        assert kept is not None and stats.refresh_run_summary(run).as_stored() == kept, run.run_id
    assert Run.objects.filter(needs_attention=True).exists()


def receipts_read_during(monkeypatch, action) -> list[str]:
    """The receipt files the reader opened while ``action`` ran."""
    from receipts.reader import checks

    opened, read_regular = [], checks.read_regular

    def spy(name, dir_fd, limit):
        opened.append(name)
        return read_regular(name, dir_fd, limit)

    monkeypatch.setattr(checks, "read_regular", spy)
    action()
    monkeypatch.setattr(checks, "read_regular", read_regular)
    return [name for name in opened if len(name) > 60]  # receipts are named by their 64-hex call_id


def call_rows(run_id: str) -> list[tuple]:
    fields = [f.name for f in Call._meta.fields if f.name not in ("id", "file_signature")]
    return list(Call.objects.filter(run__run_id=run_id).order_by("call_id").values_list(*fields))


def test_one_changed_receipt_is_the_only_one_read_again(tmp_path, db, monkeypatch):
    run_dir = tmp_path / "active"
    synthetic_run(run_dir, events=300, receipts=60, contract=CONTRACT)
    importer.run_import(path=run_dir)
    receipts = sorted((run_dir / "receipts").iterdir())
    changed = receipts[7]
    document = json.loads(changed.read_bytes())
    replacement = changed.with_suffix(".tmp")
    replacement.write_text(json.dumps({**document, "status": "unknown"}))
    os.replace(replacement, changed)  # as the writer replaces a receipt

    assert receipts_read_during(monkeypatch, lambda: importer.run_import(path=run_dir)) == [changed.name]
    call = Call.objects.get(call_id=changed.stem)
    assert (call.status, call.decision) == ("unknown", "query"), "write_file's adapter can ask its target"
    assert Call.objects.filter(run__run_id="active", args=None).count() == 0, "reused rows keep their bodies"

    tampered = receipts[20]  # edited in place: same name and inode, a new mtime and ctime
    tampered.write_text(tampered.read_text().replace("content", "CONTENT"))
    assert receipts_read_during(monkeypatch, lambda: importer.run_import(path=run_dir)) == [tampered.name]
    assert Call.objects.get(call_id=tampered.stem).verification == "mismatch"
    # A receipt with findings of its own is not read again while its file has not changed: they stay open.
    findings = sorted(Finding.objects.filter(closed_at__isnull=True).values_list("code", "subject"))
    assert findings, "the tampered receipt's"
    os.utime(run_dir / "state.json")
    assert receipts_read_during(monkeypatch, lambda: importer.run_import(path=run_dir)) == []
    assert sorted(Finding.objects.filter(closed_at__isnull=True).values_list("code", "subject")) == findings

    incremental = call_rows("active")
    importer.run_import(path=run_dir, force=True)
    assert call_rows("active") == incremental, "reading every file again changes no row"


def test_a_new_contract_checks_every_receipt_again(tmp_path, db, monkeypatch):
    run_dir = tmp_path / "recontracted"
    synthetic_run(run_dir, events=100, receipts=20, contract=CONTRACT)
    importer.run_import(path=run_dir)
    (run_dir / "steer.json").write_text(json.dumps({"contract_sha256": "d" * 64}))
    read = receipts_read_during(monkeypatch, lambda: importer.run_import(path=run_dir))
    assert len(read) == 20
    assert set(Call.objects.filter(run__run_id="recontracted").values_list("verification", flat=True)) == {"mismatch"}


def test_a_watch_pass_over_unchanged_runs_makes_the_same_few_queries_however_many(tmp_path, db):
    def unchanged_pass_queries(count: int) -> int:
        for index in range(count):
            run_dir = tmp_path / f"run-{index:03d}"
            if not run_dir.exists():
                synthetic_run(run_dir, events=10, receipts=1, contract=CONTRACT)
        importer.root_import(root=tmp_path)
        with CaptureQueriesContext(connection) as queries:
            report = importer.root_import(root=tmp_path, report_unchanged=False)
        assert report.runs == []
        return len(queries)

    # The host, the runs' rows, the root's findings (in a transaction, and read back), and the
    # statement that stamps the runs checked (the hot set's: one per 500 runs).
    assert unchanged_pass_queries(5) == unchanged_pass_queries(40) <= 7


def test_findings_go_in_bulk_however_many_lines_are_broken(tmp_path, db):
    def import_queries(broken: int) -> tuple[int, int]:
        run_dir = tmp_path / f"broken-{broken}"
        synthetic_run(run_dir, events=20, receipts=2, contract=CONTRACT)
        with (run_dir / "events.jsonl").open("ab") as ledger:
            ledger.write(b"".join(b"{broken line %d\n" % n for n in range(broken)))
        with CaptureQueriesContext(connection) as queries:
            importer.run_import(path=run_dir)
        open_findings = Run.objects.get(run_id=run_dir.name).findings.filter(closed_at__isnull=True).count()
        return len(queries), open_findings

    hosts.current()  # the first import registers this host: a query or three, once
    few, many = import_queries(10), import_queries(1_000)
    assert few[1] >= 10 and many[1] >= 1_000
    assert few[0] == many[0]


def test_an_unchanged_ledger_is_not_read_again_when_other_files_change(tmp_path, db, monkeypatch):
    run_dir = tmp_path / "quiet-ledger"
    synthetic_run(run_dir, events=200, receipts=10, contract=CONTRACT)
    importer.run_import(path=run_dir)
    reads, read_ledger = [], reading.read_ledger

    def counting(*args, **kwargs):
        reads.append(args[0])
        return read_ledger(*args, **kwargs)

    monkeypatch.setattr(reading, "read_ledger", counting)
    os.utime(run_dir / "state.json")
    importer.run_import(path=run_dir)
    assert reads == [], "the ledger's size, times and inode are as they were: nothing to read"
    synthetic_ledger(run_dir, 5, start_seq=201)
    importer.run_import(path=run_dir)
    assert len(reads) == 1 and Run.objects.get(run_id="quiet-ledger").event_count == 205
