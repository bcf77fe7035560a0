"""``callproof ship``: an agent host's runs, sent to the dashboard over HTTPS with the host's key.

Standard library only: a host that ships needs no database credentials and no Django. Each
pass sends what changed since the dashboard last acknowledged it (the ledger's new bytes from
the acknowledged offset, each changed record file whole, both in chunks with their SHA-256),
then asks for the people's decisions about its runs, writes each through the writer
(``runtime.confirm_call``, under the call's lock, which re-checks the receipt the person saw)
and acknowledges each by id. What was acknowledged is kept in a state file, so a restarted
shipper goes on where it was; sending again what was already received is harmless.

The dashboard knows the host by its key (``manage.py host add NAME``), never by a name the
shipper claims, and stamps every time with its own clock.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from receipts import __version__, confined, durable, protocol, runtime
from receipts.reader import MAX_JSON_BYTES, birth_digest, discover_runs

CHUNK_BYTES = 384 * 1024  # what one push carries at most: the server takes 512 KiB a chunk
TIMEOUT_SECONDS = 60.0


class ShipRefusedError(Exception):
    """The dashboard refused this shipper for good (a key unknown or revoked, another shipper
    with the same key): it stops, and says why."""


@dataclasses.dataclass
class PassReport:
    pushed_bytes: int = 0
    delivered: int = 0
    refused: int = 0
    failed: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)


def state_file_for(root: Path) -> Path:
    """Where a shipper of ``root`` keeps what the dashboard acknowledged, by default."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "callproof"
    return base / f"ship-{hashlib.sha256(str(Path(root).absolute()).encode()).hexdigest()[:16]}.json"


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Shipper:
    def __init__(
        self, root: Path, url: str, key: str, *, state_path: Path | None = None, ca_file: str | None = None
    ) -> None:
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme != "https" and not (scheme == "http" and _loopback(url)):
            raise ValueError(f"{url}: the dashboard is reached over https (plain http only on loopback)")
        if not key.startswith("cph_"):
            raise ValueError("the key is the cph_... line `manage.py host add NAME` printed")
        self.root = Path(root).absolute()
        self.url = url.rstrip("/") + "/ship/v1/"
        self.key = key
        self.state_path = state_path or state_file_for(self.root)
        self.context = ssl.create_default_context(cafile=ca_file) if scheme == "https" else None
        self._hold_state()
        self.state = self._load_state()
        # Who this shipper is to the dashboard, which lets one shipper per key ship at a time: kept
        # with the state, so that the same shipper started again after a crash is still itself,
        # while a second shipper elsewhere with the same key is another and is refused.
        self.instance = self.state.setdefault("instance", secrets.token_hex(16))

    # --- the dashboard -------------------------------------------------------------------

    def request(self, method: str, name: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        # The scheme was checked when the shipper was made: https, or http on loopback.
        request = urllib.request.Request(self.url + name, data=data, method=method, headers={  # noqa: S310
            "Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
            "X-Callproof-Shipper": self.instance, "X-Callproof-Root": str(self.root),
            "X-Callproof-Version": __version__, "User-Agent": f"callproof-ship/{__version__}",
        })  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=self.context) as answer:  # noqa: S310
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            try:
                said = json.loads(error.read() or b"null")
            except ValueError:
                said = None
            if error.code in (401, 403) or (error.code == 409 and "shipping" in str(said)):
                raise ShipRefusedError(f"{error.code}: {(said or {}).get('error', error.reason)}") from None
            return error.code, said

    # --- what was acknowledged -----------------------------------------------------------

    def _hold_state(self) -> None:
        """One shipper per state file: a second one on this host is refused here, at once."""
        import fcntl

        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.state_path.with_name(self.state_path.name + ".lock"), "a")  # noqa: SIM115 - held
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another shipper uses {self.state_path}: one shipper per runs root") from None

    def _load_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_path.read_bytes())
        except (FileNotFoundError, ValueError):
            state = {}
        return state if isinstance(state, dict) and isinstance(state.get("files"), dict) else {"files": {}}

    def _save_state(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        durable.write_durable(self.state_path, json.dumps(self.state, sort_keys=True).encode(), root=None)

    # --- a pass ----------------------------------------------------------------------------

    def ship_once(self) -> PassReport:
        report = PassReport()
        discovery = discover_runs(self.root)
        for run_dir in discovery.runs:
            try:
                report.pushed_bytes += self.ship_run(run_dir, report)
            except OSError as error:
                report.problems.append(f"{run_dir.name}: {error}")
        self.deliver(report)
        return report

    def ship_run(self, run_dir: Path, report: PassReport | None = None) -> int:
        """Send what changed in one run; the bytes sent."""
        items: list[dict[str, Any]] = []
        sent = 0
        ledger_key = f"{run_dir.name}/{protocol.LEDGER_NAME}"
        acknowledged = self.state["files"].get(ledger_key, 0)
        try:
            shorter = (run_dir / protocol.LEDGER_NAME).stat().st_size < acknowledged
        except FileNotFoundError:
            shorter = False
        if shorter and report is not None:
            report.problems.append(f"{run_dir.name}: its ledger is shorter than the dashboard acknowledged "
                                   f"({acknowledged} bytes): rewritten? The dashboard keeps what was "
                                   "shipped")  # fmt: skip
        items.extend(self._ledger_items(run_dir, acknowledged))
        files = list(self._changed_files(run_dir))
        for relative, _ in files:
            items.extend(self._file_items(run_dir, relative))
        batch: list[dict[str, Any]] = []
        for item in items:
            batch.append(item)
            if sum(len(part["data"]) for part in batch) >= CHUNK_BYTES:
                sent += self._push(run_dir.name, batch)
                batch = []
        if batch:
            sent += self._push(run_dir.name, batch)
        for relative, mark in files:
            self.state["files"][f"{run_dir.name}/{relative}"] = mark
        if items:
            self._save_state()
        return sent

    def _push(self, run_id: str, batch: list[dict[str, Any]]) -> int:
        status, said = self.request("POST", "push", {"run_id": run_id, "items": batch})
        if status != 200:
            raise OSError(f"the dashboard refused a push ({status}): {(said or {}).get('error', said)}")
        for item in batch:
            if item["kind"] == "ledger":
                ledger_key = f"{run_id}/{protocol.LEDGER_NAME}"
                self.state["files"][ledger_key] = item["offset"] + len(base64.b64decode(item["data"]))
        self._save_state()
        return sum(len(item["data"]) for item in batch)

    def _ledger_items(self, run_dir: Path, acknowledged: int) -> Iterator[dict[str, Any]]:
        """The ledger's bytes after ``acknowledged``, whole lines, in chunks."""
        try:
            stream = open(run_dir / protocol.LEDGER_NAME, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return
        with stream:
            offset = acknowledged
            stream.seek(offset)
            while chunk := stream.read(CHUNK_BYTES):
                end = chunk.rfind(b"\n") + 1
                if end == 0 and len(chunk) < CHUNK_BYTES:
                    return  # a line still being written: it goes with the next pass
                chunk = chunk[: end or len(chunk)]
                yield {"kind": "ledger", "offset": offset, "sha256": hashlib.sha256(chunk).hexdigest(),
                       "data": base64.b64encode(chunk).decode()}  # fmt: skip
                offset += len(chunk)
                stream.seek(offset)

    def _changed_files(self, run_dir: Path) -> Iterator[tuple[str, list[int]]]:
        """The run's record files whose size, time or inode changed since acknowledged."""
        names = ["steer.json", "state.json"]
        for folder in protocol.RUN_FOLDERS:
            try:
                entries = list(os.scandir(run_dir / folder))
            except (FileNotFoundError, NotADirectoryError):
                continue
            names += [f"{folder}/{entry.name}" for entry in entries
                      if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False)]  # fmt: skip
        for relative in names:
            try:
                facts = os.lstat(run_dir / relative)
            except FileNotFoundError:
                continue
            mark = [facts.st_size, facts.st_mtime_ns, facts.st_ino]
            if facts.st_size <= MAX_JSON_BYTES and self.state["files"].get(f"{run_dir.name}/{relative}") != mark:
                yield relative, mark

    def _file_items(self, run_dir: Path, relative: str) -> Iterator[dict[str, Any]]:
        data = confined.read_file(run_dir / relative, run_dir)
        digest = hashlib.sha256(data).hexdigest()
        for offset in range(0, max(1, len(data)), CHUNK_BYTES):
            chunk = data[offset : offset + CHUNK_BYTES]
            yield {"kind": "file", "path": relative, "offset": offset, "size": len(data), "sha256": digest,
                   "data": base64.b64encode(chunk).decode()}  # fmt: skip

    # --- instructions --------------------------------------------------------------------

    def deliver(self, report: PassReport) -> None:
        """Write the people's decisions about this host's runs, and acknowledge each by id."""
        status, said = self.request("GET", "instructions")
        if status != 200:
            report.problems.append(f"instructions not fetched ({status}): {said}")
            return
        acks = []
        for instruction in said.get("instructions", []):
            outcome, detail = self._apply(instruction)
            acks.append({"id": instruction.get("id"), "outcome": outcome, "detail": detail})
            setattr(report, outcome, getattr(report, outcome) + 1)
        if acks:
            status, said = self.request("POST", "acks", acks)
            if status != 200:
                report.problems.append(f"acknowledgements not taken ({status}): {said}")

    def _apply(self, instruction: dict[str, Any]) -> tuple[str, str]:
        run_id = str(instruction.get("run_id", ""))
        if instruction.get("kind") not in ("decision", "remove") or not protocol.valid_run_id(run_id):
            return "failed", "an instruction this shipper does not know"
        run_dir = self.root / run_id
        if instruction["kind"] == "remove":
            return self._remove(run_dir, str(instruction.get("steer_sha256", "")))
        if not (run_dir / "steer.json").is_file():
            return "failed", f"no run directory {run_id} under {self.root}"
        try:
            confined.not_a_symlink(run_dir)  # before the writer makes anything where it points
        except confined.UnsafePath as unsafe:
            return "refused", str(unsafe)
        try:
            runtime.confirm_call(
                run_dir, str(instruction["call_id"]), resolution=str(instruction["resolution"]),
                reason=str(instruction["reason"]), actor=str(instruction["actor"]),
                receipt_sha256=str(instruction["receipt_sha256"]), confirmed_at=str(instruction["confirmed_at"]),
            )  # fmt: skip
        except runtime.ConfirmationRefused as refused:
            return "refused", runtime.refusal_text(refused)
        except (OSError, ValueError, KeyError) as error:
            return "failed", f"{type(error).__name__}: {error}"[:2000]
        return "delivered", ""

    def _remove(self, run_dir: Path, steer_sha256: str) -> tuple[str, str]:
        """Remove this host's copy of a run the dashboard archived and read back, only while the
        directory still holds that run (its steer.json): another run under its id stays."""
        if run_dir.exists():
            if birth_digest(run_dir) != steer_sha256:
                return "refused", f"{run_dir} holds another run than the one archived (its steer.json differs): kept"
            doomed = run_dir.with_name(f".{run_dir.name}.archived-{os.getpid()}")
            os.replace(run_dir, doomed)  # a dot name first: no reader lists a half-removed run
            durable.fsync_directory(run_dir.parent, None)
            durable.failpoint("ship_after_run_dir_renamed")
        # This removal's renamed copy, and one a shipper killed here before left behind.
        for name in os.listdir(run_dir.parent):
            if name.startswith(f".{run_dir.name}.archived-") and name.rpartition("-")[2].isdigit():
                shutil.rmtree(run_dir.parent / name)
        prefix = f"{run_dir.name}/"
        self.state["files"] = {name: mark for name, mark in self.state["files"].items() if not name.startswith(prefix)}
        self._save_state()
        return "delivered", ""


def run(root: Path, url: str, key: str, *, interval: float, once: bool, state_path: Path | None,
        ca_file: str | None) -> int:  # fmt: skip
    """The shipper's loop: a pass every ``interval`` seconds until SIGTERM or Ctrl-C."""
    shipper = Shipper(root, url, key, state_path=state_path, ca_file=ca_file)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = signal.signal(signal.SIGTERM, stop)
    failed = False
    try:
        while True:
            try:
                report = shipper.ship_once()
            except ShipRefusedError as refused:
                sys.stderr.write(f"error: the dashboard refused this shipper: {refused}\n")
                return 1
            except (OSError, ValueError) as error:  # the network, the dashboard down: the next pass tries again
                failed = True
                sys.stderr.write(f"pass failed{'' if once else f', trying again in {interval:g} s'}: {error}\n")
            else:
                failed = False
                for problem in report.problems:
                    sys.stderr.write(f"{problem}\n")
                if report.delivered or report.refused or report.failed:
                    sys.stderr.write(f"decisions: {report.delivered} delivered, {report.refused} refused, "
                                     f"{report.failed} to try again\n")  # fmt: skip
            if once or stopping:
                break
            deadline = time.monotonic() + interval
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, interval))
            if stopping:
                break
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    # The host's lease is let go: another shipper (this one started again, a --once from a timer)
    # may ship at once; a shipper that ends without saying so is silent after the limit.
    with contextlib.suppress(OSError, ShipRefusedError):
        shipper.request("POST", "stopped", {})
    if not once:
        sys.stderr.write("stopped shipping\n")
    return 1 if once and failed else 0
