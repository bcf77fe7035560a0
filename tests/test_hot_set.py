"""A pass costs what is active: the hot set, the cold sweep, new directories and abandoned runs.

Real run directories made by the writer, the real importer, and for the watch a
real ``import_runs --watch`` process traced with strace: a cold run's files are
not touched by a pass of the watch, and what changed in it is found by the cold
sweep, later.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evidence.ingest import importer
from evidence.ingest.watch import Watch
from evidence.lib import stats
from evidence.models import HOT_AFTER_CHANGE, Finding, Run
from evidence.review import inbox
from receipts import durable, protocol, runtime
from receipts.runs import run_set_state
from tests.helpers import CONTRACT, PROJECT
from tests.subprocess_db import child_env, database_url_for_children, manage, manage_command, this_database_url
from tests.writer import edit_receipt

pytestmark = pytest.mark.django_db

SWEEP = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)


def make_run(root: Path, name: str, *, finished: bool) -> str:
    """A run with one committed call, finished or still running; the call's call_id."""
    path = root / name
    runtime.run_init(path, contract_sha256=CONTRACT)
    outcome = runtime.Executor(path).call("write_file", {"path": f"{name}.txt", "content": name})
    if finished:
        run_set_state(path, state="finished", attempts=1)
    return outcome.call_id


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


def open_codes(run_id: str) -> set[str]:
    return set(Finding.objects.filter(run__run_id=run_id, closed_at__isnull=True).values_list("code", flat=True))


def checked(report: importer.ImportReport) -> list[str]:
    return [run.run_id for run in report.runs]


def test_a_changed_file_in_a_cold_run_waits_for_the_cold_sweep_then_the_run_is_hot_again(root):
    call_id = make_run(root, "cold-run", finished=True)
    make_run(root, "hot-run", finished=False)
    start = protocol.utc_now()
    importer.root_import(root=root, now=start)
    events = Run.objects.get(run_id="hot-run").event_count
    watch = Watch(cold_sweep=SWEEP)
    later = start + HOT_AFTER_CHANGE + dt.timedelta(minutes=1)
    edit_receipt(root / "cold-run", call_id, lambda receipt: receipt["args"].update(content="edited"))
    durable.append_event(root / "hot-run", "note", {})

    report = importer.root_import(root=root, now=later, watch=watch)
    assert checked(report) == ["hot-run"]
    assert Run.objects.get(run_id="hot-run").event_count == events + 1
    assert open_codes("cold-run") == set(), "the edited receipt was not read: the cold run was not checked"
    cold = Run.objects.get(run_id="cold-run")
    assert not cold.is_hot(later) and cold.checked_at == start

    swept = importer.root_import(root=root, now=start + SWEEP, watch=watch)
    assert checked(swept) == ["cold-run", "hot-run"]
    assert {"identity_mismatch", "input_digest_mismatch"} <= open_codes("cold-run")
    cold.refresh_from_db()
    assert cold.changed_at == start + SWEEP and cold.is_hot(start + SWEEP), "a run that changed is hot again"
    assert "cold-run" in Run.objects.hot(start + SWEEP).values_list("run_id", flat=True)


def test_a_new_run_directory_is_picked_up_by_the_next_pass(root, tmp_path):
    make_run(root, "first-run", finished=True)
    start = protocol.utc_now()
    importer.root_import(root=root, now=start)
    watch = Watch(cold_sweep=SWEEP)
    later = start + HOT_AFTER_CHANGE + dt.timedelta(minutes=1)
    assert checked(importer.root_import(root=root, now=later, watch=watch)) == []
    make_run(tmp_path, "new-run", finished=False)
    os.rename(tmp_path / "new-run", root / "new-run")  # moved in whole, as a runtime would
    report = importer.root_import(root=root, now=later, watch=watch)
    assert checked(report) == ["new-run"] and report.runs[0].changed
    assert Run.objects.get(run_id="new-run").calls.count() == 1


def test_a_running_run_stays_hot_and_what_it_writes_is_imported_every_pass(root):
    make_run(root, "busy-run", finished=False)
    start = protocol.utc_now()
    watch = Watch(cold_sweep=SWEEP)
    importer.root_import(root=root, now=start, watch=watch)
    for minutes in (20, 40, 60 * 5):
        moment = start + dt.timedelta(minutes=minutes)
        durable.append_event(root / "busy-run", "note", {"minutes": minutes})
        report = importer.root_import(root=root, now=moment, watch=watch)
        assert checked(report) == ["busy-run"] and report.runs[0].changed
        assert Run.objects.get(run_id="busy-run").is_hot(moment)


def test_a_silent_run_is_abandoned_goes_cold_and_the_finding_closes_when_it_writes_again(root, monkeypatch):
    make_run(root, "quiet-run", finished=False)
    start = protocol.utc_now()
    watch = Watch(cold_sweep=SWEEP)
    importer.root_import(root=root, now=start, watch=watch)
    assert open_codes("quiet-run") == set()

    a_day_on = start + DAY + dt.timedelta(minutes=1)
    report = importer.root_import(root=root, now=a_day_on, watch=watch)
    assert checked(report) == ["quiet-run"]
    run = Run.objects.get(run_id="quiet-run")
    assert open_codes("quiet-run") == {"run_abandoned"} and run.abandoned_at == a_day_on
    assert not run.is_hot(a_day_on) and not Run.objects.hot(a_day_on).filter(pk=run.pk).exists()
    assert stats.RunSummary.of(run).findings_by_code == {"run_abandoned": 1}
    finding = Finding.objects.get(run=run, code="run_abandoned")
    assert run.last_event_at is not None and finding.severity == "warning"
    assert protocol.human_time(run.last_event_at) in finding.detail
    [item] = inbox.inbox_items(run_id="quiet-run")
    assert (item.kind, item.severity, item.code) == (inbox.ABANDONED, "warning", "run_abandoned")
    assert checked(importer.root_import(root=root, now=a_day_on + dt.timedelta(minutes=5), watch=watch)) == []

    # The runtime resumes: an event written a day on, found by the next pass (its ledger's lstat
    # moved), not an hour later at the cold sweep: a call in doubt there reaches a person now.
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(a_day_on + dt.timedelta(minutes=10)))
    durable.append_event(root / "quiet-run", "note", {"resumed": True})
    monkeypatch.delenv("RECEIPTS_CLOCK")
    resumed = a_day_on + dt.timedelta(minutes=11)
    assert checked(importer.root_import(root=root, now=resumed, watch=watch)) == ["quiet-run"]
    run.refresh_from_db()
    assert open_codes("quiet-run") == set() and run.abandoned_at is None and run.is_hot(resumed)
    assert Finding.objects.get(run=run, code="run_abandoned").closed_at == resumed
    assert inbox.inbox_items(run_id="quiet-run") == []


def test_an_abandoned_run_that_writes_again_is_checked_at_once_by_a_new_watch_too(root, monkeypatch):
    """A watch started after the run was found abandoned knows nothing of its ledger: a ledger
    longer than the import read is a run that wrote; one as long as it is left cold."""
    make_run(root, "left-run", finished=False)
    make_run(root, "also-left", finished=False)
    start = protocol.utc_now()
    importer.root_import(root=root, now=start)
    a_day_on = start + DAY + dt.timedelta(minutes=1)
    importer.root_import(root=root, now=a_day_on)
    assert open_codes("left-run") == open_codes("also-left") == {"run_abandoned"}
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(a_day_on + dt.timedelta(minutes=1)))
    call_id = runtime.Executor(root / "left-run").call("write_file", {"path": "again.txt", "content": "x"}).call_id
    monkeypatch.delenv("RECEIPTS_CLOCK")
    report = importer.root_import(root=root, now=a_day_on + dt.timedelta(minutes=2), watch=Watch(cold_sweep=SWEEP))
    assert checked(report) == ["left-run"]
    assert Run.objects.get(run_id="left-run").calls.filter(call_id=call_id).exists()
    assert open_codes("left-run") == set() and open_codes("also-left") == {"run_abandoned"}


def test_an_abandoned_run_that_finishes_closes_its_finding_and_a_finished_run_is_never_abandoned(root):
    make_run(root, "left-run", finished=False)
    make_run(root, "done-run", finished=True)
    start = protocol.utc_now()
    a_week_on = start + 7 * DAY
    importer.root_import(root=root, now=a_week_on)
    assert open_codes("left-run") == {"run_abandoned"} and open_codes("done-run") == set()
    run_set_state(root / "left-run", state="stopped", attempts=1)
    importer.root_import(root=root, now=a_week_on + dt.timedelta(minutes=1))
    run = Run.objects.get(run_id="left-run")
    assert open_codes("left-run") == set() and run.abandoned_at is None and run.finished


def test_the_abandoned_age_is_the_setting(root, settings):
    make_run(root, "short-run", finished=False)
    start = protocol.utc_now()
    settings.EVIDENCE_ABANDONED_AFTER_SECONDS = 60
    importer.root_import(root=root, now=start + dt.timedelta(seconds=30))
    assert open_codes("short-run") == set()
    importer.root_import(root=root, now=start + dt.timedelta(seconds=90))
    assert open_codes("short-run") == {"run_abandoned"}


def test_a_decision_written_into_a_cold_run_makes_it_hot(demo):
    from django.contrib.auth import get_user_model

    from evidence.review import settle
    from tests.helpers import first_call_of

    later = protocol.utc_now() + 2 * DAY
    importer.root_import(root=demo, now=later)  # every run checked: finished or abandoned, each goes cold
    run = Run.objects.get(run_id="send-message-killed")
    assert not run.is_hot(later + HOT_AFTER_CHANGE)
    call = first_call_of("send-message-killed")
    user = get_user_model().objects.create_user("carol")
    settle.settle_call(run=run, call=call, user=user, resolution="committed", reason="seen in the outbox",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256, now=later)  # fmt: skip
    run.refresh_from_db()
    assert run.changed_at == later and run.is_hot(later + dt.timedelta(minutes=5))


def test_is_hot_and_the_hot_query_agree_and_finished_follows_the_protocol(demo):
    start = protocol.utc_now()
    importer.root_import(root=demo, now=start)
    runs = list(Run.objects.all())
    Run.objects.filter(run_id="clean-run").update(checked_at=None)
    Run.objects.filter(run_id="a4-concurrent").update(next_stale_at=start + dt.timedelta(minutes=30))
    Run.objects.filter(run_id="tampered-receipt").update(changed_at=start - dt.timedelta(hours=3))
    runs = list(Run.objects.all())
    assert {protocol.run_is_finished(run.state) for run in runs} == {True, False}
    for moment in (start, start + dt.timedelta(minutes=20), start + dt.timedelta(hours=2), start + 2 * DAY):
        importer.root_import(root=demo, now=moment)
        runs = list(Run.objects.all())
        by_rule = {run.run_id for run in runs if run.is_hot(moment)}
        assert set(Run.objects.hot(moment).values_list("run_id", flat=True)) == by_rule, moment
    assert all(run.finished == protocol.run_is_finished(run.state) for run in runs)
    assert {run.run_id for run in runs if run.abandoned_at} == {run.run_id for run in runs if not run.is_finished}


@pytest.mark.parametrize("name", ["EVIDENCE_ABANDONED_AFTER_SECONDS", "EVIDENCE_COLD_SWEEP_SECONDS"])
@pytest.mark.parametrize("value", ["0", "-5", "1.5", "an hour", ""])
def test_the_settings_refuse_to_start_on_a_bad_value(name, value):
    env = {**os.environ, "DJANGO_DEBUG": "1", name: value}
    completed = subprocess.run([sys.executable, "-c", "import evidence.settings"], cwd=PROJECT, env=env,
                               capture_output=True, text=True, check=False)  # fmt: skip
    assert completed.returncode != 0
    assert f"{name} must be a whole number of seconds from 1, not {value!r}" in completed.stderr


def test_the_settings_defaults_are_a_day_and_an_hour(settings):
    env = {key: value for key, value in os.environ.items() if not key.startswith("EVIDENCE_")}
    code = (
        "from evidence import settings as s; print(s.EVIDENCE_ABANDONED_AFTER_SECONDS, s.EVIDENCE_COLD_SWEEP_SECONDS)"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, env=env | {"DJANGO_DEBUG": "1"},
                               capture_output=True, text=True, check=True)  # fmt: skip
    assert completed.stdout.split() == ["86400", "3600"]


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace counts the watch's file system calls")
@pytest.mark.django_db(transaction=True)  # the child's rows are committed: emptied after
def test_a_watching_importer_touches_no_file_of_a_cold_run(root, tmp_path):
    """``import_runs --watch`` under strace: every file system call it makes, by path. Not even
    the cold run's directory is stat-ed: the root's listing gives each entry's type."""
    url = database_url_for_children(tmp_path)
    make_run(root, "cold-run", finished=True)
    make_run(root, "hot-run", finished=False)
    manage(url, "import_runs", str(root), check=True)  # a one-off: every run checked
    # The watch's clock half an hour on: the finished run's change is past, its sweep not yet due.
    clock = protocol.format_time(protocol.utc_now() + dt.timedelta(minutes=30))
    trace = tmp_path / "trace.txt"
    command = ["strace", "-f", "-qq", "-e", "trace=%file,getdents64", "-o", str(trace),
               *manage_command("import_runs", str(root), "--watch", "--interval", "0.2", "--json")]  # fmt: skip
    env = child_env(url) | {"RECEIPTS_CLOCK": clock}
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT)
    try:
        assert child.stdout is not None
        assert [run["run_id"] for run in json.loads(child.stdout.readline())["runs"]] == ["hot-run"]
        for _ in range(2):
            written = durable.append_event(root / "hot-run", "note", {})
            [run] = json.loads(child.stdout.readline())["runs"]
            assert (run["run_id"], run["events"]) == ("hot-run", written["seq"])
    finally:
        # SIGTERM to the watch itself: strace, given one, would detach and leave it running.
        [watcher] = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
        os.kill(int(watcher), signal.SIGTERM)
        child.communicate(timeout=30)
    calls = trace.read_text().splitlines()
    assert [line for line in calls if f'"{root}/hot-run/events.jsonl"' in line], "the hot run was checked"
    touching_cold = [line for line in calls if f"{root}/cold-run" in line]
    assert touching_cold == [], touching_cold[:5]
    listings = [line for line in calls if f'"{root}"' in line and "O_DIRECTORY" in line]
    assert len(listings) >= 3, "the root is listed every pass: the cold run is a name there, nothing more"


def test_the_inbox_and_findings_pages_show_an_abandoned_run(root, logged_in):
    make_run(root, "left-run", finished=False)
    importer.root_import(root=root, now=protocol.utc_now() + 2 * DAY)
    page = logged_in.get("/inbox/", {"kind": inbox.ABANDONED}).content.decode()
    assert "left-run" in page and "run_abandoned" in page and "resume the run" in page
    assert "findings/?code=run_abandoned&amp;run=left-run" in page
    findings = logged_in.get("/findings/", {"code": "run_abandoned"}).content.decode()
    assert "left-run" in findings and "no event since" in findings


def test_the_cold_sweep_is_kept_per_run_across_a_restart_of_the_watch(root):
    make_run(root, "cold-run", finished=True)
    start = protocol.utc_now()
    importer.root_import(root=root, now=start)
    just_before = start + SWEEP - dt.timedelta(seconds=1)
    assert checked(importer.root_import(root=root, now=just_before, watch=Watch(cold_sweep=SWEEP))) == []
    # A new watch (the importer restarted) knows no name yet: the stamps say the run is due.
    assert checked(importer.root_import(root=root, now=start + SWEEP, watch=Watch(cold_sweep=SWEEP))) == ["cold-run"]
    assert Run.objects.get(run_id="cold-run").checked_at == start + SWEEP


@pytest.mark.django_db(transaction=True)  # the child's rows are committed: emptied after
def test_a_call_in_doubt_written_into_an_abandoned_run_reaches_a_running_watch(root, tmp_path):
    """A real ``import_runs --watch``: the run is abandoned at its first pass, then its runtime
    comes back and is killed after a send's effect. The call in doubt is stored by the watch's
    next passes, not by the cold sweep an hour later (the watch's clock stands still: it never
    comes)."""
    from evidence.models import Call
    from tests.helpers import until
    from tests.serving import stop
    from tests.writer import MESSAGE, cli_call

    url = this_database_url()  # the rows the watch writes, read here
    make_run(root, "paused-run", finished=False)
    manage(url, "import_runs", str(root), check=True)  # imported now: a day and a half later it is not hot
    clock = protocol.format_time(protocol.utc_now() + DAY + dt.timedelta(hours=12))
    env = child_env(url) | {"RECEIPTS_CLOCK": clock}
    watch = subprocess.Popen(manage_command("import_runs", str(root), "--watch", "--interval", "0.3"), env=env,
                             cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        abandoned = Run.objects.filter(run_id="paused-run", abandoned_at__isnull=False)
        until(abandoned.exists, "the watch to find the run abandoned")
        killed = cli_call(root / "paused-run", "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect",
                          RECEIPTS_CLOCK=clock)  # fmt: skip
        assert killed.returncode == 137
        until(Call.objects.in_doubt().filter(run__run_id="paused-run").exists, "the call in doubt to be stored")
        # It writes again: no longer abandoned (said by the same pass or the next, as the rows land).
        until(lambda: not abandoned.exists(), "the run to be no longer abandoned")
    finally:
        stop(watch)
