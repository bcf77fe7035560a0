"""A ledger whose times go backwards: the writer's clock was set back, a fact worth seeing.

The writer takes an event's ``ts`` under the ledger's lock, so the lines' times only go back
when the clock itself does (a person or a time service stepping it). A line more than a
second earlier than the line before it is a warning (``ledger_clock_back``), not a broken
chain; a smaller step is a time service's ordinary correction. Issue 55, case 10.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest

from evidence.ingest import importer
from evidence.models import Finding
from receipts import durable, protocol, runtime
from receipts.demo import writer_env
from receipts.reader import read_ledger, read_run
from tests.test_ledger import APPENDER

# Later than the run's first event (run_init's, at the real time): every step below is one of ours.
T = dt.datetime(2099, 12, 7, 12, 0, tzinfo=dt.UTC)


def append_at(run_dir: Path, monkeypatch, moment: dt.datetime, n: int) -> None:
    """One event written by the real writer whose clock says ``moment``."""
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(moment))
    durable.append_event(run_dir, "note", {"n": n})
    monkeypatch.delenv("RECEIPTS_CLOCK")


def clock_findings(run_dir: Path) -> list[tuple[str, str, str]]:
    files, _ = read_run(run_dir, keep_events=False)
    return [(f.subject, f.severity, f.detail) for f in files.findings if f.code == "ledger_clock_back"]


def test_a_line_earlier_than_the_one_before_it_is_a_warning_and_jitter_is_not(run_dir, monkeypatch):
    seconds = [0, 10, 9.5, 8, 20, 20]  # 0.5 s back: a correction; 1.5 s back: the clock was set back
    for n, offset in enumerate(seconds):
        append_at(run_dir, monkeypatch, T + dt.timedelta(seconds=offset), n)
    found = clock_findings(run_dir)  # run_init wrote line 1
    assert [(subject, severity) for subject, severity, _ in found] == [("events.jsonl line 5", "warning")]
    assert "seq 5" in found[0][2] and "1.5 s" in found[0][2], found[0][2]
    files, _ = read_run(run_dir, keep_events=False)
    assert {f.code for f in files.findings} == {"ledger_clock_back"}, "the chain and the seqs are fine"


def test_an_hour_back_is_one_finding_where_it_happened_not_one_a_line(run_dir, monkeypatch):
    for n, offset in enumerate([3600, 3601, 0, 1, 2, 3]):
        append_at(run_dir, monkeypatch, T + dt.timedelta(seconds=offset), n)
    assert [subject for subject, _, _ in clock_findings(run_dir)] == ["events.jsonl line 4"]


def test_read_from_where_it_stopped_the_first_new_line_is_held_against_the_last_one_read(run_dir, monkeypatch):
    append_at(run_dir, monkeypatch, T, 0)
    append_at(run_dir, monkeypatch, T + dt.timedelta(seconds=60), 1)
    *_, stopped = read_ledger(run_dir)
    assert stopped.findings == []
    append_at(run_dir, monkeypatch, T + dt.timedelta(seconds=30), 2)
    (batch,) = read_ledger(run_dir, stopped.cursor)
    assert [(f.code, f.subject) for f in batch.findings] == [("ledger_clock_back", "events.jsonl line 4")]


@pytest.mark.django_db
def test_the_import_shows_it_whether_it_reads_the_new_lines_or_the_whole_ledger(run_dir, monkeypatch):
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "hello"}, attempt=1)
    append_at(run_dir, monkeypatch, protocol.utc_now() + dt.timedelta(hours=1), 0)  # a clock an hour fast...
    importer.run_import(path=run_dir)
    assert not Finding.objects.filter(code="ledger_clock_back").exists()
    runtime.Executor(run_dir).call("write_file", {"path": "b.txt", "content": "two"}, attempt=1)  # ...set right
    importer.run_import(path=run_dir)  # only the new lines read: the first is held against the last stored
    found = Finding.objects.get(code="ledger_clock_back", closed_at__isnull=True)
    assert (found.subject, found.severity) == ("events.jsonl line 5", "warning")
    importer.run_import(path=run_dir, force=True)
    assert list(Finding.objects.filter(code="ledger_clock_back", closed_at__isnull=True)) == [found]


def test_writers_appending_at_once_never_go_back(run_dir):
    """Ordinary concurrency is no clock set back: each line's time is taken under the ledger's lock."""
    children = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(run_dir), "25", f"w{index}"], env=writer_env())
        for index in range(4)
    ]
    assert [child.wait(timeout=120) for child in children] == [0] * 4
    assert clock_findings(run_dir) == []
