"""`make demo` as a new user runs it: its last words are the login and that the demo runs (said
once the server answers), the page answers with that login, and Ctrl-C (here SIGTERM to make)
stops the server, the watcher and the worker with it."""

from __future__ import annotations

import http.cookiejar
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import PROJECT

pytestmark = pytest.mark.slow
BANNER_END = "The demo is running. Stop it with Ctrl-C."


def project_copy(into: Path) -> Path:
    """What `make demo` needs of the checkout, without its var/, database or venv."""
    into.mkdir()
    for name in ("Makefile", "manage.py", "pyproject.toml", "requirements.lock"):
        shutil.copy2(PROJECT / name, into / name)
    for name in ("evidence", "receipts", "templates", "static"):
        shutil.copytree(PROJECT / name, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def read_until(process: subprocess.Popen, marker: str, seconds: float) -> str:
    assert process.stdout is not None
    out, deadline = "", time.monotonic() + seconds
    with selectors.DefaultSelector() as waiting:
        waiting.register(process.stdout, selectors.EVENT_READ)
        while marker not in out and time.monotonic() < deadline:
            if waiting.select(timeout=0.5):
                chunk = os.read(process.stdout.fileno(), 65536).decode()
                if not chunk:
                    break
                out += chunk
    return out


def processes_in(folder: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # gone, or not ours to read
    return found


def log_in(base: str, user: str, password: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = opener.open(f"{base}accounts/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token
    data = urllib.parse.urlencode({"username": user, "password": password, "csrfmiddlewaretoken": token.group(1)})
    request = urllib.request.Request(f"{base}accounts/login/", data.encode(), headers={"Referer": base})  # noqa: S310 - http on loopback
    opener.open(request, timeout=10)
    return opener


def test_make_demo_ends_with_the_login_and_stops_whole(tmp_path):
    copy = project_copy(tmp_path / "callproof")
    venv = Path(sys.prefix)
    address = f"127.0.0.1:{free_port()}"
    # The suite's own environment, installed already: make must not install it again (-o).
    command = ["make", "-C", str(copy), "demo", f"VENV={venv}", "-o", str(venv / ".installed"), f"ADDR={address}"]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "DATABASE_URL"))}
    make = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out = read_until(make, BANNER_END, 180)
        assert BANNER_END in out, out[-3000:]
        lines = [line for line in out.splitlines() if line.strip() and not line.startswith("make")]
        before = lines[: lines.index("  Callproof demo login")]
        assert len(before) == 1 and before[0].startswith("Preparing the demo"), f"the login is lost among: {before}"
        assert lines[-1].strip() == BANNER_END and "the Inbox: settle send-message-killed" in out
        assert "Logs       var/server.log, var/watch.log, var/worker.log" in out
        assert read_until(make, "\n", 2) == "", "nothing may follow the banner"
        password = re.search(r"Password +(\S+)", out)
        assert password and f"Open       http://{address}/" in out
        browser = log_in(f"http://{address}/", "demo", password.group(1))
        inbox = browser.open(f"http://{address}/inbox/", timeout=10).read().decode()
        assert "send-message-killed" in inbox
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while processes_in(copy) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_in(copy) == [], "make demo left processes behind"
