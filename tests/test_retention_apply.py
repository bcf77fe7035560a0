"""Applying retention: bodies stripped to digests, runs archived and checked, nothing lost on the way."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import tarfile
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from evidence import importer
from evidence.models import Event, Run
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


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs for the archives: a full disk, for real."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=False).returncode:
        pytest.fail("mounting a tmpfs needs root: the suite runs as root here and in CI")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


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


@pytest.mark.django_db(transaction=True)
def test_a_kill_during_apply_leaves_each_run_whole_and_the_next_apply_finishes(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    synthetic_ledger(demo_root / "clean-run", 60_000, start_seq=11)
    manage(url, "import_runs", str(demo_root), check=True)
    files = run_files(demo_root / "clean-run")
    archive_root = tmp_path / "archive"
    env = child_env(url) | {"RECEIPTS_CLOCK": LATER, "EVIDENCE_ARCHIVE_ROOT": str(archive_root)}
    seed = random.randrange(2**32)
    child = subprocess.Popen(manage_command("apply_retention", "--apply"), env=env, stdout=subprocess.DEVNULL)
    time.sleep(random.Random(seed).uniform(0.5, 3.0))
    child.send_signal(signal.SIGKILL)
    child.wait()
    if child_query(url, "Run.objects.get(run_id='clean-run').archived") == "True":
        # Marked archived: the archive is whole, whatever is left of the directory.
        assert verify_archive(archive_root / "clean-run.tar.gz", files, demo_root), seed
    else:  # not marked: the run directory is untouched
        assert run_files(demo_root / "clean-run") == files, seed
    finished = subprocess.run(manage_command("apply_retention", "--apply"), env=env, capture_output=True, check=False)
    assert finished.returncode == 0, finished.stderr
    assert child_query(url, "Run.objects.get(run_id='clean-run').archived") == "True", seed
    assert not (demo_root / "clean-run").exists() and not list(demo_root.glob(".clean-run.archived-*")), seed
    assert verify_archive(archive_root / "clean-run.tar.gz", files, demo_root), seed
    assert child_query(url, "Call.objects.filter(run__run_id='clean-run').count()") == "3", "its rows stay browsable"


def verify_archive(archive: Path, files: dict[Path, bytes], root: Path) -> bool:
    with tarfile.open(archive) as packed:
        members = {member.name: member for member in packed.getmembers() if member.isfile()}
        return all(member_bytes(packed, members[str(p.relative_to(root))]) == data for p, data in files.items())


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
