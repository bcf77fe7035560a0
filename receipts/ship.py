"""``callproof ship``: an agent host's runs, sent to the dashboard over HTTPS with the host's key.

Standard library only: a host that ships needs no database credentials and no Django. A pass:

1. puts back what a shipper killed in the middle of removing a run left hidden;
2. tells the dashboard the size of every ledger that changed, so that the server knows how far
   behind the host its mirror is before the pass reaches the run;
3. sends each run's changes: its record files that changed first (a ledger line names files
   already there), then the ledger's new whole lines, in pushes of at most ``BATCH_BYTES``, each
   item with its SHA-256, streamed from the files (memory does not grow with the run);
4. between two pushes, at most ``DECISIONS_EVERY`` seconds apart, and at the end, fetches the
   people's decisions about its runs, writes each through the writer (``runtime.confirm_call``,
   under the call's lock, which re-checks the receipt the person saw) and acknowledges each by
   id; a big run never holds a decision back;
5. removes its copy of each run the dashboard archived, once the dashboard confirms it, just
   before, that no legal hold came in between;
6. says why any run could not be sent, and that the pass ended.

What the dashboard took is kept in a state file (``receipts.ship_state``), so a restarted
shipper goes on where it was. The dashboard takes a push it already holds without writing it
twice, and answers one that does not follow on from its mirror with what it holds: the shipper
goes on from there when its own ledger starts with those bytes, and holds the run back with a
problem the dashboard shows when it does not. One run that cannot be read or is refused never
stops the others. (docs/operations.md, "How the shipper and the server agree".)

The dashboard knows the host by its key (``manage.py host add NAME``), never by a name the
shipper claims, and stamps every time with its own clock.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import ssl
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from receipts import __version__, confined, durable, protocol, runtime
from receipts.reader import MAX_JSON_BYTES, birth_digest, discover_runs
from receipts.ship_state import ARCHIVED, DIVERGED, Mark, RunState, ShipState

CHUNK_BYTES = 384 * 1024  # a ledger or file chunk at most: the server takes 512 KiB an item
# What one push carries at most, base64 as it travels: under nginx's default request limit of 1 MiB.
BATCH_BYTES = 640 * 1024
MAX_ITEMS = 200  # the server's limit of items a push
REPORT_RUNS = 500  # the server's limit of runs a report
TIMEOUT_SECONDS = 60.0
# How long a decision may wait behind the pushes of a pass, at most: fetched between two pushes.
DECISIONS_EVERY = 1.0
# A folder whose time and inode are as they were when a listing saw every file of it sent is not
# listed again; but at least this often (an edit in place changes a file, not its folder), and
# only when its time was this much older than the listing (a rename in the same tick of the file
# system's clock leaves the folder's time as it was).
FULL_LISTING_SECONDS = 3600.0
SETTLE_SECONDS = 2.0
# A run the dashboard refused for a reason that does not heal by itself (another host's run_id,
# another run under its id, a push it cannot read) is sent again this long after, not every pass.
REFUSED_RETRY_SECONDS = 60.0
# What of the ledger the dashboard holds already goes again before its new bytes, for the
# dashboard to compare with its own: a ledger whose tail was rewritten on the host is refused.
LEDGER_OVERLAP = 4096
# The files of a run that cannot be sent, said one by one at most: the rest are counted.
PROBLEMS_SAID = 20


class ShipRefusedError(Exception):
    """The dashboard refused this shipper for good (a key unknown or revoked, another shipper
    with the same key): it stops, and says why."""


class DashboardUnreachableError(OSError):
    """The dashboard did not answer (the network, a proxy, the server down, an answer cut
    short): the pass stops, and the next one tries again from what was acknowledged."""


class _RunRefusedError(Exception):
    """The dashboard refused a push of this run: said (``problem``), the run held back, the
    others go on."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _ResyncError(Exception):
    """The dashboard holds something else than the state said (a push taken whose answer was
    lost, a file it has whole): the state was set right, the run is sent again at once."""


class _PassPausedError(Exception):
    """The dashboard asks this host to wait (its push rate, its quota): no more pushes this pass;
    decisions are still fetched and written."""


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
    return base / f"ship-{hashlib.sha256(str(Path(root).absolute()).encode()).hexdigest()[:16]}.sqlite3"


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass
class _Item:
    """One item of a push, as it travels, and what the state keeps once the dashboard took it."""

    wire: dict[str, Any]
    raw: int  # its bytes, decoded
    ledger_end: int | None = None  # a ledger chunk: where it ends
    path: str = ""  # a file's last chunk (or the file whole): its path and mark
    mark: Mark | None = None

    @classmethod
    def ledger(cls, offset: int, data: bytes) -> _Item:
        wire = {"kind": "ledger", "offset": offset, "sha256": hashlib.sha256(data).hexdigest(),
                "data": base64.b64encode(data).decode()}  # fmt: skip
        return cls(wire, len(data), ledger_end=offset + len(data))

    @classmethod
    def file(cls, path: str, offset: int, size: int, digest: str, data: bytes, mark: Mark | None) -> _Item:
        wire = {"kind": "file", "path": path, "offset": offset, "size": size, "sha256": digest,
                "data": base64.b64encode(data).decode()}  # fmt: skip
        return cls(wire, len(data), path=path if mark is not None else "", mark=mark)


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
        if state_path is None:
            state_path = state_file_for(self.root)
            earlier = state_path.with_suffix(".json")  # an earlier shipper's default: taken over once
            if not state_path.exists() and earlier.exists():
                state_path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(earlier, state_path)
        self.state_path = state_path
        self.context = ssl.create_default_context(cafile=ca_file) if scheme == "https" else None
        self._hold_state()
        self.state = ShipState(self.state_path)
        # Who this shipper is to the dashboard, which lets one shipper per key ship at a time: kept
        # with the state, so that the same shipper started again after a crash is still itself,
        # while a second shipper elsewhere with the same key is another and is refused.
        self.instance = self.state.instance()
        self.interval = 3.0  # set by ``run``: how long a refused run waits at least
        self.decisions_every = DECISIONS_EVERY
        self._report = PassReport()
        self._decisions_at = 0.0  # when decisions were last fetched (time.monotonic())
        self._shipping = ""  # the run being pushed: its removal waits for the end of the pass
        self._listed = b""  # a digest of the runs the last pass listed

    # --- the dashboard -------------------------------------------------------------------

    def request(self, method: str, name: str, body: Any = None) -> tuple[int, Any]:
        """One request: its status and JSON answer. ``DashboardUnreachableError`` when no whole
        answer came; ``ShipRefusedError`` when the dashboard refuses this shipper for good."""
        data = None if body is None else json.dumps(body).encode()
        # The host's clock as the request leaves: the dashboard tells a host whose clock is off.
        # (protocol.utc_now: RECEIPTS_CLOCK sets a host's clock in the tests, as for the writer.)
        # The scheme was checked when the shipper was made: https, or http on loopback.
        request = urllib.request.Request(self.url + name, data=data, method=method, headers={  # noqa: S310
            "Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
            "X-Callproof-Shipper": self.instance, "X-Callproof-Root": str(self.root),
            "X-Callproof-Version": __version__, "User-Agent": f"callproof-ship/{__version__}",
            "X-Callproof-Time": protocol.format_time(protocol.utc_now()),
        })  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=self.context) as answer:  # noqa: S310
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            try:
                said = json.loads(error.read() or b"null")
            except (ValueError, OSError, http.client.HTTPException):
                said = None
            if error.code in (401, 403) or (error.code == 409 and isinstance(said, dict) and said.get("lease")):
                raise ShipRefusedError(f"{error.code}: {(said or {}).get('error', error.reason)}") from None
            if error.code in (502, 503, 504) or not isinstance(said, dict):
                # A proxy's answer that the server is away, or no answer of the dashboard's at all.
                raise DashboardUnreachableError(f"{name}: {error.code} {error.reason}") from None
            return error.code, said
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise DashboardUnreachableError(f"{name}: {type(error).__name__}: {error}") from None

    # --- the state -----------------------------------------------------------------------

    def _hold_state(self) -> None:
        """One shipper per state file: a second one on this host is refused here, at once."""
        import fcntl

        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.state_path.with_name(self.state_path.name + ".lock"), "a")  # noqa: SIM115 - held
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another shipper uses {self.state_path}: one shipper per runs root") from None

    # --- a pass ----------------------------------------------------------------------------

    def ship_once(self) -> PassReport:
        report = self._report = PassReport()
        started = time.monotonic()
        self._put_back_interrupted_removals(report)
        discovery = discover_runs(self.root)
        runs = discovery.runs
        self._report_sizes(runs)
        for run_dir in runs:
            try:
                report.pushed_bytes += self.ship_run(run_dir)
            except (ShipRefusedError, DashboardUnreachableError):
                raise
            except _PassPausedError as paused:
                report.problems.append(str(paused))
                break
            except Exception as error:  # noqa: BLE001 - one run that cannot be read never stops the others
                problem = f"not sent: {type(error).__name__}: {error}"
                self.state.set_problem(run_dir.name, problem)
                report.problems.append(f"{run_dir.name}: {problem}")
        self.deliver(report)
        gone: list[str] = []
        listed = hashlib.sha256("/".join(discovery.names).encode()).digest()
        # The runs under the root changed: forget the gone (not when the root itself is one run).
        if discovery.names and discovery.base == self.root and listed != self._listed:
            gone, self._listed = self.state.forget_all_but(discovery.names), listed
        self._say_problems(gone, pass_seconds=time.monotonic() - started)
        return report

    def ship_run(self, run_dir: Path) -> int:
        """Send what changed in one run; the bytes sent."""
        run_id = run_dir.name
        run = self.state.begin_run(run_id, birth_digest(run_dir))
        if self._held(run, run_dir):
            return 0
        sent = 0
        for _ in range(3):  # a resync sets the state right: the run goes on from there at once
            try:
                sent += self._send_run(run_dir, run)
                return sent
            except _RunRefusedError as refused:
                if refused.problem:
                    self.state.set_problem(run_id, refused.problem)
                    self._report.problems.append(f"{run_id}: {refused.problem}")
                return sent
            except _ResyncError:
                found = self.state.run(run_id)
                assert found is not None
                run = found
        return sent

    def _held(self, run: RunState, run_dir: Path) -> bool:
        """Whether a refusal holds this run back now: a wait not over, or a state of its
        directory that has not changed since (archived; a ledger unlike the dashboard's)."""
        if run.held_until > time.time():
            return True
        if run.held_for == ARCHIVED:
            return True
        if run.held_for.startswith(DIVERGED) and run.held_for == _diverged_mark(run_dir):
            return True
        if run.held_for or run.held_until:
            self.state.hold(run.run_id)
        return False

    def _send_run(self, run_dir: Path, run: RunState) -> int:
        run_id = run_dir.name
        self._shipping = run_id
        problems = _Problems()
        try:
            identity = _identity(run_dir)
            with _open_ledger(run_dir) as ledger:
                facts = os.fstat(ledger) if ledger is not None else None
                size = facts.st_size if facts is not None else 0
                if size < run.ledger:
                    self.state.hold(run_id, held_for=_diverged_mark(run_dir))
                    raise _RunRefusedError(
                        f"its ledger is shorter than the dashboard acknowledged ({run.ledger} bytes): rewritten? "
                        "The dashboard keeps what was shipped; this run is not sent until its ledger changes"
                    )
                end = _whole_lines_end(ledger, run.ledger, size) if ledger is not None else 0
                # The ledger goes again from a little before what the dashboard holds (so that it
                # compares those bytes with its own: a tail rewritten on the host is refused, not
                # spliced), or from its start when the file is another than the one it took.
                replaced = facts is not None and run.ledger_ino not in (0, facts.st_ino)
                start = 0 if replaced else max(0, run.ledger - LEDGER_OVERLAP)
                sender = _Sender(self, run_id, run.generation or "", host_ledger=end, ledger_held=run.ledger,
                                 ledger_ino=facts.st_ino if facts is not None else 0)  # fmt: skip
                listed: list[tuple[str, str, float]] = []
                for item in self._file_items(run_dir, run_id, listed, problems):  # files first: the
                    sender.add(item)  # ledger's new lines name them
                if _identity(run_dir) != identity:
                    # Moved away or replaced while its files were read: its ledger would name files
                    # the mirror does not hold. The next pass sends what is there then.
                    raise _RunRefusedError("the run directory changed while it was sent (moved or replaced): sent "
                                           "again at the next pass")  # fmt: skip
                if ledger is not None and (end > run.ledger or replaced):
                    for item in _ledger_items(ledger, start, end):
                        sender.add(item)
                sender.finish()
            with self.state.saving():
                for folder, mark, listed_at in listed:
                    self.state.folder_listed(run_id, folder, mark, listed_at)
            self.state.set_problem(run_id, problems.said())
            self._report.problems += [f"{run_id}: {problem}" for problem in problems.examples]
            return sender.sent
        finally:
            self._shipping = ""

    def _file_items(
        self, run_dir: Path, run_id: str, listed: list[tuple[str, str, float]], problems: _Problems
    ) -> Iterator[_Item]:
        """The run's record files that changed since the dashboard took them, chunk by chunk; a
        folder whose time and inode did not move since every file of it was taken is not listed
        (``FULL_LISTING_SECONDS``). ``listed``: the folders seen whole, to keep once sent;
        ``problems``: the files that cannot be sent, and why."""
        for relative in ("steer.json", "state.json"):
            yield from self._file_if_changed(run_dir, run_id, relative, None, problems)
        now = time.time()
        for folder in protocol.RUN_FOLDERS:
            try:
                info = os.lstat(run_dir / folder)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                problems.append(f"{folder}/ is a symlink or not a folder: not sent")
                continue
            mark = f"{info.st_mtime_ns}:{info.st_ino}"
            kept = self.state.folder(run_id, folder)
            if kept is not None and kept[0] == mark and now - kept[1] < FULL_LISTING_SECONDS:
                continue
            whole = True
            with os.scandir(run_dir / folder) as entries:
                for count, entry in enumerate(entries):
                    if count % 1000 == 999:
                        self.between_pushes()  # a listing of a million names: decisions do not wait for it
                    if entry.name.startswith("."):
                        continue  # the writer's temp files and locks
                    if not protocol.valid_record_name(entry.name):
                        problems.append(f"{folder}/{_said_name(entry.name)}: a name the dashboard does not take "
                                        "(not UTF-8, or over 255 bytes): not sent")  # fmt: skip
                        whole = False
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        problems.append(f"{folder}/{entry.name} is a symlink or not a file: not sent")
                        whole = False
                        continue
                    whole &= yield from self._file_if_changed(run_dir, run_id, f"{folder}/{entry.name}", entry,
                                                              problems)  # fmt: skip
            if whole and info.st_mtime_ns < (now - SETTLE_SECONDS) * 1e9:
                listed.append((folder, mark, now))

    def _file_if_changed(
        self, run_dir: Path, run_id: str, relative: str, entry: os.DirEntry | None, problems: _Problems
    ) -> Generator[_Item, None, bool]:
        """The file's chunks when it changed since the dashboard took it (a file gone since it
        was listed: nothing); False when it cannot be sent (said in ``problems``)."""
        try:
            facts = entry.stat(follow_symlinks=False) if entry is not None else os.lstat(run_dir / relative)
        except FileNotFoundError:
            return True
        if self.state.file_mark(run_id, relative) == (facts.st_size, facts.st_mtime_ns, facts.st_ino):
            return True
        try:
            fd = confined.open_file(run_dir / relative, run_dir, os.O_RDONLY)
        except FileNotFoundError:
            return True
        except (OSError, ValueError) as error:
            problems.append(f"{relative}: {error}: not sent")
            return False
        with os.fdopen(fd, "rb") as stream:
            opened = os.fstat(fd)  # the mark of the bytes read, not of the name listed
            mark = (opened.st_size, opened.st_mtime_ns, opened.st_ino)
            if opened.st_size > MAX_JSON_BYTES:
                problems.append(f"{relative}: {opened.st_size} bytes, over the {MAX_JSON_BYTES} a record file "
                                "may have: not sent")  # fmt: skip
                return False
            data = stream.read(CHUNK_BYTES + 1)
            if len(data) <= CHUNK_BYTES:
                yield _Item.file(relative, 0, len(data), hashlib.sha256(data).hexdigest(), data, mark)
                return True
            stream.seek(0)
            whole = hashlib.file_digest(stream, "sha256")
            size = stream.tell()
            for offset in range(0, size, CHUNK_BYTES):
                chunk = os.pread(fd, min(CHUNK_BYTES, size - offset), offset)
                last = offset + CHUNK_BYTES >= size
                yield _Item.file(relative, offset, size, whole.hexdigest(), chunk, mark if last else None)
        return True

    # --- what the dashboard is told ------------------------------------------------------

    def _report_sizes(self, runs: list[Path]) -> None:
        """The size of each ledger that changed since the dashboard was last told (the whole
        lines of it): the server then knows how far behind the host its mirror is."""
        entries: list[tuple[str, int, dict[str, Any]]] = []
        for run_dir in runs:
            try:
                size = os.lstat(run_dir / protocol.LEDGER_NAME).st_size
            except OSError:
                continue
            known = self.state.run(run_dir.name)
            if known is not None and known.reported == size:
                continue
            generation = birth_digest(run_dir)
            with contextlib.suppress(OSError, ValueError), _open_ledger(run_dir) as ledger:
                if ledger is not None:
                    whole = _whole_lines_end(ledger, 0, os.fstat(ledger).st_size)
                    entries.append((generation, size, {"run_id": run_dir.name, "generation": generation,
                                                       "ledger_size": whole}))  # fmt: skip
            if len(entries) >= REPORT_RUNS:
                self._send_sizes(entries)
                entries = []
        if entries:
            self._send_sizes(entries)

    def _send_sizes(self, entries: list[tuple[str, int, dict[str, Any]]]) -> None:
        status, said = self.request("POST", "report", {"runs": [entry for _, _, entry in entries]})
        if status != 200:
            self._report.problems.append(f"the ledgers' sizes not taken ({status}): {(said or {}).get('error')}")
            return
        durable.failpoint("ship_before_sizes_saved")
        for generation, size, entry in entries:
            self.state.begin_run(entry["run_id"], generation)  # the run as it is now: a new one starts afresh
            self.state.reported(entry["run_id"], size)

    def _say_problems(self, gone: list[str], *, pass_seconds: float) -> None:
        """Why each run that cannot be sent cannot (and that it can again, once it can), the runs
        gone from the root (nothing of them is behind any more), then that the pass ended and how
        long it took: the dashboard shows them, and raises a run that stays so."""
        told = self.state.problems_to_say()
        entries: list[dict[str, Any]] = [
            {"run_id": run.run_id, "generation": run.generation or "", "problem": run.problem} for run in told
        ]
        entries += [{"run_id": run_id, "gone": True} for run_id in gone]
        for start in range(0, max(1, len(entries)), REPORT_RUNS):
            last = start + REPORT_RUNS >= len(entries)
            body: dict[str, Any] = {"runs": entries[start : start + REPORT_RUNS]}
            if last:
                body["pass_seconds"] = round(pass_seconds, 3)
            status, _ = self.request("POST", "report", body)
            if status == 200:
                with self.state.saving():
                    for run in told[start : start + REPORT_RUNS]:
                        self.state.problem_said(run.run_id, run.problem)

    def refused(self, run_id: str, status: int, said: dict[str, Any]) -> None:
        """What a refused push of ``run_id`` means, as the exception that says what to do next."""
        error = str(said.get("error", ""))[:500]
        if status == 409 and isinstance(said.get("ledger_size"), int):
            self._resync_ledger(run_id, said["ledger_size"], str(said.get("ledger_sha256", "")), error)
        if status == 409 and "part_size" in said:
            raise _ResyncError  # the file goes again from its first chunk
        if status == 410:
            self.state.hold(run_id, held_for=ARCHIVED)  # its removal comes as an instruction
            raise _RunRefusedError("")
        wait = said.get("retry_after")
        wait = float(wait) if isinstance(wait, int | float) and 0 < wait <= 3600 else REFUSED_RETRY_SECONDS
        if status == 429 and said.get("bound") == "new_runs":
            # This run waits to start; the runs already shipping go on.
            self.state.hold(run_id, until=time.time() + wait)
            raise _RunRefusedError(f"waits ({status}): {error}")
        if status in (429, 507):
            raise _PassPausedError(f"the dashboard asks this host to wait ({status}): {error} (again in {wait:g} s)")
        self.state.hold(run_id, until=time.time() + max(REFUSED_RETRY_SECONDS, self.interval))
        raise _RunRefusedError(f"the dashboard refused it ({status}): {error}")

    def _resync_ledger(self, run_id: str, held: int, held_sha256: str, error: str) -> None:
        """The dashboard's mirror holds ``held`` bytes of the ledger: go on from there when this
        host's ledger starts with them; otherwise hold the run back, and say why."""
        run_dir = self.root / run_id
        with _open_ledger(run_dir) as ledger:
            ours = _prefix_digest(ledger, held) if ledger is not None else None
        if ours is not None and ours == held_sha256:
            self.state.resume_ledger_at(run_id, held)
            raise _ResyncError
        self.state.hold(run_id, held_for=_diverged_mark(run_dir))
        raise _RunRefusedError(
            f"the dashboard's copy of its ledger ({held} bytes) is not the start of this host's ledger "
            f"({error}): the host's ledger was rewritten, or another run took its id; nothing more of it "
            "is sent until its ledger changes"
        )

    # --- instructions --------------------------------------------------------------------

    def between_pushes(self) -> None:
        """Decisions never wait behind a big run: fetched and written between two pushes, at
        most ``DECISIONS_EVERY`` seconds apart (removals wait for the end of the pass)."""
        if time.monotonic() - self._decisions_at >= self.decisions_every:
            self.deliver(self._report, removals=False)

    def deliver(self, report: PassReport, *, removals: bool = True) -> None:
        """Write the people's decisions about this host's runs, and acknowledge each by id."""
        self._decisions_at = time.monotonic()
        status, said = self.request("GET", "instructions")
        if status != 200:
            report.problems.append(f"instructions not fetched ({status}): {said}")
            return
        acks = []
        listed = said.get("instructions") if isinstance(said, dict) else None
        for instruction in listed if isinstance(listed, list) else []:
            if not isinstance(instruction, dict):
                continue
            if instruction.get("kind") == "remove" and (not removals or instruction.get("run_id") == self._shipping):
                continue  # not acknowledged: asked again at the end of the pass
            outcome, detail = self._apply(instruction)
            acks.append({"id": instruction.get("id"), "outcome": outcome, "detail": detail})
            setattr(report, outcome, getattr(report, outcome) + 1)
        if acks:
            durable.failpoint("ship_before_acks_sent")  # written into the runs, not yet acknowledged
        for start in range(0, len(acks), MAX_ITEMS):  # the dashboard takes so many at a time
            status, said = self.request("POST", "acks", acks[start : start + MAX_ITEMS])
            if status != 200:
                report.problems.append(f"acknowledgements not taken ({status}): {said}")

    def _apply(self, instruction: dict[str, Any]) -> tuple[str, str]:
        run_id = str(instruction.get("run_id", ""))
        if instruction.get("kind") not in ("decision", "remove") or not protocol.valid_run_id(run_id):
            return "failed", "an instruction this shipper does not know"
        run_dir = self.root / run_id
        if instruction["kind"] == "remove":
            return self._remove(run_dir, instruction)
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

    def _remove(self, run_dir: Path, instruction: dict[str, Any]) -> tuple[str, str]:
        """Remove this host's copy of a run the dashboard archived and read back, only while the
        directory still holds that run (its steer.json), and only once the dashboard confirms,
        just before, that no legal hold came in between: the copy is renamed out of the
        readers' way first, put back when the dashboard says keep it (or does not answer)."""
        steer_sha256 = str(instruction.get("steer_sha256", ""))
        hidden = None
        if os.path.lexists(run_dir):
            try:
                confined.not_a_symlink(run_dir)
            except confined.UnsafePath as unsafe:
                return "refused", str(unsafe)
            if birth_digest(run_dir) != steer_sha256:
                return "refused", f"{run_dir} holds another run than the one archived (its steer.json differs): kept"
            hidden = run_dir.with_name(f".{run_dir.name}.removing-{os.getpid()}")
            os.replace(run_dir, hidden)  # a dot name first: no reader lists a half-removed run
            durable.fsync_directory(run_dir.parent, None)
            if birth_digest(hidden) != steer_sha256:  # swapped between the look and the rename
                _put_back(hidden, run_dir)
                return "refused", f"{run_dir} holds another run than the one archived (its steer.json differs): kept"
            durable.failpoint("ship_after_run_dir_renamed")
        try:
            status, said = self.request("POST", "removal", {"id": instruction.get("id"), "steer_sha256": steer_sha256})
        except BaseException:
            _put_back(hidden, run_dir)
            raise
        said = said if isinstance(said, dict) else {}
        if status != 200 or said.get("remove") is not True:
            _put_back(hidden, run_dir)
            return "failed", f"kept: {said.get('why') or said.get('error') or status}"
        if hidden is not None:
            gone = hidden.with_name(f".{run_dir.name}.removed-{os.getpid()}")
            os.replace(hidden, gone)  # confirmed: whatever happens now, it goes
            durable.fsync_directory(run_dir.parent, None)
            durable.failpoint("ship_after_removal_confirmed")
            shutil.rmtree(gone)
        self.state.forget(run_dir.name)
        return "delivered", ""

    def _put_back_interrupted_removals(self, report: PassReport) -> None:
        """A copy a shipper killed before the dashboard confirmed its removal goes back where it
        was (the instruction comes again if the removal still stands); one killed after is removed."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            found = _INTERRUPTED.fullmatch(name)
            if found is None or not protocol.valid_run_id(found["run_id"]):
                continue
            path, original = self.root / name, self.root / found["run_id"]
            if found["step"] == "removed":
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(original):
                report.problems.append(f"{name}: a copy of run {found['run_id']} whose removal was cut short, beside "
                                       "a new run under its id: kept as it is")  # fmt: skip
            else:
                os.replace(path, original)
                durable.fsync_directory(self.root, None)


class _Problems:
    """Why files of a run cannot be sent: the first ``PROBLEMS_SAID`` as they are, the rest
    counted (a run of a million symlinks holds no million sentences in memory)."""

    def __init__(self) -> None:
        self.examples: list[str] = []
        self.more = 0

    def append(self, problem: str) -> None:
        if len(self.examples) < PROBLEMS_SAID:
            self.examples.append(problem)
        else:
            self.more += 1

    def said(self) -> str:
        """What the dashboard is told: the first few, and how many more."""
        text = "; ".join(self.examples[:5])
        hidden = len(self.examples) - 5 + self.more if len(self.examples) > 5 else self.more
        return f"{text}; and {hidden} more" if hidden > 0 else text


def _said_name(name: str) -> str:
    """A file name as text a message can carry: bytes that are not UTF-8 as escapes."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _identity(run_dir: Path) -> tuple[int, ...]:
    """Which directory ``run_dir`` is (its device and inode), and which steer.json it holds (its
    inode, size and time: ``init`` writes it once): two ``lstat`` calls, no read."""
    found: tuple[int, ...] = ()
    for path in (run_dir, run_dir / "steer.json"):
        try:
            facts = os.lstat(path)
        except OSError:
            found += (0, 0, 0, 0)
            continue
        found += (facts.st_dev, facts.st_ino, facts.st_size, facts.st_mtime_ns)
    return found


# What a removal cut short leaves: renamed, not yet confirmed; or confirmed, not yet removed.
_INTERRUPTED = re.compile(r"\.(?P<run_id>.+)\.(?P<step>removing|removed)-[0-9]+")


def _put_back(hidden: Path | None, run_dir: Path) -> None:
    if hidden is not None and not os.path.lexists(run_dir):
        os.replace(hidden, run_dir)
        durable.fsync_directory(run_dir.parent, None)


class _Sender:
    """A run's items, in pushes: a push goes when the next item would not fit in it; the last
    one says no more follow (``more``: the importer leaves a run until its last push of a pass)."""

    def __init__(
        self, shipper: Shipper, run_id: str, generation: str, *, host_ledger: int, ledger_held: int, ledger_ino: int
    ) -> None:
        self.shipper, self.run_id, self.generation, self.host_ledger = shipper, run_id, generation, host_ledger
        self.ledger_held, self.ledger_ino = ledger_held, ledger_ino
        self.batch: list[_Item] = []
        self.encoded = 0
        self.sent = 0

    def add(self, item: _Item) -> None:
        size = len(item.wire["data"])
        if self.batch and (self.encoded + size > BATCH_BYTES or len(self.batch) >= MAX_ITEMS):
            self._push(more=True)
        self.batch.append(item)
        self.encoded += size

    def finish(self) -> None:
        if self.batch:
            self._push(more=False)

    def _push(self, *, more: bool) -> None:
        # ``ledger_held``: what the dashboard took of the ledger, as this host knows it (a mirror
        # that lost some of the run says so, and the run goes again whole).
        body = {"run_id": self.run_id, "generation": self.generation, "ledger_size": self.host_ledger, "more": more,
                "ledger_held": self.ledger_held, "items": [item.wire for item in self.batch]}  # fmt: skip
        status, said = self.shipper.request("POST", "push", body)
        if status != 200:
            self.shipper.refused(self.run_id, status, said)
        durable.failpoint("ship_before_push_saved")  # the dashboard took it; this host does not know yet
        ends = [item.ledger_end for item in self.batch if item.ledger_end is not None]
        if ends:
            self.ledger_held = max(self.ledger_held, *ends)
        files = [(item.path, item.mark) for item in self.batch if item.mark is not None]
        self.shipper.state.acknowledged(self.run_id, ledger=max(ends) if ends else None, files=files,
                                        ledger_ino=self.ledger_ino)  # fmt: skip
        durable.failpoint("ship_after_push_acknowledged")
        self.sent += sum(item.raw for item in self.batch)
        self.batch, self.encoded = [], 0
        self.shipper.between_pushes()


# --- the ledger ------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_ledger(run_dir: Path) -> Iterator[int | None]:
    """The run's ledger, read-only, never through a symlink; None when it has none yet."""
    try:
        fd = confined.open_file(run_dir / protocol.LEDGER_NAME, run_dir, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _diverged_mark(run_dir: Path) -> str:
    """The ledger as it is now (size, time, inode): a run held back for it waits until it changes."""
    try:
        facts = os.lstat(run_dir / protocol.LEDGER_NAME)
    except OSError:
        return f"{DIVERGED}:none"
    return f"{DIVERGED}:{facts.st_size}:{facts.st_mtime_ns}:{facts.st_ino}"


def _whole_lines_end(fd: int, start: int, size: int) -> int:
    """Where the ledger's whole lines end, from ``start``: a line still being written goes with
    a later pass; one longer than a chunk goes by whole chunks."""
    if size <= start or os.pread(fd, 1, size - 1) == b"\n":
        return max(size, start)
    position = size
    while position > start:
        block_start = max(start, position - 65536)
        found = os.pread(fd, position - block_start, block_start).rfind(b"\n")
        if found >= 0:
            return block_start + found + 1
        position = block_start
    return start + (size - start) // CHUNK_BYTES * CHUNK_BYTES


def _ledger_items(fd: int, start: int, end: int) -> Iterator[_Item]:
    """The ledger's bytes from ``start`` to ``end``, in chunks of whole lines."""
    offset = start
    while offset < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - offset), offset)
        if not chunk:
            return  # cut shorter since it was measured: the next pass says so
        chunk = chunk[: chunk.rfind(b"\n") + 1 or len(chunk)]
        yield _Item.ledger(offset, chunk)
        offset += len(chunk)


def _prefix_digest(fd: int, length: int) -> str | None:
    """The SHA-256 of the ledger's first ``length`` bytes; None when it is shorter."""
    if os.fstat(fd).st_size < length:
        return None
    digest, offset = hashlib.sha256(), 0
    while offset < length:
        block = os.pread(fd, min(1 << 20, length - offset), offset)
        if not block:
            return None
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def run(root: Path, url: str, key: str, *, interval: float, once: bool, state_path: Path | None,
        ca_file: str | None, decisions_every: float = DECISIONS_EVERY) -> int:  # fmt: skip
    """The shipper's loop: a pass every ``interval`` seconds until SIGTERM or Ctrl-C."""
    shipper = Shipper(root, url, key, state_path=state_path, ca_file=ca_file)
    shipper.interval, shipper.decisions_every = interval, decisions_every
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
