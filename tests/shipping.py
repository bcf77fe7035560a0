"""A real shipper in a test (``python -m receipts ship`` in an environment with no database and
no Django settings), the mirror it ships to, what "converged" means, a proxy that loses
answers on the way back, and a host whose shipper keeps shipping (``shipping_host``)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from evidence.ingest import shipping
from evidence.review import inbox
from receipts import protocol
from tests.helpers import PROJECT
from tests.serving import stop


@pytest.fixture
def mirror(settings, tmp_path) -> Path:
    settings.EVIDENCE_MIRROR_ROOT = tmp_path / "mirror"
    return settings.EVIDENCE_MIRROR_ROOT


def ship_command(root: Path, url: str, key: str, tmp_path: Path, *extra: str) -> list[str]:
    """The command line of a shipper of ``root`` with ``key``, its state and key files under
    ``tmp_path`` (the same for every call with the same root and key: a restart goes on)."""
    key_file = tmp_path / f"key-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    key_file.write_text(key + "\n")
    state = tmp_path / f"state-{root.name}-{key_file.name}.json"
    return [sys.executable, "-m", "receipts", "ship", str(root), "--to", url, "--key-file", str(key_file),
            "--state", str(state), *extra]  # fmt: skip


def ship_env(tmp_path: Path, **more_env: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(PROJECT), **more_env}


def ship(
    root: Path, url: str, key: str, tmp_path: Path, *extra: str, **more_env: str
) -> subprocess.CompletedProcess[str]:
    """One pass of a real shipper, in an environment with no database and no Django settings."""
    command = ship_command(root, url, key, tmp_path, "--once", *extra)
    return subprocess.run(command, env=ship_env(tmp_path, **more_env), capture_output=True, text=True, timeout=300,
                          check=False, cwd=tmp_path)  # fmt: skip


def run_files(run_dir: Path) -> dict[str, bytes]:
    """What a run directory holds that the shipper sends: steer.json, state.json, the ledger and
    every record file, by path (the writer's dot files aside)."""
    found = {}
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir)
        shipped = str(relative) in ("steer.json", "state.json", protocol.LEDGER_NAME) or (
            len(relative.parts) == 2 and relative.parts[0] in protocol.RUN_FOLDERS
        )
        if shipped and path.is_file() and not path.is_symlink() and not relative.name.startswith("."):
            found[str(relative)] = path.read_bytes()
    return found


def converged(root: Path, copy: Path) -> dict[str, str]:
    """Where the mirror's copy of each run under ``root`` differs from the host's bytes ({} when
    none does): a missing file, a file unlike the host's, a ledger shorter or longer."""
    differences = {}
    for run_dir in sorted(path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")):
        host, mirrored = run_files(run_dir), run_files(copy / run_dir.name)
        for name in host.keys() | mirrored.keys():
            if host.get(name) != mirrored.get(name):
                held = mirrored.get(name)
                differences[f"{run_dir.name}/{name}"] = (
                    "missing" if held is None else f"{len(held)} bytes, the host's {len(host.get(name) or b'')}"
                )
    return differences


def named_before_their_receipts(copy: Path) -> list[str]:
    """The calls the mirror's ledger names whose receipt the mirror does not hold: what a push
    that sent the ledger before the files would leave."""
    ledger = copy / protocol.LEDGER_NAME
    if not ledger.exists():
        return []
    import json

    named = set()
    for line in ledger.read_bytes().splitlines():
        event = json.loads(line)
        if event.get("type") == "receipt":
            named.add(event["call_id"])
    return sorted(call_id for call_id in named if not (copy / "receipts" / f"{call_id}.json").exists())


class LossyProxy:
    """A loopback HTTP proxy in front of ``upstream`` that forwards each request whole and, for
    those ``lose`` picks (by method, path and how many came before), reads the server's whole
    answer and closes the connection without it: the server did the work, the shipper never hears.
    One request a connection (the shipper's urllib says ``Connection: close``)."""

    def __init__(self, upstream: str, lose: Callable[[str, str, int], bool]) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.lose = lose
        self.seen: list[tuple[str, str, bool]] = []  # method, path, lost
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head:
                block = client.recv(65536)
                if not block:
                    return
                head += block
            head, _, body = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next(
                (int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")), 0
            )
            while len(body) < length:
                body += client.recv(65536)
            with socket.create_connection(self.upstream) as server:
                server.sendall(head + b"\r\n\r\n" + body)
                answer = b""
                while block := server.recv(65536):
                    answer += block
            with self.lock:
                lost = self.lose(method, path, sum(1 for m, p, _ in self.seen if (m, p) == (method, path)))
                self.seen.append((method, path, lost))
            if not lost:
                client.sendall(answer)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def shipping_host(demo_root, tmp_path, live_server, mirror, settings) -> Iterator[dict]:
    """Host agent-a, its runs shipped and imported once, then a shipper that keeps shipping (a
    pass every 0.2 s), so that the host reports and is never silent; a path stuck for a second
    is stuck."""
    settings.EVIDENCE_SHIP_STUCK_AFTER_SECONDS = 1
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    world = {"key": key, "root": demo_root, "url": live_server.url, "tmp": tmp_path, "shipper": None, "mirror": mirror}
    try:
        yield world
    finally:
        if world["shipper"] is not None:
            stop(world["shipper"])


def start_shipper(world: dict, **env: str) -> subprocess.Popen:
    if world["shipper"] is not None:
        stop(world["shipper"])
    command = ship_command(world["root"], world["url"], world["key"], world["tmp"], "--interval", "0.2")
    with open(world["tmp"] / "shipper.log", "a") as log:  # the child holds its own copy of the file
        world["shipper"] = subprocess.Popen(command, env=ship_env(world["tmp"], **env), stdout=subprocess.DEVNULL,
                                            stderr=log, cwd=world["tmp"])  # fmt: skip
    return world["shipper"]


def stalled_item(host: str = "agent-a") -> inbox.InboxItem | None:
    return next((item for item in inbox.inbox_items(kind=inbox.STALLED) if item.subject == host), None)
