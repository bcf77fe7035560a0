"""A real writer daemon (``callproof serve``) for tests, and real Unix users to run it and an agent as.

The daemon and the agents run the standard-library package from this checkout. As another
user, the interpreter is the system's ``/usr/bin/python3``: this checkout's virtualenv may
sit below a home folder other users cannot enter, and the writer needs nothing else.
"""

from __future__ import annotations

import atexit
import dataclasses
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from receipts.demo import PACKAGE_PARENT

WRITER_USER, AGENT_USER, AGENTS_GROUP = "callproof-writer", "callproof-agent", "callproof-agents"
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclasses.dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def popen_kwargs(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def why_no_users() -> str | None:
    """Why real users cannot be made here, or ``None`` when they can (root, useradd, a system Python 3.11+)."""
    if os.geteuid() != 0:
        return "making Unix users needs root (CI runs as root)"
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        return "useradd/groupadd are not on this machine"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is not on this machine"
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                             capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    if version != "True":
        return f"{SYSTEM_PYTHON} is older than 3.11"
    return None


def accounts() -> tuple[Account, Account]:
    """The writer's and the agent's users (made once, kept: useradd on a CI machine is idempotent here)."""
    try:
        grp.getgrnam(AGENTS_GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", AGENTS_GROUP], check=True)
    for name in (WRITER_USER, AGENT_USER):
        try:
            pwd.getpwnam(name)
        except KeyError:
            # The writer is in the agents' group only to hand the workspaces to it (chgrp needs membership).
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            "--user-group", "--groups", AGENTS_GROUP, name], check=True)  # fmt: skip
    agents = grp.getgrnam(AGENTS_GROUP).gr_gid
    made = []
    for name in (WRITER_USER, AGENT_USER):
        entry = pwd.getpwnam(name)
        made.append(Account(name, entry.pw_uid, entry.pw_gid, (agents,)))
    return made[0], made[1]


@pytest.fixture(scope="session")
def users() -> tuple[Account, Account]:
    reason = why_no_users()
    if reason:
        pytest.skip(reason)
    return accounts()


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="callproof-serve-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


_package_copy: list[Path] = []


def package_parent() -> str:
    """A copy of this checkout's ``receipts`` package, in a folder every user can read.

    The checkout may lie where other users cannot enter (CI works in a ``mktemp -d`` folder,
    mode 0700); the writer needs nothing but the standard library and this package. One copy
    per test process, removed when it ends.
    """
    if not _package_copy:
        base = Path(tempfile.mkdtemp(prefix="callproof-package-", dir="/tmp"))
        shutil.copytree(Path(PACKAGE_PARENT) / "receipts", base / "receipts",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        for folder, _, names in os.walk(base):
            os.chmod(folder, 0o755)  # noqa: S103 - every user reads and enters the package: that is its point
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        atexit.register(shutil.rmtree, base, True)
        _package_copy.append(base)
    return str(_package_copy[0])


def python_for(account: Account | None) -> str:
    return SYSTEM_PYTHON if account is not None else sys.executable


def env_for(socket: Path | None = None, /, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("RECEIPTS_FAILPOINT", "RECEIPTS_WRITER_SOCKET", "RECEIPTS_SIGNING_KEY")}  # fmt: skip
    env["PYTHONPATH"] = package_parent()
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if socket is not None:
        env["RECEIPTS_WRITER_SOCKET"] = str(socket)
    env.update(extra)
    return env


class Daemon:
    """``python -m receipts serve ROOT --socket SOCKET``, started and waited for."""

    def __init__(self, root: Path, socket: Path, *, account: Account | None = None, options: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.root, self.socket, self.account, self.options, self.env = root, socket, account, options, env or {}
        self.process: subprocess.Popen | None = None
        self.log = socket.parent / f"daemon-{os.getpid()}-{time.monotonic_ns()}.log"

    def start(self) -> Daemon:
        command = [python_for(self.account), "-m", "receipts", "serve", str(self.root), "--socket", str(self.socket),
                   *self.options]  # fmt: skip
        kwargs = self.account.popen_kwargs() if self.account else {}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, env=env_for(**self.env), stdout=log, stderr=log, **kwargs)
        deadline = time.monotonic() + 20
        while not self.log.read_bytes().count(b'"serving"'):
            if self.process.poll() is not None:
                raise AssertionError(f"the daemon ended at start: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the daemon did not start: {self.log.read_text()}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def as_user(account: Account | None, *args: str, socket: Path | None = None, stdin: bytes | None = None,
            **env: str) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    """``python -m receipts ARGS`` as ``account`` (``None``: this process's user), through the daemon at ``socket``."""
    kwargs = account.popen_kwargs() if account else {}
    return subprocess.run([python_for(account), "-m", "receipts", *args], input=stdin, capture_output=True,
                          env=env_for(socket, **env), check=False, timeout=120, **kwargs)  # fmt: skip


def script_as(account: Account | None, code: str, *, socket: Path | None = None,
              **env: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    kwargs = account.popen_kwargs() if account else {}
    return subprocess.run([python_for(account), "-c", code], capture_output=True, text=True, check=False,
                          env=env_for(socket, **env), timeout=120, **kwargs)  # fmt: skip
