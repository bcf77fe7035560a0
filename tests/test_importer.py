"""The importer: idempotent, incremental, crash-safe and concurrency-safe, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from evidence.ingest import importer, reading
from evidence.models import Call, Event, Finding, Run
from evidence.review import selectors
from evidence.review.selectors import calls_with_prefix
from receipts import durable, protocol, runtime
from receipts.demo import SCENARIOS
from tests.helpers import CONTRACT, first_call_of, table_snapshot
from tests.subprocess_db import (
    NEVER_STALE,
    child_env,
    database_url_for_children,
    manage,
    manage_command,
    migrated_sqlite_url,
    normalized_dump,
)
from tests.volume import synthetic_ledger

pytestmark = pytest.mark.django_db


def import_json(root: Path, *args: str) -> dict:
    out = StringIO()
    call_command("import_runs", str(root), "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_import_runs_json_reports_every_demo_run(demo_root):
    report = import_json(demo_root)
    assert [run["run_id"] for run in report["runs"]] == sorted(SCENARIOS)
    for run in report["runs"]:
        assert set(run) == {"run_id", "calls", "events", "submissions", "findings"}
    by_id = {run["run_id"]: run for run in report["runs"]}
    assert by_id["clean-run"]["calls"] == 3 and by_id["clean-run"]["findings"] == []
    assert by_id["a4-concurrent"]["events"] == 10
    assert {f["code"] for f in by_id["tampered-receipt"]["findings"]} == {"identity_mismatch", "input_digest_mismatch"}
    assert {f["code"] for f in by_id["stale-reservation"]["findings"]} == {"stale_reservation"}
    assert Call.objects.get(run__run_id="write-file-killed").decision == "query"
    assert Call.objects.get(run__run_id="send-message-killed").decision == "confirm"


def test_importing_twice_gives_the_same_database(demo_root):
    importer.root_import(root=demo_root)
    first = table_snapshot()
    importer.root_import(root=demo_root)
    assert table_snapshot() == first
    importer.root_import(root=demo_root, force=True)
    assert table_snapshot() == first


def test_unchanged_runs_are_not_read_again(demo_root, monkeypatch):
    importer.root_import(root=demo_root)
    calls = []
    monkeypatch.setattr(importer, "read_run_files", lambda *a, **k: calls.append(a))
    report = importer.root_import(root=demo_root)
    assert calls == [] and not any(run.changed for run in report.runs)


def test_a_reimport_parses_only_the_appended_lines(demo_root, monkeypatch):
    run_dir = demo_root / "clean-run"
    importer.run_import(path=run_dir)
    offset = Run.objects.get(run_id="clean-run").ledger_offset
    assert offset == (run_dir / "events.jsonl").stat().st_size
    durable.append_event(run_dir, "note", {"n": 1})
    durable.append_event(run_dir, "note", {"n": 2})
    seen_offsets = []
    real = reading.read_ledger

    def spy(path, cursor, *args):
        seen_offsets.append(cursor.offset)
        yield from real(path, cursor, *args)

    monkeypatch.setattr(reading, "read_ledger", spy)
    report = importer.run_import(path=run_dir)
    assert seen_offsets == [offset]
    assert report.events == 12
    assert list(Event.objects.filter(run__run_id="clean-run").values_list("seq", flat=True)) == list(range(1, 13))


def test_a_rewritten_ledger_is_found_and_read_again_and_the_finding_stays(demo_root):
    run_dir = demo_root / "clean-run"
    importer.run_import(path=run_dir)
    ledger = run_dir / "events.jsonl"
    ledger.write_bytes(ledger.read_bytes().replace(b'"state":"running"', b'"state":"hacked!"', 1))
    importer.run_import(path=run_dir)
    finding = Finding.objects.get(run__run_id="clean-run", code="ledger_rewritten")
    assert finding.closed_at is None and finding.stored_value != finding.recomputed_value
    assert Event.objects.get(run__run_id="clean-run", seq=1).payload["state"] == "hacked!"
    assert Event.objects.filter(run__run_id="clean-run").count() == 10
    durable.append_event(run_dir, "note", {})
    importer.run_import(path=run_dir)
    assert Finding.objects.get(run__run_id="clean-run", code="ledger_rewritten").closed_at is None


def test_a_line_being_written_is_picked_up_once_complete(demo_root):
    run_dir = demo_root / "clean-run"
    last_line = (run_dir / "events.jsonl").read_bytes().splitlines()[-1]
    ts = json.loads(last_line)["ts"]  # the writer's time: an earlier one is a clock set back (ledger_clock_back)
    event = {"seq": 11, "ts": ts, "type": "note", "prev_sha256": protocol.sha256_hex(last_line)}
    line = protocol.canonical_json(event)
    with (run_dir / "events.jsonl").open("ab") as ledger:
        ledger.write(line[:20])
    report = importer.run_import(path=run_dir)
    assert report.events == 10 and report.findings == []
    with (run_dir / "events.jsonl").open("ab") as ledger:
        ledger.write(line[20:] + b"\n")
    report = importer.run_import(path=run_dir)
    assert report.events == 11
    assert {f["code"] for f in report.findings} == set(), "the chain goes on across the two imports"


def test_findings_that_no_longer_hold_are_closed_not_deleted(demo_root):
    run_dir = demo_root / "tampered-receipt"
    importer.run_import(path=run_dir)
    [receipt_path] = (run_dir / "receipts").iterdir()
    receipt = json.loads(receipt_path.read_bytes())
    receipt["args"]["content"] = "echo deploy\n"  # put back what the writer wrote
    receipt_path.write_text(json.dumps(receipt))
    report = importer.run_import(path=run_dir)
    assert report.findings == []
    closed = Finding.objects.filter(run__run_id="tampered-receipt", closed_at__isnull=False)
    assert {f.code for f in closed} == {"identity_mismatch", "input_digest_mismatch"}
    receipt["args"]["content"] = "tampered again\n"
    receipt_path.write_text(json.dumps(receipt))
    importer.run_import(path=run_dir)
    reopened = Finding.objects.filter(run__run_id="tampered-receipt", closed_at__isnull=True)
    assert {f.code for f in reopened} == {"identity_mismatch", "input_digest_mismatch"}
    assert Finding.objects.filter(run__run_id="tampered-receipt").count() == 2


def test_a_call_goes_stale_with_no_file_changing(demo_root):
    run_dir = demo_root / "send-message-killed"
    importer.run_import(path=run_dir)
    assert not Finding.objects.filter(code="stale_call").exists()
    later = protocol.utc_now() + dt.timedelta(minutes=20)
    report = importer.run_import(path=run_dir, now=later)
    assert report.changed and [f["code"] for f in report.findings] == ["stale_call"]


def test_a_removed_receipt_becomes_a_missing_receipt(demo_root):
    run_dir = demo_root / "write-file-killed"
    importer.run_import(path=run_dir)
    [receipt_path] = (run_dir / "receipts").iterdir()
    receipt_path.unlink()
    report = importer.run_import(path=run_dir)
    assert [f["code"] for f in report.findings] == ["missing_receipt"]
    call = Call.objects.get(run__run_id="write-file-killed")
    assert call.receipt_present is False and call.decision == "confirm"


def test_hostile_root_entries_are_reported_and_the_good_runs_imported(demo_root):
    (demo_root / "bad$name").mkdir()
    (demo_root / "evil-link").symlink_to("/etc")
    report = import_json(demo_root)
    assert len(report["runs"]) == len(SCENARIOS)
    assert sorted((f["code"], f["subject"]) for f in report["root_findings"]) == [
        ("unsafe_path", "bad$name"),
        ("unsafe_path", "evil-link"),
    ]


def test_a_run_directory_given_directly_is_imported(demo_root):
    report = import_json(demo_root / "clean-run")
    assert [run["run_id"] for run in report["runs"]] == ["clean-run"]


def test_a_missing_root_is_a_clear_error():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="does not exist"):
        call_command("import_runs", "/nonexistent/runs")


def test_unique_constraints_make_a_double_row_impossible(demo_root):
    importer.run_import(path=demo_root / "clean-run")
    event = Event.objects.filter(run__run_id="clean-run").first()
    assert event is not None
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(run=event.run, seq=event.seq, line_no=99, type="x", line_sha256="0" * 64, payload={})


def query_plan(queryset) -> str:
    """The database's plan for ``queryset``, with sequential scans discouraged on PostgreSQL
    (a test database is too small for the planner to prefer an index by itself), and the
    table analysed first: without statistics every index of a tiny table costs the same, and
    which one the planner picks then depends on what ran before (the order is random)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {connection.ops.quote_name(queryset.model._meta.db_table)}")
            cursor.execute("SET enable_seqscan = off")
        sql, params = queryset.query.sql_with_params()
        explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
        cursor.execute(explain + sql, params)
        plan = " ".join(str(part) for row in cursor.fetchall() for part in row)
        if connection.vendor == "postgresql":
            cursor.execute("RESET enable_seqscan")
    return plan


def test_call_id_prefix_search_is_a_range_on_the_index(demo_root):
    importer.root_import(root=demo_root)
    first = Call.objects.order_by("call_id").first()
    assert first is not None
    some = first.call_id
    found = list(calls_with_prefix(prefix=some[:6]).values_list("call_id", flat=True))
    assert some in found and all(call_id.startswith(some[:6]) for call_id in found)
    plan = query_plan(calls_with_prefix(prefix=some[:6]))
    assert "call_id_prefix_idx" in plan, plan


def test_the_event_indexes_serve_a_calls_events_and_the_legacy_submissions(demo):
    """A partial index is used only when the query implies its condition (SQLite proves that
    only from the same term): the legacy submissions' query names the type, as the index does."""
    run = Run.objects.get(run_id="a4-concurrent")
    call = first_call_of("clean-run")
    call_events = Event.objects.filter(run=call.run, call_id=call.call_id).order_by("seq")  # as call_detail asks
    assert "event_call_idx" in query_plan(call_events)
    assert "event_submission_idx" in query_plan(selectors.legacy_submissions(run=run))


def test_a_big_run_is_committed_batch_by_batch(demo_root):
    run_dir = demo_root / "clean-run"
    synthetic_ledger(run_dir, 12_000, start_seq=11)
    batches = []
    report = importer.run_import(
        path=run_dir, batch_size=5000, progress=lambda run_id, done, total: batches.append(done)
    )
    assert report.events == 12_010
    assert len(batches) >= 3, "the ledger is committed batch by batch"
    assert batches[-1] == (run_dir / "events.jsonl").stat().st_size


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_importer_killed_at_random_moments_is_completed_by_the_next(demo_root, tmp_path):
    synthetic_ledger(demo_root / "clean-run", 150_000, start_seq=11)
    url = database_url_for_children(tmp_path)
    seed = random.randrange(2**32)
    randomizer = random.Random(seed)
    kills = attempts = 0
    # Each killed import leaves committed batches that the next one resumes from,
    # so later attempts have less to do; stop after four kills that landed.
    while kills < 4 and attempts < 15:
        attempts += 1
        child = subprocess.Popen(
            manage_command("import_runs", str(demo_root), *NEVER_STALE), env=child_env(url), stdout=subprocess.DEVNULL
        )
        time.sleep(randomizer.uniform(0.2, 1.2))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            kills += 1
        child.wait(timeout=60)
    assert kills >= 2, f"the kills must land while the import runs (seed {seed})"
    assert manage(url, "import_runs", str(demo_root), *NEVER_STALE).returncode == 0
    after_kills = normalized_dump(url)

    clean_url = migrated_sqlite_url(tmp_path / "clean.sqlite3")
    manage(clean_url, "import_runs", str(demo_root), *NEVER_STALE, check=True)
    assert after_kills == normalized_dump(clean_url)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_calls_folder_a_killed_importer_left_is_removed_by_the_next_and_no_other(demo_root, tmp_path, monkeypatch):
    """A killed importer's calls folder (``reading.calls_on_disk``) outlives it; the next import
    removes it, and leaves alone a live importer's folder, a young folder with no lock yet, a
    symlink, a file, and a folder whose lock is a symlink."""
    # Past reading.READ_AHEAD_LEDGER_BYTES: a child reads the ledger, its calls on disk.
    synthetic_ledger(demo_root / "clean-run", 130_000, start_seq=11)
    url = database_url_for_children(tmp_path)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**child_env(url), "TMPDIR": str(temporary)}
    child = subprocess.Popen(manage_command("import_runs", str(demo_root)), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    # Killed once its lock file is there: killed between ``mkdtemp`` and the lock's creation, the
    # folder is one with no lock yet, which a sweep rightly leaves for ten minutes (CI at 04debf0).
    owned = f"{reading.CALLS_FOLDER_PREFIX}*/{reading.CALLS_FOLDER_OWNER}"
    while not (left := [lock.parent for lock in temporary.glob(owned)]):
        assert child.poll() is None and time.monotonic() < deadline, "the import made no calls folder"
        time.sleep(0.005)
    os.killpg(child.pid, signal.SIGKILL)  # the importer and its children, as the OOM killer would
    child.wait(timeout=60)
    assert [folder.exists() for folder in left] == [True]

    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "kept").mkdir(parents=True)
    (temporary / f"{reading.CALLS_FOLDER_PREFIX}link").symlink_to(elsewhere, target_is_directory=True)
    (temporary / f"{reading.CALLS_FOLDER_PREFIX}file").write_text("not a folder")
    young = temporary / f"{reading.CALLS_FOLDER_PREFIX}young"
    young.mkdir()
    trap = temporary / f"{reading.CALLS_FOLDER_PREFIX}trap"
    trap.mkdir()
    (trap / reading.CALLS_FOLDER_OWNER).symlink_to(elsewhere / "kept")
    old_unlocked = temporary / f"{reading.CALLS_FOLDER_PREFIX}old"
    old_unlocked.mkdir()
    hour_ago = time.time() - 3600
    os.utime(old_unlocked, (hour_ago, hour_ago))
    with reading.calls_on_disk() as live:
        completed = subprocess.run(manage_command("import_runs", str(demo_root), "--json"), env=env,
                                   capture_output=True, text=True, check=False)  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        assert Path(live).parent.is_dir(), "a live importer's folder stays"
    assert not Path(live).parent.exists()
    assert not left[0].exists() and not old_unlocked.exists()
    assert sorted(path.name for path in temporary.iterdir()) == sorted(
        f"{reading.CALLS_FOLDER_PREFIX}{name}" for name in ("link", "file", "young", "trap")
    )
    assert (elsewhere / "kept").is_dir()
    runs = {run["run_id"]: run for run in json.loads(completed.stdout)["runs"]}
    assert runs["clean-run"]["events"] == 130_010


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_importers_at_once_converge_without_duplicates(demo_root, tmp_path):
    synthetic_ledger(demo_root / "clean-run", 20_000, start_seq=11)
    url = database_url_for_children(tmp_path)
    children = [
        subprocess.Popen(
            manage_command("import_runs", str(demo_root), "--json"),
            env=child_env(url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    assert reports[0] == reports[1], "both saw the same converged database"
    # Standard error holds the JSON log lines, and no progress bar (it is not a terminal).
    logged = [json.loads(line) for _, err in outputs for line in err.decode().splitlines()]
    assert all(line["logger"] == "callproof.importer" and line["run_id"] for line in logged)
    tables = {line.split()[0]: line.split()[1:] for line in normalized_dump(url)}
    assert all(count == distinct for count, distinct, _ in tables.values()), "no duplicate rows"
    assert int(tables["Event"][0]) == sum(run["events"] for run in reports[0]["runs"])


@pytest.mark.django_db(transaction=True)
def test_watch_imports_what_changes_until_interrupted(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    child = subprocess.Popen(
        manage_command("import_runs", str(demo_root), "--watch", "--interval", "0.3", "--json"),
        env=child_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        first = json.loads(child.stdout.readline())
        assert len(first["runs"]) == len(SCENARIOS)
        # Made beside the root and moved in whole: a pass between init's files would see half a run.
        runtime.run_init(tmp_path / "new-run", contract_sha256=CONTRACT)
        os.rename(tmp_path / "new-run", demo_root / "new-run")
        second = json.loads(child.stdout.readline())
        assert [run["run_id"] for run in second["runs"]] == ["new-run"]
        durable.append_event(demo_root / "clean-run", "note", {})
        third = json.loads(child.stdout.readline())
        assert [(run["run_id"], run["events"]) for run in third["runs"]] == [("clean-run", 11)]
    finally:
        # SIGTERM, as systemd stops the unit (and a non-interactive shell ignores SIGINT).
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=30)
    assert child.returncode == 0
    assert "stopped watching" in stderr


def test_the_progress_bar_draws_only_on_a_terminal():
    from evidence.management.commands.import_runs import ProgressBar

    class Stream(StringIO):
        def __init__(self, tty: bool) -> None:
            super().__init__()
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    terminal, pipe = Stream(True), Stream(False)
    for stream in (terminal, pipe):
        bar = ProgressBar(stream)
        bar("run-1", 50, 100)
        bar("run-1", 100, 100)
    assert "run-1" in terminal.getvalue() and "100.0%" in terminal.getvalue()
    assert "#" * 30 in terminal.getvalue()
    assert pipe.getvalue() == ""


def test_import_runs_reads_evidence_runs_root_when_given_no_root(demo_root, settings):
    settings.EVIDENCE_RUNS_ROOT = demo_root
    out = StringIO()
    call_command("import_runs", "--json", stdout=out)
    assert [run["run_id"] for run in json.loads(out.getvalue())["runs"]] == sorted(SCENARIOS)
