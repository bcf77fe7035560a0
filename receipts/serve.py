"""``callproof serve RUNS_ROOT``: the writer as a daemon, the only user that writes the records.

Standard library only. The daemon runs as its own Unix user, owns the run
directories below ``RUNS_ROOT`` and listens on a Unix socket whose owner, group
and mode say who may call it. An agent's runtime keeps its API (``Executor``,
``@receipted``, the adapters, ``callproof call``) and reaches the daemon
through ``receipts.client`` when ``RECEIPTS_WRITER_SOCKET`` is set: the agent's
user needs no write permission on receipts/, the ledger, confirmations/ or
steer.json, and the run's signing key lives only with the daemon.

The effect still runs where the tool runs: the daemon writes the receipt
``prepared``, asks the client to run the effect, and writes ``committed``,
``rejected`` or ``unknown`` from its answer. A client that goes away
mid-call leaves the call as a killed writer would (the next call resumes it);
a daemon killed mid-call leaves it as a killed writer does, and a restarted
daemon finds it in doubt exactly as the writer does.

Who may do what: anyone who can connect may call tools, create task files,
make runs and change a run's state (what an agent's runtime does); only the
daemon's own user, root and the ``--settler`` users may write a person's
decision or pass over a call in doubt (``override_unsettled``, on a call or a
state change): an agent never settles its own call in doubt, nor goes past it.
The kernel says who is connecting (``SO_PEERCRED``), not the client, and the
ledger's ``unsettled_override`` event records that uid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import grp
import json
import os
import pwd
import signal
import socket
import socketserver
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from receipts import client, protocol, runs, runtime
from receipts.tools import NOT_DONE, Evidence, OutcomeUnknown, Rejected

# Below a served run, what only the daemon may write: the records and the folders that hold them.
RECORD_FOLDERS = ("receipts", "submissions", "tasks", "confirmations", protocol.WRITER_DIR)
RECORD_FILES = ("steer.json", "state.json", protocol.LEDGER_NAME)
# What the agent's effects write, given to the agents' group when there is one.
AGENT_WORKSPACE, AGENT_OUTBOX = "workspace", "outbox.jsonl"

DEFAULT_MAX_CLIENTS = 64
# What the messages being read and held may cost (MemoryBudget): a request at the wire's largest
# (13 MiB, half a million values) may cost 180 MiB, so a few of those at once, many small ones.
DEFAULT_MAX_MEMORY = 512 * 1024 * 1024
DEFAULT_ANSWER_TIMEOUT = 3600.0  # how long the daemon waits for a client's effect, holding the call's lock
REQUEST_TIMEOUT = 30.0  # from connecting to a whole request line


class ClientGone(BaseException):
    """The client went away (or did not answer in time) mid-call: the call is left as a kill leaves it."""


class RemoteError(Exception):
    """An adapter's method raised something unforeseen in the client (its type's name kept)."""


class Refused(Exception):  # noqa: N818 - a verdict, said to the client
    pass


@dataclasses.dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return Peer(pid, uid, gid)


def write_problems(run_dir: Path, root: Path, uid: int) -> list[str]:
    """What lets a user other than ``uid`` (and root) change a served run's records: empty when nothing does.

    Every folder from ``root`` down to the run, and the run's record folders and files, must be
    owned by ``uid`` (or root) and writable by nobody else; a symlink or a file of the wrong type
    anywhere there is refused too. The workspace and the outbox are the agents' and not checked.
    """
    problems = []
    chain = [root, *reversed([parent for parent in run_dir.parents if parent.is_relative_to(root) and parent != root])]
    for path, expect_dir, needed in (
        [(folder, True, True) for folder in chain]
        + [(run_dir, True, True)]
        + [(run_dir / name, True, False) for name in RECORD_FOLDERS]
        + [(run_dir / name, False, False) for name in RECORD_FILES]
    ):
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            if needed:
                problems.append(f"{path} does not exist")
            continue
        if stat.S_ISLNK(status.st_mode):
            problems.append(f"{path} is a symlink")
        elif expect_dir != stat.S_ISDIR(status.st_mode) or not (expect_dir or stat.S_ISREG(status.st_mode)):
            problems.append(f"{path} is not a {'folder' if expect_dir else 'regular file'}")
        elif status.st_uid not in (uid, 0):
            problems.append(f"{path} belongs to uid {status.st_uid}, not the writer's ({uid})")
        elif status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problems.append(f"{path} is writable by others (mode {stat.S_IMODE(status.st_mode):04o})")
    return problems


def _open_parents(root: Path, uid: int) -> list[str]:
    """The folders above the root through which someone else could swap it: one writable by
    others (unless sticky, as /tmp is) or owned by a user other than root and the writer."""
    problems = []
    for parent in root.parents:
        status = os.lstat(parent)
        if status.st_uid not in (uid, 0):
            problems.append(f"{parent}, above the root, belongs to uid {status.st_uid}")
        elif status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not status.st_mode & stat.S_ISVTX:
            problems.append(f"{parent}, above the root, is writable by others "
                            f"(mode {stat.S_IMODE(status.st_mode):04o})")  # fmt: skip
    return problems


def give_to_agents(run_dir: Path, gid: int | None) -> None:
    """Make the run's workspace and outbox, the agents' to write (their group's, setgid) when ``gid`` is given."""
    workspace, outbox = run_dir / AGENT_WORKSPACE, run_dir / AGENT_OUTBOX
    workspace.mkdir(exist_ok=True)
    fd = os.open(outbox, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    os.close(fd)
    if gid is None:
        return
    # Readable by all, as the records are: the dashboard shows a person what the target holds.
    for path, mode in ((workspace, 0o2775), (outbox, 0o664)):
        os.chown(path, -1, gid, follow_symlinks=False)
        os.chmod(path, mode)


class _ServedExecutor(runtime.Executor):
    """The writer, for one client: a call made again from inside its own effect is refused, not waited on."""

    under_way: ClassVar[set[tuple[str, str, int]]] = set()
    under_way_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, run_dir: Path, adapters: Mapping[str, Any], peer: Peer) -> None:
        super().__init__(run_dir, adapters, writer_socket="")
        self.peer = peer

    @contextlib.contextmanager
    def _lock(self, call_id: str, key: Any) -> Iterator[Any]:
        mine = (str(self.run_dir), call_id, self.peer.pid)
        with self.under_way_lock:
            if mine in self.under_way:
                raise RuntimeError(
                    f"call {call_id} ({self.run_dir.name}) calls itself with the same arguments from inside its own "
                    "effect: it would wait for ever on its own lock"
                )
            self.under_way.add(mine)
        try:
            with super()._lock(call_id, key) as held:
                yield held
        finally:
            with self.under_way_lock:
                self.under_way.discard(mine)


class _RemoteAdapter:
    """The client's adapter, seen from the daemon: each method is a question over the connection."""

    def __init__(self, conversation: _Conversation, description: Mapping[str, Any]) -> None:
        name, version = description.get("name"), description.get("version")
        if not isinstance(name, str) or not isinstance(version, str) or not name or len(name) > 200:
            raise ValueError("the adapter needs a name and a version (text)")
        self.name, self.version = name, version
        self._conversation = conversation
        self.checks_commits = description.get("checks_commits") is not False
        # The writer asks ``callable(getattr(adapter, "query", None))``: only what the client's adapter has.
        if description.get("can_query") is True:
            self.query = self._query
        if description.get("has_evidence") is True:
            self.evidence = self._evidence

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        value = self._conversation.ask({"ask": "normalise", "args": args})
        if not isinstance(value, dict):
            raise RemoteError(f"normalise gave {type(value).__name__}, not a JSON object")
        return value

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        return self._conversation.ask({"ask": "execute", "args": args, "call_id": call_id})

    def _query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        return self._conversation.ask({"ask": "query", "args": args, "call_id": call_id})

    def _evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        value = self._conversation.ask({"ask": "evidence", "args": args, "call_id": call_id, "result": result})
        if not isinstance(value, dict) or not isinstance(value.get("facts"), list):
            raise RemoteError("the evidence is not a verdict with facts")
        return Evidence(str(value.get("verdict")), tuple(str(fact) for fact in value["facts"]))


class MemoryBudget:
    """What the messages being read and held may cost, at most (``--max-memory``).

    A connection is charged for the bytes it sends as they arrive and for what its message may
    cost to parse (``client.parse_cost``) before it is parsed, and given it all back when it
    ends. A request is refused while the budget is spent (``WriterBusy``: the client sends it
    again a while later), and one that alone would spend more than all of it for good. An answer
    inside a call is always taken: the client's effect may be done, and refusing what it says
    would leave the call in doubt. So the budget bounds everything but those answers, each
    bounded by the wire's own limits."""

    def __init__(self, total: int) -> None:
        self.total, self.spent = total, 0
        self._lock = threading.Lock()

    def take(self, amount: int, *, may_refuse: bool) -> None:
        with self._lock:
            if may_refuse and amount > self.total:
                raise client.MessageRefused(
                    f"a request that may take {amount >> 20} MiB to read is more than the writer's memory budget "
                    f"(--max-memory, {self.total >> 20} MiB)"
                )
            if may_refuse and self.spent + amount > self.total:
                raise client.WriterBusy(
                    f"the writer is busy: its memory budget (--max-memory, {self.total >> 20} MiB) is in use by "
                    "other requests; nothing was done"
                )
            self.spent += amount

    def give(self, amount: int) -> None:
        with self._lock:
            self.spent -= amount


class _DeadlineReader:
    """A connection's lines, each to arrive whole by a deadline (``by``), charged to the
    daemon's memory budget.

    A socket's own timeout bounds each read, not the line: a client that sends a byte
    now and then would hold its connection (and a call's lock) for ever.
    """

    def __init__(self, sock: socket.socket, budget: MemoryBudget) -> None:
        self.sock, self.buffer, self.deadline = sock, bytearray(), 0.0
        self.budget, self.charged = budget, 0
        self.may_refuse = True  # until the request is taken; its answers are always read

    def charge(self, amount: int) -> None:
        self.budget.take(amount, may_refuse=self.may_refuse)
        self.charged += amount

    def release(self) -> None:
        self.budget.give(self.charged)
        self.charged = 0

    def by(self, seconds: float) -> _DeadlineReader:
        self.deadline = time.monotonic() + seconds
        return self

    def readline(self, limit: int) -> bytes:
        searched = 0
        while True:
            end = self.buffer.find(b"\n", searched, limit)
            if end >= 0 or len(self.buffer) >= limit:
                size = end + 1 if end >= 0 else limit
                with memoryview(self.buffer) as view:
                    line = bytes(view[:size])  # one copy, not a slice's and then its bytes'
                del self.buffer[:size]
                return line
            searched = len(self.buffer)
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the line did not arrive whole in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(min(1 << 16, limit - len(self.buffer)))
            if not chunk:
                line = bytes(self.buffer)
                self.buffer.clear()
                return line  # cut short (or empty: closed), as a file's readline says it
            self.charge(2 * len(chunk))  # the buffer, and the line copied out of it
            self.buffer += chunk


class _Conversation:
    def __init__(self, sock: socket.socket, reader: _DeadlineReader, answer_timeout: float) -> None:
        self.sock, self.reader, self.answer_timeout = sock, reader, answer_timeout
        self.callback_raised = False

    def ask(self, question: dict[str, Any]) -> Any:
        try:
            self.sock.settimeout(self.answer_timeout)
            client.send(self.sock, question)
            answer = client.receive(self.reader.by(self.answer_timeout))
        except (OSError, EOFError, ValueError) as error:
            raise ClientGone(str(error)) from None
        if answer.get("not_done") is True:
            return NOT_DONE
        raised = answer.get("raised")
        if raised == "Rejected":
            kind = answer.get("kind")
            raise Rejected(str(answer.get("message")), kind=kind if kind in ("retryable", "permanent") else "permanent")
        if raised == "OutcomeUnknown":
            raise OutcomeUnknown(str(answer.get("message")))
        if raised is not None:
            self.callback_raised = True
            name = str(answer.get("type"))
            # Named as the client's exception, so that a receipt reads as it would have in process.
            error_type = type(name if name.isidentifier() and len(name) <= 80 else "RemoteError", (RemoteError,), {})
            raise error_type(str(answer.get("message")))
        if "answer" not in answer:
            raise ClientGone("the client's answer is none of answer, not_done or raised")
        return answer["answer"]


class WriterDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = False  # a stop lets the calls under way finish
    # Connections not yet taken (socketserver's 5 turned away a burst of clients: EAGAIN).
    request_queue_size = 256
    block_on_close = True

    def __init__(
        self,
        root: Path,
        socket_path: Path,
        *,
        agents_group: str | None = None,
        settlers: tuple[str, ...] = (),
        max_clients: int = DEFAULT_MAX_CLIENTS,
        max_memory: int = DEFAULT_MAX_MEMORY,
        answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.request_timeout = request_timeout
        self.root = Path(os.path.realpath(root))
        self.uid = os.geteuid()
        problems = write_problems(self.root, self.root, self.uid) + _open_parents(self.root, self.uid)
        if problems:
            raise ValueError(f"the runs root is not the writer's alone: {'; '.join(problems)}")
        self.agents_gid = grp.getgrnam(agents_group).gr_gid if agents_group else None
        self.settler_uids = {self.uid, 0} | {_uid_of(name) for name in settlers}
        self.slots = threading.BoundedSemaphore(max_clients)
        self.budget = MemoryBudget(max_memory)
        self.answer_timeout = answer_timeout
        self.socket_path = Path(socket_path)
        self._claim_socket_path()
        super().__init__(str(self.socket_path), _Handler)
        # Who may connect is said by the socket file: the daemon's user, and the agents' group when named.
        if self.agents_gid is not None:
            os.chown(self.socket_path, -1, self.agents_gid)
        os.chmod(self.socket_path, 0o660 if self.agents_gid is not None else 0o600)

    def _claim_socket_path(self) -> None:
        """One daemon per socket: a lock held for the daemon's life, and a dead daemon's socket removed."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._lock_fd = os.open(f"{self.socket_path}.lock", flags, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ValueError(f"another writer daemon serves {self.socket_path}") from None
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                raise ValueError(f"{self.socket_path} exists and is not a socket: not replaced")
            os.unlink(self.socket_path)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        os.close(self._lock_fd)

    def run_dir(self, given: Any) -> Path:
        """The run a client names, refused unless it is below the root with no symlink on the way."""
        if not isinstance(given, str) or not given.startswith("/") or "\x00" in given or len(given) > 4096:
            raise Refused("a run is named by its absolute path")
        path = Path(os.path.normpath(given))
        if not path.is_relative_to(self.root) or path == self.root:
            raise Refused(f"{path} is not a run below {self.root}, which this writer serves")
        if path.parent != self.root:
            # A run is an entry of the root, as the readers find them: a "run" deeper down would be
            # made inside another run (its receipts/ or confirmations/), and be that run's records.
            raise Refused(f"{path} is not a run of {self.root}: a run is a folder of the root itself")
        if os.path.realpath(path) != str(path):
            raise Refused(f"{path} passes through a symlink")
        return path

    def admit(self, run_dir: Path) -> Path:
        problems = write_problems(run_dir, self.root, self.uid)
        if problems:
            raise Refused(f"the run's records are not the writer's alone, so it is not served: {'; '.join(problems)}")
        _close_the_writers_folder(run_dir, self.uid)
        return run_dir


def _close_the_writers_folder(run_dir: Path, uid: int) -> None:
    """The writer's own folder (its locks) opened to nobody else: a run made before it was, or
    by a writer in process, may have it readable by all, and any user who can open a lock file
    can hold the lock (flock works on a read-only handle)."""
    try:
        fd = os.open(run_dir / protocol.WRITER_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # none yet (the writer makes it so), or a symlink the writer refuses to enter
    try:
        facts = os.fstat(fd)
        if facts.st_uid == uid and stat.S_IMODE(facts.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def _uid_of(name: str) -> int:
    return int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid


class _Handler(socketserver.BaseRequestHandler):
    server: WriterDaemon

    def handle(self) -> None:
        sock: socket.socket = self.request
        if not self.server.slots.acquire(blocking=False):
            with contextlib.suppress(OSError, ValueError):
                client.send(sock, {"error": {"type": "WriterBusy", "message": "the writer is busy: too many clients"}})
            return
        try:
            self._serve(sock)
        finally:
            self.server.slots.release()

    def _serve(self, sock: socket.socket) -> None:
        reader = _DeadlineReader(sock, self.server.budget)
        try:
            self._converse(sock, reader)
        finally:
            reader.release()

    def _converse(self, sock: socket.socket, reader: _DeadlineReader) -> None:
        peer = peer_of(sock)
        try:
            message = client.receive(reader.by(self.server.request_timeout))
        except (client.WriterBusy, client.MessageRefused) as refused:
            # Said, so that the client knows it was not taken (and may send a busy one again).
            _log("refused", peer, {}, detail=str(refused))
            reader.release()
            with contextlib.suppress(OSError, ValueError):
                sock.settimeout(self.server.request_timeout)
                client.send(sock, {"error": {"type": type(refused).__name__, "message": str(refused)}})
            return
        except (OSError, EOFError, ValueError):
            return
        reader.may_refuse = False
        conversation = _Conversation(sock, reader, self.server.answer_timeout)
        try:
            reply = self._do(message, peer, conversation)
        except ClientGone as gone:
            _log("client_gone", peer, message, detail=str(gone))
            return
        except Exception as error:  # noqa: BLE001 - said to the client, as the writer in process raises it
            reply = {"error": _error_of(error, conversation)}
            if not isinstance(error, (ValueError, OSError, RuntimeError, Refused, RemoteError)):
                _log("error", peer, message, detail=f"{type(error).__name__}: {error}")
        _log("done", peer, message, detail=str(reply.get("error", {}).get("type", "")))
        with contextlib.suppress(OSError, ValueError):
            sock.settimeout(self.server.request_timeout)
            client.send(sock, reply)

    def _do(self, message: dict[str, Any], peer: Peer, conversation: _Conversation) -> dict[str, Any]:
        op = message.get("op")
        run_dir = self.server.run_dir(message.get("run"))
        if op == "init":
            return {"result": self._init(run_dir, message)}
        run_dir = self.server.admit(run_dir)
        if message.get("override_unsettled") is not None and peer.uid not in self.server.settler_uids:
            # Passing over a call in doubt is a person's decision, as settling one is: the agent's
            # own user could otherwise make an effect again that may already have happened.
            raise Refused(f"uid {peer.uid} may call tools but not pass over a call in doubt: only a settler "
                          "overrides (the daemon's user, root, or a --settler)")  # fmt: skip
        overrider = runs.OVERRIDER.set((peer.uid, _name_of(peer.uid)))
        try:
            return self._do_admitted(op, run_dir, message, peer, conversation)
        finally:
            runs.OVERRIDER.reset(overrider)

    def _do_admitted(
        self, op: Any, run_dir: Path, message: dict[str, Any], peer: Peer, conversation: _Conversation
    ) -> dict[str, Any]:
        if op == "call":
            adapter = _RemoteAdapter(conversation, message.get("adapter") or {})
            executor = _ServedExecutor(run_dir, {adapter.name: adapter}, peer)
            args = message.get("args")
            if not isinstance(args, dict):
                raise ValueError("args must be a JSON object")
            outcome = executor.call(
                adapter.name,
                args,
                attempt=message.get("attempt"),
                identity=message.get("identity"),
                override_unsettled=message.get("override_unsettled"),
            )
            return {"outcome": outcome.as_dict()}
        if op == "write_task":
            submission = message.get("submission_id")
            result = runtime.write_task(run_dir, message.get("request"), submission, writer_socket="")  # type: ignore[arg-type]
            return {"result": result.as_dict()}
        if op == "set_state":
            runtime.run_set_state(
                run_dir,
                # As given: a missing or non-text state is refused by the writer, never written as "None".
                state=message.get("state"),  # type: ignore[arg-type]
                attempts=message.get("attempts"),  # type: ignore[arg-type]
                override_unsettled=message.get("override_unsettled"),
                writer_socket="",
            )
            return {"result": None}
        if op == "confirm":
            if peer.uid not in self.server.settler_uids:
                raise Refused(f"uid {peer.uid} may call tools but not settle a call: only a settler writes a decision")
            fields: dict[str, Any] = {name: message.get(name) for name in ("resolution", "reason", "actor",
                                                                           "receipt_sha256")}  # fmt: skip
            call_id, confirmed_at = str(message.get("call_id")), message.get("confirmed_at")
            if confirmed_at is not None:
                if not isinstance(confirmed_at, str) or len(confirmed_at) > 40:
                    raise ValueError("confirmed_at must be an RFC 3339 time")
                protocol.parse_time(confirmed_at)
            document, written = runtime.confirm_call(
                run_dir, call_id, confirmed_at=confirmed_at, writer_socket="", **fields
            )
            return {"result": {"document": document, "written": written}}
        raise Refused(f"no such request {str(op)[:40]!r}")

    def _init(self, run_dir: Path, message: dict[str, Any]) -> dict[str, Any]:
        # The folders above the new run must already be the writer's alone.
        problems = (
            write_problems(run_dir.parent, self.server.root, self.server.uid)
            if run_dir.parent != (self.server.root)
            else []
        )
        if problems:
            raise Refused(f"not made where others can write: {'; '.join(problems)}")
        runtime.run_init(
            run_dir,
            contract_sha256=str(message.get("contract_sha256")),
            attempts=message.get("attempts", 1),
            state=message.get("state", "running"),
            identity=message.get("identity", protocol.IDENTITY_V2),
            writer_socket="",
        )
        give_to_agents(run_dir, self.server.agents_gid)
        return {"run_dir": str(run_dir)}


def _error_of(error: BaseException, conversation: _Conversation) -> dict[str, Any]:
    if isinstance(error, RemoteError) and conversation.callback_raised:
        return {"type": "callback", "message": str(error)}
    document: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, Refused):
        document["type"] = "refused"
    elif isinstance(error, runtime.ConfirmationRefused):
        document.update(current_receipt_sha256=error.current_receipt_sha256, existing=error.existing)
    elif isinstance(error, runtime.UnsettledCalls):
        document["call_ids"] = error.call_ids
    elif isinstance(error, runtime.RecordingIncomplete):
        outcome = error.outcome
        document.update(outcome=outcome.as_dict() if hasattr(outcome, "as_dict") else None, cause=str(error.cause))
    elif isinstance(error, OSError):
        document["message"] = f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    return document


def _log(event: str, peer: Peer, message: Mapping[str, Any], *, detail: str = "") -> None:
    line = {"event": event, "op": str(message.get("op"))[:40], "run": str(message.get("run"))[:300],
            "peer_uid": peer.uid, "peer_pid": peer.pid, "detail": detail[:500]}  # fmt: skip
    sys.stderr.write(json.dumps(line) + "\n")


def serve(root: Path, socket_path: Path, **options: Any) -> int:
    """Serve until SIGTERM or SIGINT; the calls under way finish first. ``options``: ``WriterDaemon``'s."""
    os.environ.pop(client.SOCKET_ENV, None)  # this process is the writer: nothing it writes goes to a socket
    os.umask(0o022)  # what it makes is the daemon's to write, and everyone's to read
    daemon = WriterDaemon(root, socket_path, **options)

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=daemon.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stderr.write(json.dumps({"event": "serving", "root": str(daemon.root), "socket": str(socket_path),
                                 "uid": daemon.uid}) + "\n")  # fmt: skip
    sys.stderr.flush()
    try:
        daemon.serve_forever(poll_interval=0.2)
    finally:
        daemon.server_close()
    return 0
