"""Only a run's own host touches its files, and retention re-checks what it acts on when it acts.

Real ``apply_retention`` and ``import_runs --watch`` processes against the test's database: a
worker of another host strips but never archives; a directory that holds another run (another
host's copy at the same path, a new run under an archived id) is never archived nor removed; a
legal hold set while a run is being archived stops it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from evidence.ingest import importer
from evidence.models import Finding, Host, Run
from receipts import protocol, runtime
from tests.helpers import CONTRACT, is_stopped
from tests.subprocess_db import child_env, database_url_for_children, manage, manage_command

LATER = "2036-01-01T00:00:00Z"  # every demo run is past both ages by then

pytestmark = pytest.mark.django_db(transaction=True)


def run_env(url: str, host: str, archive_root: Path, **more: str) -> dict[str, str]:
    return child_env(url) | {"RECEIPTS_CLOCK": LATER, "EVIDENCE_ARCHIVE_ROOT": str(archive_root),
                             "EVIDENCE_HOST_NAME": host, **more}  # fmt: skip


def apply_retention(env: dict[str, str]) -> dict[str, dict]:
    completed = subprocess.run(
        manage_command("apply_retention", "--apply", "--json"), env=env, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return {run["run_id"]: run for run in json.loads(completed.stdout)["runs"]}


def new_finished_run(run_dir: Path, content: str) -> None:
    """A run the writer makes, with one committed effect, finished."""
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    ended = runtime.Executor(run_dir).call("write_file", {"path": "out.txt", "content": content})
    assert ended.status == "committed"
    runtime.run_set_state(run_dir, state="completed", attempts=1)


def facts(url: str, run_id: str) -> dict:
    code = (
        "import json; from evidence.models import Run; "
        f"r = Run.objects.select_related('host').get(run_id={run_id!r}); "
        "print(json.dumps({'archived': r.archived, 'stripped': r.bodies_stripped_at is not None, "
        "'host': r.host.name, 'path': r.path, 'hold': r.legal_hold}))"
    )
    return json.loads(manage(url, "shell", "-v", "0", "-c", code, check=True).stdout)


def test_another_hosts_worker_strips_and_leaves_the_archive_to_the_runs_own_host(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    subprocess.run(manage_command("import_runs", str(demo_root)), env=child_env(url) | {"EVIDENCE_HOST_NAME": "b"},
                   check=True, capture_output=True)  # fmt: skip
    archive_root = tmp_path / "archive"
    before = sorted(path.name for path in (demo_root / "clean-run").rglob("*"))

    on_a = apply_retention(run_env(url, "a", archive_root))
    assert on_a["clean-run"]["applied"] == "stripped", on_a["clean-run"]
    assert on_a["clean-run"]["error"] == "archived by its own host, b"
    assert sorted(path.name for path in (demo_root / "clean-run").rglob("*")) == before, "host a touched nothing"
    assert not archive_root.exists()
    assert facts(url, "clean-run") | {"path": None} == {"archived": False, "stripped": True, "host": "b",
                                                        "path": None, "hold": False}  # fmt: skip

    # Host b's own watch applies retention to its runs: there, the run is archived.
    env = run_env(url, "b", archive_root, EVIDENCE_WATCH_RETENTION_SECONDS="3600")
    log = tmp_path / "watch.log"
    with open(log, "wb") as said:
        watch = subprocess.Popen(manage_command("import_runs", str(demo_root), "--watch", "--interval", "0.5"),
                                 env=env, stdout=subprocess.DEVNULL, stderr=said)  # fmt: skip
    try:
        # The watch says what its retention did once it is all done (the directory goes first).
        deadline = time.monotonic() + 120
        while "retention: clean-run archived" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and watch.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=60)
    assert not (demo_root / "clean-run").exists()
    assert (archive_root / "clean-run.tar.gz").is_file() and facts(url, "clean-run")["archived"]


def test_a_directory_that_holds_another_run_is_neither_archived_nor_removed(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    manage(url, "import_runs", str(demo_root), check=True)
    # Another run under the same name at the same path (another host's copy, as its worker sees it).
    shutil.move(demo_root / "clean-run", tmp_path / "imported-clean-run")
    other = demo_root / "clean-run"
    new_finished_run(other, "another run's effect")
    before = sorted(str(path.relative_to(other)) for path in other.rglob("*"))
    archive_root = tmp_path / "archive"

    result = apply_retention(run_env(url, facts(url, "clean-run")["host"], archive_root))["clean-run"]
    assert result["applied"] == "nothing archived", result
    assert "holds another run than the one imported" in result["error"]
    assert sorted(str(path.relative_to(other)) for path in other.rglob("*")) == before
    assert not (archive_root / "clean-run.tar.gz").exists() and not facts(url, "clean-run")["archived"]


def test_a_new_run_under_an_archived_id_is_said_and_never_removed(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    manage(url, "import_runs", str(demo_root), check=True)
    host = facts(url, "clean-run")["host"]
    archive_root = tmp_path / "archive"
    assert apply_retention(run_env(url, host, archive_root))["clean-run"]["applied"] == "archived"
    assert not (demo_root / "clean-run").exists()
    # A new run takes the archived run's name, and commits an effect.
    reused = demo_root / "clean-run"
    new_finished_run(reused, "kept")

    imported = manage(url, "import_runs", str(demo_root), "--json", check=True)
    [finding] = [f for f in json.loads(imported.stdout)["root_findings"] if f["code"] == "archived_run_id_reused"]
    assert finding["subject"] == "clean-run" and "not imported" in finding["detail"]
    apply_retention(run_env(url, host, archive_root))
    assert list((reused / "receipts").glob("*.json")), "the new run's committed receipt is still there"
    # The archived run's leftover (a killed apply's) is what retention removes, and only that.
    assert facts(url, "clean-run")["archived"]


def test_a_legal_hold_set_while_a_run_is_archived_stops_it(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    manage(url, "import_runs", str(demo_root), check=True)
    host = facts(url, "clean-run")["host"]
    archive_root = tmp_path / "archive"
    env = run_env(url, host, archive_root, RECEIPTS_FAILPOINT="retention_after_read_back:pause")
    child = subprocess.Popen(manage_command("apply_retention", "--apply", "--json"), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        # The first run due is packed and read back, then the process stops itself there.
        deadline = time.monotonic() + 120
        while not is_stopped(child.pid):
            assert child.poll() is None and time.monotonic() < deadline, "never reached the failpoint"
            time.sleep(0.05)
        paused = sorted(path.name for path in archive_root.iterdir())
        [run_id] = [name.removesuffix(".tar.gz") for name in paused if name.endswith(".tar.gz")]
        hold = (
            "from django.contrib.auth.models import User; from evidence.retention import actions; "
            "from evidence.models import Run; from receipts import protocol; "
            f"actions.set_legal_hold(run=Run.objects.get(run_id={run_id!r}), "
            "user=User.objects.create_user('counsel'), hold=True, reason='litigation', now=protocol.utc_now())"
        )
        manage(url, "shell", "-v", "0", "-c", hold, check=True)
    finally:
        child.send_signal(signal.SIGCONT)
    # Every later run due pauses at the same failpoint: let each go on.
    while child.poll() is None:
        if is_stopped(child.pid):
            child.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    stdout, stderr = child.communicate()
    assert child.returncode == 0, stderr
    result = {run["run_id"]: run for run in json.loads(stdout)["runs"]}[run_id]
    assert result["applied"] == "nothing archived" and "a legal hold (counsel: litigation)" in result["error"]
    assert (demo_root / run_id).is_dir() and not (archive_root / f"{run_id}.tar.gz").exists()
    assert facts(url, run_id) | {"path": None} == {"archived": False, "stripped": True, "host": host,
                                                   "path": None, "hold": True}  # fmt: skip


@pytest.mark.django_db
def test_a_run_another_host_created_since_the_pass_read_the_owners_is_not_overwritten(demo_root, monkeypatch):
    importer.root_import(root=demo_root)
    first = Run.objects.get(run_id="clean-run")
    copy = demo_root.parent / "host-b-runs"
    copy.mkdir()
    shutil.copytree(demo_root / "clean-run", copy / "clean-run", symlinks=True)
    now = protocol.utc_now()
    other_host = Host.objects.create(name="b", runs_root=str(copy), started_at=now, last_seen_at=now)
    # The pass of host b read the owners before host a created the run: it sees no owner.
    monkeypatch.setattr(importer, "claimed_elsewhere", lambda *args: None)
    report = importer.root_import(root=copy, host=other_host)
    assert report.runs == []
    [finding] = Finding.objects.filter(code="duplicate_run_id", subject="clean-run", closed_at__isnull=True)
    assert f"on host {first.host}" in finding.detail and "not imported" in finding.detail
    kept = Run.objects.get(run_id="clean-run")
    assert (kept.host_id, kept.path, kept.fingerprint) == (first.host_id, first.path, first.fingerprint)
