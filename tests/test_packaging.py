"""The writer as an agent runtime installs it: the project's wheel, built here, installed with no
dependency into a fresh virtual environment outside the checkout, where Django cannot be
imported. Its console script makes a run, a call, a task, a replay, and verifies an evidence
export that the dashboard (in this process) made of that run.

The boundary is the installation itself: whatever the writer side imported from a third
party would fail here, not in a check of ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command

from receipts import __version__, importer
from receipts.demo import login_request
from tests.helpers import CONTRACT, PROJECT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(PROJECT), "--no-deps", "-q", "-w", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    [built] = out.glob("callproof-*.whl")
    return built


@pytest.fixture(scope="module")
def writer_only(wheel, tmp_path_factory) -> Path:
    """A virtual environment holding the wheel and nothing else; its bin folder."""
    home = tmp_path_factory.mktemp("writer-env")
    venv.EnvBuilder(with_pip=True, clear=True).create(home / "venv")
    bin_dir = home / "venv" / "bin"
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
                   check=True, capture_output=True)  # fmt: skip
    return bin_dir


def run(bin_dir: Path, *args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # Nothing of the checkout on the path: only what the wheel installed.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(list(args), cwd=cwd, env=env, input=stdin, capture_output=True, check=False)


def test_the_wheel_carries_a_licence_a_version_and_a_console_script(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(name for name in names if name.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(next(name for name in names if name.endswith("entry_points.txt"))).decode()
    assert f"Version: {__version__}" in metadata and "License-Expression: Apache-2.0" in metadata
    assert not [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert "callproof = receipts.cli:main" in entry_points


@pytest.mark.django_db
def test_the_writer_runs_from_its_wheel_with_no_third_party_package(writer_only, tmp_path):
    python = str(writer_only / "python")
    assert run(writer_only, python, "-c", "import django", cwd=tmp_path).returncode != 0, "Django is not there"
    callproof = str(writer_only / "callproof")
    version = run(writer_only, callproof, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.decode().strip() == f"callproof {__version__}"
    run_dir = tmp_path / "run-from-wheel"
    steps = [
        ("init", str(run_dir), "--contract-sha256", CONTRACT),
        ("call", str(run_dir), "--tool", "write_file", "--args", json.dumps({"path": "a.txt", "content": "x"})),
        ("call", str(run_dir), "--tool", "send_message", "--args", json.dumps({"to": "ops", "body": "done"})),
        ("write-task", str(run_dir), "--request", "-", "--submission-id", "wheel-1"),
        ("replay", str(run_dir), "--json"),
    ]
    for step in steps:
        stdin = json.dumps(login_request()).encode() if step[0] == "write-task" else None
        completed = run(writer_only, callproof, *step, cwd=tmp_path, stdin=stdin)
        assert completed.returncode == 0, (step, completed.stderr.decode())
    decisions = json.loads(completed.stdout)["decisions"]
    assert len(decisions) == 2 and {row["decision"] for row in decisions} == {"reuse"}
    # The dashboard (this process) imports and exports the run; the wheel's verifier checks it.
    importer.run_import(path=run_dir)
    out = tmp_path / "export"
    call_command("export_evidence", run_dir.name, "--out", str(out))
    verified = run(writer_only, callproof, "verify-evidence", str(out), "--against", str(run_dir), cwd=tmp_path)
    assert verified.returncode == 0 and b"intact" in verified.stdout, verified.stderr.decode()
    (out / "index.html").write_bytes((out / "index.html").read_bytes() + b" ")
    assert run(writer_only, callproof, "verify-evidence", str(out), cwd=tmp_path).returncode == 1
    assert os.path.isdir(run_dir / "receipts") and not (tmp_path / "db.sqlite3").exists()
