"""The import's read-ahead (evidence/ingest/read_ahead.py): child processes read a run while the
importer stores it. The database ends exactly as when the importer reads in its own process,
hostile lines and files included, also when a child dies halfway; a killed importer leaves
no child behind. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from evidence.ingest import importer, read_ahead, reading
from evidence.models import Call, Confirmation, Event, EventTally, Finding, Run, Submission
from receipts import protocol
from tests.helpers import CONTRACT, IMPORT_TIMESTAMPS, until
from tests.subprocess_db import (
    child_env,
    database_url_for_children,
    manage_command,
    normalized_dump,
    this_database_url,
)
from tests.volume import synthetic_ledger, synthetic_run

pytestmark = pytest.mark.django_db(transaction=True)

NOW = protocol.parse_time("2026-12-03T12:00:00Z")


@pytest.fixture
def always_ahead(monkeypatch) -> list[tuple[read_ahead.ReadAhead, read_ahead.Request]]:
    """Children for every import however small; the list of those started, with their requests."""
    monkeypatch.setattr(reading, "READ_AHEAD_LEDGER_BYTES", 0)
    monkeypatch.setattr(reading, "READ_AHEAD_RECEIPTS", 0)
    started = []
    start = read_ahead.ReadAhead.__init__

    def record(self, request):
        start(self, request)
        started.append((self, request))

    monkeypatch.setattr(read_ahead.ReadAhead, "__init__", record)
    return started


def hostile_run(root: Path, events: int = 3000, receipts: int = 300) -> Path:
    """A big run spoiled line by line and file by file, as test_import_hostile.py does one at a time."""
    run_dir = root / "hostile"
    synthetic_run(run_dir, events=events, receipts=receipts, contract=CONTRACT)
    seq = events + 1
    lines = [
        b"not json at all",
        b"\xff\xfe not UTF-8",
        b'{"seq": 2, "ts": "2026-11-29T12:00:00Z", "type": "note", "note": "a seq taken"}',
        json.dumps({"seq": seq, "ts": "yesterday", "type": "note"}).encode(),
        json.dumps({"seq": seq + 1, "ts": "2026-11-29T13:00:00Z", "type": "no\\u0000te"}).encode(),
        json.dumps({"seq": seq + 2, "ts": "2026-11-29T13:00:01Z", "type": "receipt", "call_id": "../x"}).encode(),
        b'{"seq": 1, "seq": 1}',
        json.dumps({"seq": seq + 9, "ts": "2026-11-29T13:00:02+02:00", "type": "note"}).encode(),
    ]
    with (run_dir / "events.jsonl").open("ab") as ledger:
        ledger.write(b"\n".join(lines) + b"\n")
    synthetic_ledger(run_dir, 50, start_seq=seq + 10)  # a chain that starts again after the bad lines
    first, second, *_ = sorted((run_dir / "receipts").iterdir())
    edited = json.loads(first.read_bytes())
    edited["args"]["content"] = "edited after the call"
    first.write_text(json.dumps(edited))
    second.write_bytes(b'{"call_id": ')
    (run_dir / "receipts" / f"{'0' * 64}.json").write_text(json.dumps({"call_id": "0" * 64, "status": "done"}))
    return run_dir


def import_root(root: Path) -> None:
    for report in importer.root_import(root=root, now=NOW).runs:
        assert not report.failed, report.findings


# What the rows keep of the files' stat (inode, times): a run made again differs there only.
STAT_COLUMNS = ("fingerprint", "ledger_signature", "receipt_buckets", "file_signature")


def dump_and_forget(without_stat: bool = False) -> list[str]:
    """``normalized_dump``; ``without_stat``: the same rows, by natural key, without the stat columns."""
    dump: list[Any] = []
    if not without_stat:
        dump = list(normalized_dump(this_database_url()))
    else:
        skip = {"id", "run_id", "host_id", *IMPORT_TIMESTAMPS, *STAT_COLUMNS}
        for model in (Run, Call, Submission, Event, EventTally, Finding, Confirmation):
            names = [field.attname for field in model._meta.concrete_fields if field.attname not in skip]
            rows = model.objects.values_list(*names)
            dump.append(sorted(json.dumps(row, sort_keys=True, default=str) for row in rows))
    Run.objects.all().delete()
    Finding.objects.all().delete()
    return dump


def read_here_instead(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "event", "") == "read_ahead_failed"]


def test_read_ahead_stores_what_reading_in_process_stores(demo_root, always_ahead, settings, caplog):
    hostile_run(demo_root)
    import_root(demo_root)
    ahead = dump_and_forget()
    runs = len(list(demo_root.iterdir()))
    assert sum(request.cursor is not None for _, request in always_ahead) == runs, "a ledger child per run"
    assert sum(request.files is not None for _, request in always_ahead) == runs, "a files child per run"
    assert not read_here_instead(caplog), "every child answered"

    settings.EVIDENCE_IMPORT_READ_AHEAD = False
    started = len(always_ahead)
    import_root(demo_root)
    assert len(always_ahead) == started, "no child when read-ahead is off"
    here = dump_and_forget()
    assert ahead == here
    counts = {line.split()[0]: int(line.split()[1]) for line in here}
    assert counts["Event"] > 3000 and counts["Call"] > 300 and counts["Finding"] > 10


def test_a_re_import_reads_ahead_only_the_new_lines(tmp_path, always_ahead, settings):
    """An incremental import: a ledger child from the stored cursor, the files read here (some
    receipts are known); and the same database as reading every time in-process."""
    root = tmp_path / "runs"
    run_dir = hostile_run(root, events=2000, receipts=200)
    import_root(root)
    # The whole ledger's sets of calls on disk, in a file removed with the import; the new lines' in memory.
    on_disk = [request.call_sets for _, request in always_ahead if request.cursor is not None]
    assert len(on_disk) == 1 and on_disk[0] is not None and not Path(on_disk[0]).parent.exists()
    synthetic_ledger(run_dir, 500, start_seq=10_000)
    import_root(root)
    second = [request for _, request in always_ahead[2:]]
    assert [request.cursor is not None and request.cursor.offset > 0 for request in second] == [True]
    assert second[0].call_sets is None
    ahead = dump_and_forget(without_stat=True)

    settings.EVIDENCE_IMPORT_READ_AHEAD = False
    shutil.rmtree(root)
    run_dir = hostile_run(root, events=2000, receipts=200)
    import_root(root)
    synthetic_ledger(run_dir, 500, start_seq=10_000)
    import_root(root)
    assert ahead == dump_and_forget(without_stat=True)


def test_the_files_child_hands_its_calls_over_a_batch_at_a_time(tmp_path, always_ahead, settings, monkeypatch, caplog):
    """``EVIDENCE_IMPORT_CALLS_BATCH`` bounds what the child sends at a time (counted), and the rows
    end as when the importer reads the run itself."""
    root = tmp_path / "runs"
    hostile_run(root, events=2000, receipts=200)
    settings.EVIDENCE_IMPORT_CALLS_BATCH = 16
    sizes: list[int] = []
    findings_handed: list[int] = []
    files = read_ahead.ReadAhead.files

    def counted(self, cursor):
        for rows, findings in files(self, cursor):
            sizes.append(len(rows))
            findings_handed.append(len(findings))
            yield rows, findings
        assert self.files_read.findings == [], "every finding was handed over with a batch"

    monkeypatch.setattr(read_ahead.ReadAhead, "files", counted)
    import_root(root)
    assert not read_here_instead(caplog)
    [files_request] = [request for _, request in always_ahead if request.files is not None]
    assert files_request.calls_batch == 16
    assert "listed_signatures" not in files_request.files, "the child takes each file's signature itself"
    assert len(sizes) > 200 // 16 and max(sizes) <= 16 and sum(sizes) == Call.objects.count()
    assert sum(findings_handed) > 0
    ahead = dump_and_forget()

    settings.EVIDENCE_IMPORT_READ_AHEAD = False
    import_root(root)
    assert ahead == dump_and_forget()


def test_a_files_child_failing_halfway_through_its_calls_leaves_none_of_them(
    tmp_path, always_ahead, settings, monkeypatch, caplog
):
    """The calls are stored as they come, in the transaction that stores the rest: a child that
    fails after some batches has them rolled back, and the files are read in the importer."""
    root = tmp_path / "runs"
    run_dir = hostile_run(root, events=2000, receipts=200)
    settings.EVIDENCE_IMPORT_CALLS_BATCH = 16
    files = read_ahead.ReadAhead.files
    stored_meanwhile: list[int] = []

    def failing(self, cursor):
        for number, batch in enumerate(files(self, cursor)):
            if number == 2:
                stored_meanwhile.append(Call.objects.count())
                raise read_ahead.ReadAheadError("the reading process stopped answering (a test)")
            yield batch

    read_and_store = importer._read_and_store
    when_read_here: list[int] = []

    def counted(*args, **kwargs):
        when_read_here.append(Call.objects.count())
        return read_and_store(*args, **kwargs)

    monkeypatch.setattr(read_ahead.ReadAhead, "files", failing)
    monkeypatch.setattr(importer, "_read_and_store", counted)
    report = importer.run_import(path=run_dir, now=NOW)
    assert not report.failed
    # Two batches of 16 receipt files stored before the failure (two of those files give no record).
    assert stored_meanwhile == [30]
    assert when_read_here == [0], "rolled back before the files are read here"
    [warning] = read_here_instead(caplog)
    assert "a test" in getattr(warning, "detail", "")
    after_a_failure = dump_and_forget()

    settings.EVIDENCE_IMPORT_READ_AHEAD = False
    importer.run_import(path=run_dir, now=NOW)
    assert after_a_failure == dump_and_forget()


def test_the_child_loads_this_very_project():
    """The child puts the project's root first on its path (it was evidence/ once the module
    moved to evidence/ingest/, and a child started elsewhere loaded another copy, or none)."""
    child_module = read_ahead.PROJECT_ROOT / "evidence" / "ingest" / "read_ahead.py"
    assert child_module.samefile(read_ahead.__file__)


@pytest.mark.parametrize("which", ["ledger", "files"])
def test_a_child_killed_halfway_leaves_the_reading_to_the_importer(tmp_path, always_ahead, settings, caplog, which):
    root = tmp_path / "runs"
    run_dir = hostile_run(root, events=12_000, receipts=400)
    killed: list[int] = []

    def kill_at_the_first_batch(run_id: str, done: int, total: int) -> None:
        for child, request in always_ahead:
            if not killed and (request.cursor is not None) == (which == "ledger"):
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)

    report = importer.run_import(path=run_dir, now=NOW, batch_size=1000, progress=kill_at_the_first_batch)
    assert killed, "a child was killed while the importer stored the ledger"
    assert not report.failed
    [warning] = read_here_instead(caplog)
    assert getattr(warning, "run_id", None) == "hostile"
    assert "killed by signal 9" in getattr(warning, "detail", "")
    after_a_kill = dump_and_forget()

    settings.EVIDENCE_IMPORT_READ_AHEAD = False
    importer.run_import(path=run_dir, now=NOW, batch_size=1000)
    assert after_a_kill == dump_and_forget()


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (a dead child its new parent has not reaped yet)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the children in /proc")
def test_a_killed_watch_leaves_no_child_behind(tmp_path):
    """``import_runs --watch`` reads a big run ahead; killed (SIGKILL, no clean-up of its own),
    its children die with it."""
    root = tmp_path / "runs"
    synthetic_run(root / "big", events=150_000, receipts=12_000, contract=CONTRACT)
    url = database_url_for_children(tmp_path)
    watch = subprocess.Popen(
        manage_command("import_runs", str(root), "--watch"), env=child_env(url), stdout=subprocess.DEVNULL
    )
    try:
        children = until(lambda: children_of(watch.pid), "the watch to start reading ahead")
    finally:
        watch.send_signal(signal.SIGKILL)
        watch.wait(timeout=60)
    assert isinstance(children, set)
    until(lambda: not any(running(pid) for pid in children), "the children to die with the watch")
