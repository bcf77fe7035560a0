"""The runtime authors' example of ``callproof serve`` runs as it says, with real users (as root)."""

from __future__ import annotations

import json
import os
import re
import subprocess

from tests.helpers import PROJECT
from tests.served import SYSTEM_PYTHON, WRITER_USER, package_parent

GUIDE = PROJECT / "docs" / "runtime-authors.md"


def test_the_serve_example_runs_as_root_with_real_users(users, shared_tmp):
    [script] = re.findall(r"<!-- example: serve -->\n```sh\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    # `callproof` as an installed wheel gives it, for every user: this checkout's writer on the system's Python.
    bin_dir = shared_tmp / "bin"
    bin_dir.mkdir(mode=0o755)
    shim = bin_dir / "callproof"
    command = f'PYTHONPATH={package_parent()} PYTHONDONTWRITEBYTECODE=1 exec {SYSTEM_PYTHON} -m receipts "$@"'
    shim.write_text(f"#!/bin/sh\n{command}\n")
    shim.chmod(0o755)
    root = shared_tmp / "srv"
    env = {key: value for key, value in os.environ.items() if not key.startswith("RECEIPTS_")}
    env.update(ROOT=str(root), PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}")
    done = subprocess.run(["sh", "-e", "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "the ledger is not the agent's", done.stdout
    outcome = json.loads(lines[-2])
    assert outcome["status"] == "committed" and outcome["reused"] is False
    assert "Permission denied" in done.stderr
    run = root / "runs" / "run-1"
    receipt = run / "receipts" / f"{outcome['call_id']}.json"
    writer_uid = int(subprocess.run(["id", "-u", WRITER_USER], capture_output=True, text=True, check=True).stdout)
    assert receipt.stat().st_uid == writer_uid and (run / "events.jsonl").stat().st_uid == writer_uid
    assert b"forged" not in (run / "events.jsonl").read_bytes()
    assert (run / "workspace" / "a.txt").read_text() == "hi"
