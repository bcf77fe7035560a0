"""No write follows a symlink out of a run directory, and no FIFO hangs the writer.

Everything under a run directory was written by the agent, so an agent (or whoever holds
its files) can plant a symlink where the writer writes. Each test here plants a real one,
to a file or a folder outside the run, the way an attacker would, then drives the real
writer (its command line), the dashboard's settle (a POST) or retention's sweep, and checks
that nothing outside changed, that the answer is a clear refusal, and that the importer
says why in a finding.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from http import HTTPStatus
from pathlib import Path

import pytest
from django.http import HttpResponse

from evidence.ingest import importer
from evidence.models import Finding, HumanDecision
from receipts import confined, durable, runtime
from receipts.demo import login_request, writer_command, writer_env
from tests.helpers import content, first_call_of, join, settle_form
from tests.writer import FILE_ARGS, MESSAGE, cli_call, cli_write_task, outbox_lines

# A file outside every run, worth protecting: its last line has no newline, which the ledger's
# torn-tail repair would cut, and any append would grow it.
PRECIOUS = b"SQLite format 3\x00 a database page\nits last line, torn"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.db").write_bytes(PRECIOUS)
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def link_file(run_dir: Path, name: str, outside: Path) -> None:
    """Replace ``run_dir/name`` by a symlink to the precious file outside."""
    path = run_dir / name
    path.unlink(missing_ok=True)
    path.symlink_to(outside / "precious.db")


def link_folder(run_dir: Path, name: str, outside: Path) -> None:
    """Replace the folder ``run_dir/name`` (and what was in it) by a symlink to the folder outside."""
    path = run_dir / name
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        path.rmdir()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside, target_is_directory=True)


WRITER_CASES = [
    # (what is linked, how, the command that writes there)
    ("events.jsonl", link_file, "send_message"),
    ("outbox.jsonl", link_file, "send_message"),
    ("state.json", link_file, "write_file"),
    ("steer.json", link_file, "write_file"),
    ("receipts", link_folder, "write_file"),
    (".writer", link_folder, "send_message"),
    ("workspace", link_folder, "write_file"),
    ("workspace/src", link_folder, "write_file"),
    ("tasks", link_folder, "write-task"),
    ("submissions", link_folder, "write-task"),
]


@pytest.mark.parametrize(("name", "plant", "command"), WRITER_CASES, ids=[case[0] for case in WRITER_CASES])
def test_the_writer_never_writes_through_a_symlink(run_dir, outside, name, plant, command):
    plant(run_dir, name, outside)
    before = snapshot(outside)
    if command == "write-task":
        completed = cli_write_task(run_dir, login_request())
    else:
        completed = cli_call(run_dir, command, MESSAGE if command == "send_message" else FILE_ARGS)
    assert snapshot(outside) == before, f"{name}: something outside the run changed"
    assert completed.returncode != 0, completed.stdout
    said = (completed.stdout + completed.stderr).decode()
    assert "Traceback" not in said and ("symlink" in said or "not a regular file" in said), said
    if command == "send_message" and name != "outbox.jsonl":
        assert outbox_lines(run_dir) == [], "refused before the message was sent"


def test_a_state_json_that_is_a_symlink_is_replaced_never_written_through(run_dir, outside):
    link_file(run_dir, "state.json", outside)
    completed = subprocess.run(
        [*writer_command(), "state", str(run_dir), "running", "--attempts", "1"], capture_output=True, env=writer_env()
    )
    assert completed.returncode == 0, completed.stderr
    assert (outside / "precious.db").read_bytes() == PRECIOUS
    assert not (run_dir / "state.json").is_symlink()


def test_a_fifo_where_a_receipt_belongs_never_hangs_the_writer(run_dir):
    killed = cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared")
    assert killed.returncode == 137
    [receipt] = (run_dir / "receipts").glob("*.json")
    receipt.unlink()
    os.mkfifo(receipt)
    completed = subprocess.run(
        [*writer_command(), "call", str(run_dir), "--tool", "send_message", "--args", json.dumps(MESSAGE)],
        capture_output=True,
        env=writer_env(),
        timeout=60,  # a writer that opened the FIFO would wait for a writer on its other end for ever
    )
    assert completed.returncode == 1 and b"not a regular file" in completed.stderr
    assert outbox_lines(run_dir) == []


def test_the_sweep_never_removes_what_a_symlinked_folder_points_at(run_dir, outside):
    lock = outside / "call-0000.lock"
    lock.write_bytes(b"")
    temp = outside / durable.temp_name_for("TASK-000001.md")
    temp.write_bytes(b"half")
    then = time.time() - 3 * 3600
    os.utime(temp, (then, then))
    link_folder(run_dir, "tasks", outside)
    swept = subprocess.run([*writer_command(), "sweep", str(run_dir)], capture_output=True, env=writer_env())
    assert swept.returncode == 0, swept.stderr
    assert temp.exists(), "a temp file behind a symlinked tasks/ stays"
    link_folder(run_dir, ".writer", outside)
    swept = subprocess.run([*writer_command(), "sweep", str(run_dir)], capture_output=True, env=writer_env())
    assert swept.returncode == 1 and b"symlink" in swept.stderr
    assert lock.exists() and temp.exists()
    with pytest.raises(confined.UnsafePath):
        runtime.sweep_locks(run_dir)
    assert lock.exists()


# --- the dashboard: settling and retention ---------------------------------------------

RUN = "send-message-killed"


@pytest.fixture
def as_confirmer(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("carol"), "confirmer"))
    return client


def settle(client, call) -> HttpResponse:
    from django.urls import reverse

    return client.post(reverse("confirm", args=[RUN, call.call_id]), settle_form(call, reason="the mail log shows it"))


def receipt_link(run_dir: Path, name: str, outside: Path) -> None:
    """The call's receipt moved outside and linked back: the same bytes, so the digest the page
    showed still matches."""
    [receipt] = (run_dir / "receipts").glob("*.json")
    (outside / "receipt.json").write_bytes(receipt.read_bytes())
    receipt.unlink()
    receipt.symlink_to(outside / "receipt.json")


SETTLE_CASES = [
    ("events.jsonl", link_file, "events.jsonl"),
    ("confirmations", link_folder, "confirmations"),
    (".writer", link_folder, None),
    ("receipt", receipt_link, "receipts/"),
]


@pytest.mark.parametrize(("name", "plant", "subject"), SETTLE_CASES, ids=[case[0] for case in SETTLE_CASES])
def test_settling_never_writes_through_a_symlink(as_confirmer, demo, outside, name, plant, subject):
    run_dir = demo / RUN
    call = first_call_of(RUN)
    plant(run_dir, name, outside)
    before = snapshot(outside)
    response = settle(as_confirmer, call)
    assert response.status_code == HTTPStatus.CONFLICT
    page = content(response)
    assert "symlink" in page and "nothing was recorded" in page, page
    assert snapshot(outside) == before
    assert not HumanDecision.objects.exists()
    assert not (run_dir / "confirmations" / f"{call.call_id}.json").exists() or name == "confirmations"
    if subject is not None:
        # The next import says why: the reader never follows a symlink either.
        importer.run_import(path=run_dir, force=True)
        findings = Finding.objects.filter(run__run_id=RUN, code="unsafe_path")
        assert any(finding.subject.startswith(subject) for finding in findings), list(findings.values("subject"))


def test_settling_in_a_run_directory_swapped_for_a_symlink_makes_nothing_where_it_points(
    as_confirmer, demo, outside, tmp_path
):
    """The run directory itself swapped for a symlink (the reader would not follow it): settling
    on the run's own host is refused before the writer makes .writer/ or a lock there."""
    run_dir = demo / RUN
    call = first_call_of(RUN)
    run_dir.rename(tmp_path / "the-real-run")
    run_dir.symlink_to(outside, target_is_directory=True)
    response = settle(as_confirmer, call)
    assert response.status_code == HTTPStatus.CONFLICT
    page = content(response)
    assert "symlink" in page and "nothing was recorded" in page, page
    assert sorted(path.name for path in outside.rglob("*")) == ["precious.db"]
    assert not HumanDecision.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_retention_never_sweeps_a_symlinked_writer_folder(demo_root, outside, settings, monkeypatch):
    from io import StringIO

    from django.core.management import call_command

    from tests.helpers import import_as_seen_later

    import_as_seen_later(demo_root)
    lock = outside / "call-0000.lock"
    lock.write_bytes(b"")
    link_folder(demo_root / "clean-run", ".writer", outside)
    monkeypatch.setenv("RECEIPTS_CLOCK", "2026-12-31T12:00:00Z")
    settings.RETENTION_STRIP_AFTER_DAYS = 1
    out = StringIO()
    call_command("apply_retention", "--json", "--apply", stdout=out)
    applied = {run["run_id"]: run for run in json.loads(out.getvalue())["runs"]}
    assert applied["clean-run"]["applied"] == "stripped"
    assert lock.exists() and snapshot(outside) == {"call-0000.lock": b"", "precious.db": PRECIOUS}


def test_a_path_that_leaves_the_run_is_refused_before_anything_is_opened(run_dir, outside):
    with pytest.raises(confined.UnsafePath):
        durable.write_durable(outside / "x.json", b"{}", root=run_dir)
    with pytest.raises(confined.UnsafePath):
        durable.write_durable(run_dir / ".." / "outside" / "x.json", b"{}", root=run_dir)
    assert not (outside / "x.json").exists()
