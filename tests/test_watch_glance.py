"""A hot run told unchanged at a glance, and a watch woken by a write.

A watch tells a hot run unchanged from a handful of ``lstat`` calls (the run's glance) once a
full fingerprint has matched, not from a ``stat`` of each of its files; the full fingerprint
is taken again at least every cold sweep, which is when an edit in place inside a folder is
found. Between passes the watch waits on inotify for a write, the interval at most.

Real run directories written by the writer (in this process and in child processes), the
real importer and a real ``import_runs --watch``. Nothing is timed: a short sleep only makes
the files older than the watch's ``settle``; a watch with a ten-minute interval that imports
a write proves it was woken.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evidence.ingest import importer
from evidence.ingest.rereading import Listing
from evidence.ingest.watch import Watch
from evidence.lib import inotify
from evidence.models import Finding, Run
from receipts import durable, protocol, runtime
from receipts.reader import run_fingerprint, run_glance
from receipts.runs import run_set_state
from tests.helpers import CONTRACT, PROJECT
from tests.subprocess_db import child_env, database_url_for_children, manage, manage_command

pytestmark = pytest.mark.django_db

SWEEP = dt.timedelta(hours=1)
SETTLE = dt.timedelta(milliseconds=50)


def make_run(root: Path, name: str) -> Path:
    """A running run with one committed call."""
    path = root / name
    runtime.run_init(path, contract_sha256=CONTRACT)
    runtime.Executor(path).call("write_file", {"path": f"{name}.txt", "content": name})
    return path


def settled() -> None:
    """Every file written so far older than ``SETTLE``: the next glance can stand for them."""
    time.sleep(2 * SETTLE.total_seconds())


def edit_in_place(receipt: Path) -> None:
    """What a person's editor may do: the same file (inode) written over, its folder untouched."""
    with receipt.open("r+b") as stream:
        stream.seek(0, 2)
        stream.write(b" ")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


# --- the glance ------------------------------------------------------------------------


def test_every_command_of_the_writer_changes_the_glance(root):
    run_dir = make_run(root, "run")
    glances = [run_glance(run_dir).digest]
    runtime.Executor(run_dir).call("write_file", {"path": "b.txt", "content": "b"})
    glances.append(run_glance(run_dir).digest)
    durable.append_event(run_dir, "note", {})
    glances.append(run_glance(run_dir).digest)
    run_set_state(run_dir, state="finished", attempts=1)
    glances.append(run_glance(run_dir).digest)
    assert len(set(glances)) == len(glances)


def test_an_edit_in_place_inside_a_folder_changes_the_fingerprint_not_the_glance(root):
    """The trade-off the watch makes between cold sweeps, said in docs/operations.md."""
    run_dir = make_run(root, "run")
    glance, fingerprint = run_glance(run_dir), run_fingerprint(run_dir)
    [receipt] = (run_dir / "receipts").glob("*.json")
    edit_in_place(receipt)
    assert run_glance(run_dir).digest == glance.digest
    assert run_fingerprint(run_dir) != fingerprint


def test_a_glance_of_files_just_written_is_newer_than_the_settle_and_later_not(root):
    run_dir = make_run(root, "run")
    fresh = run_glance(run_dir)
    assert fresh.taken_ns - fresh.newest_ns < SETTLE // dt.timedelta(microseconds=1) * 1000
    settled()
    later = run_glance(run_dir)
    assert later.digest == fresh.digest
    assert later.taken_ns - later.newest_ns > SETTLE // dt.timedelta(microseconds=1) * 1000


# --- the watch's passes ----------------------------------------------------------------


def told(watch: Watch) -> dict[str, str]:
    return dict(watch.told_by)


def test_a_quiet_hot_run_is_told_unchanged_at_a_glance_and_what_it_writes_is_still_imported(root):
    run_dir = make_run(root, "run")
    importer.root_import(root=root)
    watch = Watch(cold_sweep=SWEEP, settle=SETTLE)
    settled()
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert (report.runs, told(watch)) == ([], {"run": "fingerprint"})
    assert "run" in watch.proved
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert (report.runs, told(watch)) == ([], {"run": "glance"})

    events = Run.objects.get(run_id="run").event_count
    written = runtime.Executor(run_dir).call("write_file", {"path": "b.txt", "content": "b"})
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert [run.run_id for run in report.runs] == ["run"]
    assert Run.objects.get(run_id="run").event_count > events
    assert Run.objects.get(run_id="run").calls.filter(call_id=written.call_id).exists()
    settled()
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert report.runs == []
    importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert told(watch) == {"run": "glance"}


def test_a_glance_taken_within_the_settle_of_the_files_times_is_not_kept(root):
    """The racy case: a rename in the same clock tick as the glance leaves the folder's times
    as they were, so a glance whose newest time is within ``settle`` of when it was taken never
    stands for the files."""
    run_dir = make_run(root, "run")
    listing = Listing.of(run_dir, glance=True)
    assert listing.glance is not None
    watch = Watch(cold_sweep=SWEEP, settle=dt.timedelta(seconds=2))
    now = protocol.utc_now()
    racy = dataclasses.replace(listing.glance, taken_ns=listing.glance.newest_ns + 1_999_000_000)
    watch.keep(run_dir, dataclasses.replace(listing, glance=racy), now)
    assert watch.proved == {}
    old_enough = dataclasses.replace(listing.glance, taken_ns=listing.glance.newest_ns + 2_001_000_000)
    watch.keep(run_dir, dataclasses.replace(listing, glance=old_enough), now)
    assert watch.proved["run"].fingerprint == listing.fingerprint


def test_the_default_settle_keeps_no_glance_of_a_run_written_just_before(root):
    make_run(root, "run")
    importer.root_import(root=root)
    watch = Watch(cold_sweep=SWEEP)
    for how in ("fingerprint", "relisting"):  # the second listed again by names: its parts were kept
        importer.root_import(root=root, watch=watch, report_unchanged=False)
        assert told(watch) == {"run": how} and watch.proved == {}


def test_an_edit_in_place_in_a_hot_run_is_found_by_the_full_fingerprint_of_the_cold_sweep(root):
    run_dir = make_run(root, "run")
    start = protocol.utc_now()
    importer.root_import(root=root, now=start)
    watch = Watch(cold_sweep=SWEEP, settle=SETTLE)
    settled()
    importer.root_import(root=root, watch=watch, now=start)
    assert "run" in watch.proved
    [receipt] = (run_dir / "receipts").glob("*.json")
    edit_in_place(receipt)
    fingerprint = Run.objects.get(run_id="run").fingerprint

    importer.root_import(root=root, watch=watch, now=start + SWEEP - dt.timedelta(seconds=1))
    assert told(watch) == {"run": "glance"}
    assert Run.objects.get(run_id="run").fingerprint == fingerprint, "between sweeps, only the glance"
    importer.root_import(root=root, watch=watch, now=start + SWEEP)
    assert told(watch) == {"run": "fingerprint"}
    assert Run.objects.get(run_id="run").fingerprint == run_fingerprint(run_dir) != fingerprint


def test_a_one_off_import_finds_an_edit_in_place_at_once(root):
    run_dir = make_run(root, "run")
    importer.root_import(root=root)
    fingerprint = Run.objects.get(run_id="run").fingerprint
    [receipt] = (run_dir / "receipts").glob("*.json")
    edit_in_place(receipt)
    report = importer.root_import(root=root, report_unchanged=False)
    assert [run.run_id for run in report.runs] == ["run"]
    assert Run.objects.get(run_id="run").fingerprint != fingerprint


def test_a_glance_kept_for_another_fingerprint_proves_nothing(root):
    """Another importer (or a forced one-off) stored a new fingerprint since: the glance kept
    stood for the old one."""
    run_dir = make_run(root, "run")
    importer.root_import(root=root)
    watch = Watch(cold_sweep=SWEEP, settle=SETTLE)
    settled()
    importer.root_import(root=root, watch=watch)
    assert "run" in watch.proved
    Run.objects.filter(run_id="run").update(fingerprint="0" * 64)
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert told(watch) == {"run": "fingerprint"}
    assert [run.run_id for run in report.runs] == ["run"]
    assert Run.objects.get(run_id="run").fingerprint == run_fingerprint(run_dir)


# --- listed again by names and inodes -------------------------------------------------


def many_calls(run_dir: Path, count: int) -> None:
    """``count`` more committed calls by the writer: receipts in many buckets."""
    executor = runtime.Executor(run_dir)
    for index in range(count):
        executor.call("write_file", {"path": f"many-{index}.txt", "content": str(index)})


def stored_as_a_whole_listing_would(run_dir: Path) -> None:
    """What the database holds of the run is what a listing of every file gives: a one-off
    import (no watch, every file stat-ed) finds nothing to read."""
    run = Run.objects.get(run_id=run_dir.name)
    whole = Listing.of(run_dir)
    assert (run.fingerprint, run.receipt_buckets) == (whole.fingerprint, whole.receipt_buckets())
    assert importer.root_import(root=run_dir.parent, report_unchanged=False).runs == []


def watched_run(root: Path, calls: int, now: dt.datetime | None = None) -> tuple[Path, Watch]:
    """A run of ``calls`` more calls, imported, and a watch's first pass over it."""
    run_dir = make_run(root, "run")
    many_calls(run_dir, calls)
    importer.root_import(root=root, now=now)
    watch = Watch(cold_sweep=SWEEP, settle=SETTLE)
    importer.root_import(root=root, watch=watch, now=now)
    return run_dir, watch


def test_a_hot_run_that_wrote_is_listed_again_and_stored_as_a_whole_listing_would_store_it(root):
    run_dir, watch = watched_run(root, 60)
    assert told(watch) == {"run": "fingerprint"} and "run" in watch.kept
    for content in ("b", "c"):
        written = runtime.Executor(run_dir).call("write_file", {"path": f"{content}.txt", "content": content})
        report = importer.root_import(root=root, watch=watch, report_unchanged=False)
        assert (told(watch), [run.run_id for run in report.runs]) == ({"run": "relisting"}, ["run"])
        assert Run.objects.get(run_id="run").calls.get(call_id=written.call_id).status == "committed"
        stored_as_a_whole_listing_would(run_dir)
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert (report.runs, told(watch)) == ([], {"run": "relisting"}), (
        "the glance of files just written stands for nothing"
    )


def test_a_receipt_someone_rewrote_with_sed_is_found_by_the_listing_again(root):
    """No ledger line says it: ``sed -i`` puts a new file (a new inode) in the receipt's place."""
    run_dir, watch = watched_run(root, 30)
    receipt = sorted((run_dir / "receipts").glob("*.json"))[7]
    subprocess.run(["sed", "-i", "s/committed/rejected/", str(receipt)], check=True)
    report = importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert (told(watch), [run.run_id for run in report.runs]) == ({"run": "relisting"}, ["run"])
    assert Run.objects.get(run_id="run").calls.get(call_id=receipt.name.removesuffix(".json")).status == "rejected"
    stored_as_a_whole_listing_would(run_dir)


def test_an_edit_in_place_in_a_run_that_wrote_is_found_by_the_whole_listing_of_the_cold_sweep(root):
    start = protocol.utc_now()
    run_dir, watch = watched_run(root, 10, start)
    edit_in_place(sorted((run_dir / "receipts").glob("*.json"))[3])
    runtime.Executor(run_dir).call("write_file", {"path": "b.txt", "content": "b"})
    importer.root_import(root=root, watch=watch, now=start + SWEEP - dt.timedelta(seconds=1))
    assert told(watch) == {"run": "relisting"}
    assert Run.objects.get(run_id="run").fingerprint != run_fingerprint(run_dir), "between sweeps, parts by inode"
    importer.root_import(root=root, watch=watch, now=start + SWEEP)
    assert told(watch) == {"run": "fingerprint"}
    stored_as_a_whole_listing_would(run_dir)


def test_a_call_in_doubt_outside_the_buckets_listed_again_is_still_read_as_in_doubt(root):
    """An open call is checked again at every import: its receipt, in a bucket whose names and
    inodes did not change, is found on disk (the listing again did not stat it)."""
    run_dir = make_run(root, "run")
    many_calls(run_dir, 20)
    killed = subprocess.run([sys.executable, "-c", WRITE_A_CALL, str(run_dir), "in doubt"], cwd=PROJECT,
                            env={**os.environ, "RECEIPTS_FAILPOINT": "after_prepared"})  # fmt: skip
    assert killed.returncode == 137
    importer.root_import(root=root)
    [in_doubt] = Run.objects.get(run_id="run").calls.filter(status="prepared")
    watch = Watch(cold_sweep=SWEEP, settle=SETTLE)
    importer.root_import(root=root, watch=watch)
    findings = set(Finding.objects.filter(closed_at__isnull=True).values_list("code", "call_id"))
    for index in range(40):  # until a write lands in another bucket than the call in doubt's
        written = runtime.Executor(run_dir).call("write_file", {"path": f"{index}.txt", "content": "x"})
        if written.call_id[:2] != in_doubt.call_id[:2]:
            break
    importer.root_import(root=root, watch=watch, report_unchanged=False)
    assert told(watch) == {"run": "relisting"}
    assert Run.objects.get(run_id="run").calls.get(call_id=in_doubt.call_id).status == "prepared"
    assert set(Finding.objects.filter(closed_at__isnull=True).values_list("code", "call_id")) == findings
    stored_as_a_whole_listing_would(run_dir)


# --- waking on a write -----------------------------------------------------------------

needs_inotify = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux's")

WRITE_A_CALL = """
import sys
from receipts import runtime
runtime.Executor(sys.argv[1]).call("write_file", {"path": "from-a-child.txt", "content": sys.argv[2]})
"""


def write_in_a_child(run_dir: Path, content: str = "child") -> None:
    """A writer's command in a process of its own, through the writer's API."""
    subprocess.run([sys.executable, "-c", WRITE_A_CALL, str(run_dir), content], cwd=PROJECT, check=True)


@needs_inotify
def test_a_waker_wakes_on_a_write_in_a_folder_it_follows_and_not_in_another(root):
    followed, other = make_run(root, "followed"), make_run(root, "other")
    with inotify.Waker() as waker:
        assert waker.follow([root, followed]) == 2
        assert waker.follow([root, followed]) == 0, "followed already"
        assert not waker.wait(0.05), "nothing written since it follows"
        write_in_a_child(other)
        assert not waker.wait(0.1), "a run it does not follow"
        write_in_a_child(followed)
        assert waker.wait(600) and waker.woken == 1  # returns at the write, not after ten minutes
        write_in_a_child(followed, "again")
        waker.drain()
        assert not waker.wait(0.05), "drained: the pass that follows sees that write"
        (root / "new-run").mkdir()
        assert waker.wait(600), "a new directory in the root"
        assert waker.follow([root]) == 0
        write_in_a_child(followed, "unfollowed")
        assert not waker.wait(0.1), "no longer followed"


def test_a_waker_without_inotify_sleeps_the_interval(root, monkeypatch):
    monkeypatch.setattr(inotify, "_LIBC", None)
    run_dir = make_run(root, "run")
    with inotify.Waker() as waker:
        assert waker.follow([root, run_dir]) == 0
        write_in_a_child(run_dir)
        assert waker.wait(0.05) is False and waker.woken == 0


@needs_inotify
def test_a_waker_leaves_out_a_folder_it_cannot_watch(root):
    run_dir = make_run(root, "run")
    (root / "a-file").write_text("")
    with inotify.Waker() as waker:
        assert waker.follow([root / "missing", root / "a-file", run_dir]) == 1
        assert set(waker.watched) == {str(run_dir)} and waker.refused == 1
        write_in_a_child(run_dir)
        assert waker.wait(600)


def next_report(child: subprocess.Popen[str], seconds: float = 120) -> dict:
    """The watch's next JSON line; a failure, not a hang, when none comes."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], seconds)
    assert ready, "the watch said nothing: it was not woken"
    return json.loads(child.stdout.readline())


@needs_inotify
@pytest.mark.django_db(transaction=True)  # the child's rows are committed: emptied after
def test_a_watch_with_a_long_interval_imports_a_write_at_once(root, tmp_path):
    url = database_url_for_children(tmp_path)
    run_dir = make_run(root, "run")
    manage(url, "import_runs", str(root), check=True)
    command = manage_command("import_runs", str(root), "--watch", "--interval", "600", "--json")
    child = subprocess.Popen(command, env=child_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=PROJECT)  # fmt: skip
    try:
        assert [run["run_id"] for run in next_report(child)["runs"]] == ["run"]  # the first pass
        events = json.loads((run_dir / "events.jsonl").read_bytes().splitlines()[-1])["seq"]
        write_in_a_child(run_dir)
        [run] = next_report(child)["runs"]
        assert run["run_id"] == "run" and run["events"] > events
        new_run = make_run(root, "new-run")
        # Woken by its directory in the root, a pass may read the new run half written, before
        # the watch follows it: the pass after comes at once, not after the interval. (Passes
        # woken by the rest of the child's writes may come first.)
        lines = len((new_run / "events.jsonl").read_bytes().splitlines())
        imported: dict[str, int] = {}
        for _ in range(6):
            imported |= {run["run_id"]: run["events"] for run in next_report(child)["runs"]}
            if imported.get("new-run") == lines:
                break
        assert imported.get("new-run") == lines
    finally:
        child.terminate()
        child.communicate(timeout=60)
    assert Finding.objects.filter(code="import_failed").count() == 0
