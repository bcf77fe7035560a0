"""Applying retention: bodies stripped to digests, runs archived and checked, nothing lost on the way."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import tarfile
import time
from io import StringIO
from pathlib import Path
from typing import NamedTuple

import pytest
from django.core.management import call_command

from evidence.ingest import importer
from evidence.models import Event, Run
from evidence.retention import plans
from receipts import durable, protocol, runtime
from receipts.reader.verify import verify_export
from tests.helpers import content, first_call_of
from tests.subprocess_db import child_env, database_url_for_children, manage, manage_command
from tests.volume import synthetic_ledger

pytestmark = pytest.mark.django_db

LATER = "2036-01-01T00:00:00Z"  # every demo run is past both ages by then


def apply(*args: str) -> dict:
    out = StringIO()
    call_command("apply_retention", "--json", *args, stdout=out)
    return {run["run_id"]: run for run in json.loads(out.getvalue())["runs"]}


def test_a_stripped_run_keeps_its_digests_verdicts_pages_and_export(demo, logged_in, monkeypatch, tmp_path, settings):
    monkeypatch.setenv("RECEIPTS_CLOCK", "2026-12-31T12:00:00Z")  # past 30 days, before 365
    settings.RETENTION_STRIP_AFTER_DAYS = 1
    result = apply("--apply")
    assert result["clean-run"]["applied"] == "stripped" and result["send-message-killed"]["applied"] == "nothing"
    call = first_call_of("clean-run")
    assert set(call.args) == {"content", "path"} and all(set(value) == {"redacted"} for value in call.args.values())
    for event in Event.objects.filter(run__run_id="clean-run"):
        bodies = {k: v for k, v in event.payload.items() if k not in protocol.EVENT_FACT_FIELDS}
        assert all(set(value) == {"redacted"} for value in bodies.values()), event.payload
    page = content(logged_in.get(f"/runs/clean-run/calls/{call.call_id}/"))
    assert "Bodies stripped on" in page and "verified: the receipt is what its inputs say" in page
    out = tmp_path / "export"
    call_command("export_evidence", "clean-run", "--out", str(out))
    assert verify_export(out, demo / "clean-run") == [], "the digests still match the original run"
    importer.run_import(path=demo / "clean-run", force=True)
    assert set(first_call_of("clean-run").args["path"]) == {"redacted"}, "a re-import does not bring bodies back"


def test_an_archived_run_is_packed_checked_removed_and_stays_browsable(
    demo, logged_in, monkeypatch, tmp_path, settings
):
    monkeypatch.setenv("RECEIPTS_CLOCK", LATER)
    settings.EVIDENCE_ARCHIVE_ROOT = tmp_path / "archive"
    files_before = {p.relative_to(demo): data for p, data in run_files(demo / "clean-run").items()}
    result = apply("--apply")
    assert result["clean-run"]["applied"] == "archived"
    assert result["tampered-receipt"]["applied"] == "nothing", "a blocked run is kept"
    archive = tmp_path / "archive" / "clean-run.tar.gz"
    assert (tmp_path / "archive" / "clean-run.tar.gz.sha256").read_text().split()[0] == protocol.sha256_hex(
        archive.read_bytes()
    )
    with tarfile.open(archive) as packed:
        names = {member.name: member for member in packed.getmembers() if member.isfile()}
        for path, data in files_before.items():
            assert member_bytes(packed, names[str(path)]) == data
    assert not (demo / "clean-run").exists()
    run = Run.objects.get(run_id="clean-run")
    assert run.archived and run.archive_path == str(archive)
    assert "archived" in content(logged_in.get("/runs/clean-run/"))
    with tarfile.open(archive) as packed:
        packed.extractall(demo, filter="data")  # someone puts it back
    report = importer.root_import(root=demo)
    assert "clean-run" not in {run.run_id for run in report.runs}, "an archived run is never brought back"


def run_files(run_dir: Path) -> dict[Path, bytes]:
    """Every file of a run but the writer's lock files, which retention sweeps from finished runs."""
    return {
        path: path.read_bytes()
        for path in run_dir.rglob("*")
        if path.is_file() and not (path.parent.name == ".writer" and path.suffix == ".lock")
    }


def child_query(url: str, expression: str) -> str:
    """What ``expression`` gives in the child processes' database (on SQLite, not the test's own)."""
    code = f"from evidence.models import Call, Run; print({expression})"
    return manage(url, "shell", "-v", "0", "-c", code, check=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_full_disk_while_archiving_removes_nothing(demo_root, tmp_path, small_disk):
    url = database_url_for_children(tmp_path)
    synthetic_ledger(demo_root / "clean-run", 20_000, start_seq=11)
    manage(url, "import_runs", str(demo_root), check=True)
    run_dir = demo_root / "clean-run"
    before = run_files(run_dir)
    env = child_env(url) | {"RECEIPTS_CLOCK": LATER, "EVIDENCE_ARCHIVE_ROOT": str(small_disk)}
    completed = subprocess.run(
        manage_command("apply_retention", "--json", "--apply"), env=env, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    result = {run["run_id"]: run for run in json.loads(completed.stdout)["runs"]}
    assert result["clean-run"]["applied"] == "nothing archived" and "No space left" in result["clean-run"]["error"]
    assert run_files(run_dir) == before, "nothing of the run is gone (but the swept locks)"
    kept = {lock.name: json.loads(lock.read_bytes()) for lock in (run_dir / ".writer").glob("*.lock")}
    assert kept and all(name.startswith("call-") and note == {"installed": True} for name, note in kept.items()), (
        "a finished run's free locks are swept; a call's lock keeps the mark that its receipt was put in place"
    )
    assert not (small_disk / "clean-run.tar.gz").exists() and not list(small_disk.glob(".clean-run*"))
    assert child_query(url, "Run.objects.get(run_id='clean-run').archived") == "False"


# Each phase of applying retention to a run, in order, and what a kill at its failpoint leaves of
# the run it was working on: bodies stripped, the killed process's temp archive, the archive and
# its .sha256 (whole), marked archived (with its audit entry), and where the run's files are.
class Left(NamedTuple):
    stripped: bool
    temp_archive: bool
    archive: bool
    archived: bool
    files: str  # "directory", "renamed" (the dot name no reader lists), "gone", or what is wrong


UNTOUCHED = Left(stripped=False, temp_archive=False, archive=False, archived=False, files="directory")
PHASES = {
    "retention_mid_strip": UNTOUCHED,  # the strip's transaction never commits
    "retention_after_strip": UNTOUCHED._replace(stripped=True),
    "retention_after_archive_temp": UNTOUCHED._replace(stripped=True, temp_archive=True),
    "retention_after_archive_written": UNTOUCHED._replace(stripped=True, archive=True),
    "retention_after_read_back": UNTOUCHED._replace(stripped=True, archive=True),
    "retention_after_marked_archived": UNTOUCHED._replace(stripped=True, archive=True, archived=True),
    "retention_after_run_dir_renamed": UNTOUCHED._replace(stripped=True, archive=True, archived=True, files="renamed"),
}

FACTS_SCRIPT = """
import json
from collections import Counter
from evidence.models import AuditEntry, Call, Event, Run, Submission
from receipts import protocol
def marks(value):
    if value is None:
        return []
    if protocol.is_redaction_marker(value):
        return [True]
    if isinstance(value, dict):
        return [protocol.is_redaction_marker(field) for field in value.values()]
    return [False]
facts = {}
for run in Run.objects.all():
    bodies = []
    for call in Call.objects.filter(run=run):
        bodies += marks(call.args) + marks(call.result) + marks(call.error)
    for submission in Submission.objects.filter(run=run):
        bodies += marks(submission.request)
    for event in Event.objects.filter(run=run):
        payload = event.payload if isinstance(event.payload, dict) else {}
        bodies += marks({k: v for k, v in payload.items() if k not in protocol.EVENT_FACT_FIELDS} or None)
    facts[run.run_id] = {
        "archived": run.archived, "archive_path": run.archive_path, "stripped_at": run.bodies_stripped_at is not None,
        "bodies": len(bodies), "stripped": sum(bodies),
        "calls": Call.objects.filter(run=run).count(), "events": Event.objects.filter(run=run).count(),
        "audit": Counter(AuditEntry.objects.filter(run=run).values_list("action", flat=True)),
    }
print(json.dumps(facts))
"""


def child_facts(url: str) -> dict[str, dict]:
    """Per run, from the child processes' database: archived, its bodies (how many, how many stripped),
    its rows and its audit entries."""
    return json.loads(manage(url, "shell", "-v", "0", "-c", FACTS_SCRIPT, check=True).stdout)


def plan_of(env: dict[str, str]) -> dict[str, str]:
    completed = subprocess.run(
        manage_command("apply_retention", "--json"), env=env, capture_output=True, text=True, check=True
    )
    return {run["run_id"]: run["action"] for run in json.loads(completed.stdout)["runs"]}


def apply_killed_at(failpoint: str, env: dict[str, str]) -> int:
    """A real ``apply_retention --apply`` ended at ``failpoint``; returns its pid."""
    child = subprocess.Popen(
        manage_command("apply_retention", "--apply"),
        env=env | {"RECEIPTS_FAILPOINT": failpoint},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 137, f"not ended at {failpoint} (durable.failpoint exits 137): {stderr.decode()}"
    return child.pid


def renamed_copies(run_dir: Path) -> list[Path]:
    return sorted(run_dir.parent.glob(f".{run_dir.name}.archived-*"))


def where_files_are(run_dir: Path, files: dict[Path, bytes]) -> str:
    """Where the run's files are, each whole: in the run directory, in one renamed copy, or gone."""
    copies = renamed_copies(run_dir)
    if run_dir.exists():
        whole = run_files(run_dir) == files
        return "directory" if whole and not copies else f"half: directory whole {whole}, copies {copies}"
    if not copies:
        return "gone"
    moved = {copies[0] / path.relative_to(run_dir): data for path, data in files.items()}
    return "renamed" if len(copies) == 1 and run_files(copies[0]) == moved else f"half: copies {copies}"


def whole_archive(archive: Path, files: dict[Path, bytes], root: Path) -> bool:
    """The archive and its .sha256 are there, agree, and the archive holds every file of the run."""
    digest = archive.with_name(archive.name + ".sha256")
    if not archive.exists() or not digest.exists():
        return False
    return digest.read_text().split()[0] == protocol.sha256_hex(archive.read_bytes()) and verify_archive(
        archive, files, root
    )


def left_of(run_id: str, facts: dict, root: Path, archive_root: Path, files: dict[Path, bytes]) -> Left:
    archive = archive_root / f"{run_id}.tar.gz"
    return Left(
        stripped=facts["stripped_at"],
        temp_archive=bool(durable.temp_files_of(archive, None)),
        archive=whole_archive(archive, files, root),
        archived=facts["archived"],
        files=where_files_are(root / run_id, files),
    )


def assert_whole(run_id: str, facts: dict, before: dict, left: Left) -> None:
    """Stripped or not, archived or not, never half; the rows stay browsable."""
    audit = facts["audit"]
    assert (facts["calls"], facts["events"]) == (before["calls"], before["events"]), run_id
    if facts["stripped_at"]:
        assert facts["stripped"] == facts["bodies"] and audit.get("bodies_stripped", 0) >= 1, (run_id, facts)
    else:
        assert facts["stripped"] == 0 and "bodies_stripped" not in audit, (run_id, facts)
    if facts["archived"]:
        assert left.stripped and left.archive and audit.get("run_archived") == 1, (run_id, facts, left)
        assert left.files in ("directory", "renamed", "gone"), (run_id, left)
    else:
        assert left.files == "directory" and "run_archived" not in audit, (run_id, facts, left)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("failpoint", list(PHASES))
def test_a_kill_at_each_phase_of_archiving_leaves_every_run_whole_and_the_next_apply_finishes(
    demo_root, tmp_path, failpoint
):
    url = database_url_for_children(tmp_path)
    manage(url, "import_runs", str(demo_root), check=True)
    archive_root = tmp_path / "archive"
    env = child_env(url) | {"RECEIPTS_CLOCK": LATER, "EVIDENCE_ARCHIVE_ROOT": str(archive_root)}
    due = [run_id for run_id, action in plan_of(env).items() if action == plans.ARCHIVE]
    assert len(due) >= 2 and "clean-run" in due, due
    killed = due[0]  # runs are applied in run_id order: the failpoint stops the first one due
    files = {run_id: run_files(demo_root / run_id) for run_id in due}
    before = child_facts(url)
    assert before["clean-run"]["bodies"] > 0, "stripping has something to strip"

    pid = apply_killed_at(failpoint, env)
    facts = child_facts(url)
    left = {run_id: left_of(run_id, facts[run_id], demo_root, archive_root, files[run_id]) for run_id in due}
    assert left[killed] == PHASES[failpoint], "the kill landed in the phase its failpoint names"
    assert all(left[run_id] == UNTOUCHED for run_id in due[1:]), "the runs after it were not reached"
    if failpoint == "retention_after_archive_temp":
        [temp] = durable.temp_files_of(archive_root / f"{killed}.tar.gz", None)
        assert f".{pid}." in temp.name and verify_archive(temp, files[killed], demo_root), "the killed one's, whole"
    if failpoint == "retention_after_run_dir_renamed":
        assert renamed_copies(demo_root / killed) == [demo_root / f".{killed}.archived-{pid}"]
    for run_id in due:
        assert_whole(run_id, facts[run_id], before[run_id], left[run_id])

    finished = subprocess.run(manage_command("apply_retention", "--apply"), env=env, capture_output=True, check=False)
    assert finished.returncode == 0, finished.stderr
    expected = {f"{run_id}.tar.gz{suffix}" for run_id in due for suffix in ("", ".sha256")}
    if failpoint == "retention_after_archive_temp":
        left_over = {path.name for path in archive_root.iterdir()} - expected
        assert left_over == {temp.name}, "a temp archive written to within the hour may be a live apply's: kept"
        old = time.time() - 2 * durable.TEMP_SWEEP_AGE_SECONDS
        os.utime(temp, (old, old))  # an hour on, it can only be a dead apply's: the next --apply removes it
        later = subprocess.run(manage_command("apply_retention", "--apply"), env=env, capture_output=True, check=False)
        assert later.returncode == 0, later.stderr
    facts = child_facts(url)
    for run_id in due:
        done = left_of(run_id, facts[run_id], demo_root, archive_root, files[run_id])
        assert done == Left(stripped=True, temp_archive=False, archive=True, archived=True, files="gone"), run_id
        assert_whole(run_id, facts[run_id], before[run_id], done)
        assert facts[run_id]["archive_path"] == str(archive_root / f"{run_id}.tar.gz")
    assert {path.name for path in archive_root.iterdir()} == expected, "no temp archive is left"
    assert not [path for path in demo_root.iterdir() if path.name.startswith(".")], "no renamed copy is left"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("failpoint", ["retention_mid_strip", "retention_after_strip"])
def test_a_kill_while_stripping_leaves_the_run_stripped_or_not_and_the_next_apply_finishes(
    demo_root, tmp_path, failpoint
):
    url = database_url_for_children(tmp_path)
    manage(url, "import_runs", str(demo_root), check=True)
    two_days_on = protocol.format_time(protocol.utc_now() + dt.timedelta(days=2))
    archive_root = tmp_path / "archive"
    env = child_env(url) | {"RECEIPTS_CLOCK": two_days_on, "EVIDENCE_STRIP_AFTER_DAYS": "1"}
    env["EVIDENCE_ARCHIVE_ROOT"] = str(archive_root)
    due = [run_id for run_id, action in plan_of(env).items() if action == plans.STRIP_BODIES]
    assert due == ["clean-run"], due
    files = run_files(demo_root / "clean-run")
    before = child_facts(url)["clean-run"]
    assert before["bodies"] > 0 and before["stripped"] == 0

    apply_killed_at(failpoint, env)
    facts = child_facts(url)["clean-run"]
    assert facts["stripped_at"] is (failpoint == "retention_after_strip"), "the kill landed where its failpoint is"
    assert_whole("clean-run", facts, before, left_of("clean-run", facts, demo_root, archive_root, files))

    finished = subprocess.run(manage_command("apply_retention", "--apply"), env=env, capture_output=True, check=False)
    assert finished.returncode == 0, finished.stderr
    facts = child_facts(url)["clean-run"]
    assert facts["stripped_at"] and facts["stripped"] == facts["bodies"] and facts["audit"] == {"bodies_stripped": 1}
    assert run_files(demo_root / "clean-run") == files, "stripping is the database's: the run directory is the same"
    assert not archive_root.exists()


def verify_archive(archive: Path, files: dict[Path, bytes], root: Path) -> bool:
    with tarfile.open(archive) as packed:
        members = {member.name: member for member in packed.getmembers() if member.isfile()}
        return all(
            (member := members.get(str(p.relative_to(root)))) is not None and member_bytes(packed, member) == data
            for p, data in files.items()
        )


def member_bytes(packed: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stored = packed.extractfile(member)
    assert stored is not None, f"{member.name} is not a file"
    return stored.read()


def test_plan_only_is_the_default(demo, monkeypatch):
    monkeypatch.setenv("RECEIPTS_CLOCK", LATER)
    assert apply()["clean-run"]["action"] == "archive" and "applied" not in apply()["clean-run"]
    assert (demo / "clean-run").exists() and not Run.objects.get(run_id="clean-run").archived


def test_stripping_does_not_keep_a_value_posing_as_the_redaction_marker(run_dir, monkeypatch, settings):
    """``{"redacted": X}`` that retention did not write is data: stripped to its digest like the rest."""
    canary = "plain words shaped as a marker, 7f3a"
    durable.append_event(run_dir, "note", {"token": {"redacted": canary}})
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "x"})
    runtime.run_set_state(run_dir, state="finished", attempts=1)
    importer.run_import(path=run_dir)
    monkeypatch.setenv("RECEIPTS_CLOCK", "2026-12-31T12:00:00Z")
    settings.RETENTION_STRIP_AFTER_DAYS = 0
    settings.RETENTION_ARCHIVE_AFTER_DAYS = 3650
    assert apply("--apply")[run_dir.name]["applied"] == "stripped"
    payloads = json.dumps([event.payload for event in Event.objects.filter(run__run_id=run_dir.name)])
    assert canary not in payloads
    assert protocol.is_redaction_marker(Event.objects.get(run__run_id=run_dir.name, type="note").payload["token"])
