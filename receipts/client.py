"""The agent's side of ``callproof serve``: the writer's API, spoken over its Unix socket.

Standard library only. When ``RECEIPTS_WRITER_SOCKET`` names the socket of a
writer daemon (``receipts.serve``), ``Executor.call``, ``confirm_call``,
``run_init``, ``run_set_state`` and ``write_task`` send their request there
instead of writing the run directory themselves: the agent's user then needs no
write permission on receipts, ledger, confirmations or steer.json. The effect
still runs here, where the tool runs: the daemon asks this process to
``normalise`` the arguments, ``execute`` the effect and, when it resumes a
call, to ``query`` the target or show its ``evidence``; it writes the receipts.

The wire: one JSON object per line, UTF-8, each side's lines bounded by
``MAX_MESSAGE_BYTES``. A request is ``{"op": ..., "run": ...}``; the daemon
answers with questions (``{"ask": ...}``) and ends with ``{"outcome": ...}``,
``{"result": ...}`` or ``{"error": {"type": ..., "message": ...}}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import UnsafePath
from receipts.durable import LockBusy, RecordingIncomplete, lock_wait_seconds
from receipts.outcomes import CallOutcome, ConfirmationRefused
from receipts.runs import UnsettledCalls

SOCKET_ENV = "RECEIPTS_WRITER_SOCKET"
# A question or answer carries at most a call's args (4 MiB) or result (8 MiB), each a JSON value
# already, with a little around it.
MAX_MESSAGE_BYTES = protocol.MAX_RESULT_BYTES + protocol.MAX_ARGS_BYTES + 1024 * 1024
# Values, as ``protocol.json_nodes`` counts them: a call's args and its result at their most, and
# room around them. What a message costs to parse is its values, not its bytes.
MAX_MESSAGE_NODES = 2 * protocol.MAX_VALUE_NODES + 10_000
# Connecting, and the daemon's answer to a request with no effect in it (a state change, a decision).
CONNECT_TIMEOUT = 10.0


class WriterUnavailable(ConnectionError):  # noqa: N818 - what the caller is told: the writer is not there
    """The writer daemon could not be reached, or went away before it answered: whether a
    request it had taken was written is for the next call to find (it resumes the call)."""


class CallbackRaised(Exception):  # noqa: N818 - carries what an adapter raised here back to its caller
    pass


def writer_socket() -> str | None:
    """The socket named by ``RECEIPTS_WRITER_SOCKET``, or ``None``: the writer is this process."""
    return os.environ.get(SOCKET_ENV) or None


def send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    data = json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode() + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {len(data)} bytes is more than the writer's wire takes ({MAX_MESSAGE_BYTES})")
    sock.sendall(data)


class MessageRefused(ValueError):  # noqa: N818 - what the client is told, as LockBusy
    """A message the wire does not take (too long, too many values, not a JSON object)."""


class WriterBusy(OSError):  # noqa: N818 - what the client is told, as LockBusy
    """The daemon has no room for a request now (its connections or its memory budget are in
    use): nothing of the request was done, and it may be sent again."""


def receive(reader: Any) -> dict[str, Any]:
    """One message: ``EOFError`` when the other side closed, ``MessageRefused`` (a ``ValueError``)
    when it is not one. Bounded before it is parsed: in bytes, and in values (``json_nodes``);
    a reader with a ``charge`` (the daemon's) is charged what the parse may cost first."""
    line = reader.readline(MAX_MESSAGE_BYTES + 1)
    if not line:
        raise EOFError("the other side closed the connection")
    if len(line) > MAX_MESSAGE_BYTES or not line.endswith(b"\n"):
        raise MessageRefused(f"a message longer than {MAX_MESSAGE_BYTES} bytes, or cut short")
    nodes = protocol.json_nodes(line)
    if nodes > MAX_MESSAGE_NODES:
        raise MessageRefused(f"a message of more than {MAX_MESSAGE_NODES:,} values ({nodes:,}): the wire takes no more")
    charge = getattr(reader, "charge", None)
    if charge is not None:
        charge(parse_cost(len(line), nodes))
    try:
        message = protocol.load_json_strict(line)
    except ValueError as error:
        raise MessageRefused(str(error)) from None
    if not isinstance(message, dict):
        raise MessageRefused("a message must be a JSON object")
    return message


def parse_cost(size: int, nodes: int) -> int:
    """At most what parsing a message of ``size`` bytes and ``nodes`` values takes in memory, and
    keeps while its call goes on: its text decoded (up to 4 bytes a character), the strings parsed
    from it (as much again), and 160 bytes a value (a dict of one key is 100 parsed, a copy
    more). Measured: tests/bench/bench_serve_memory.py."""
    return 8 * size + 160 * nodes


@contextlib.contextmanager
def _connection(path: str) -> Iterator[tuple[socket.socket, Any]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
    except BlockingIOError as error:
        sock.close()
        # The daemon's queue of connections not yet taken is full: busy, nothing was sent.
        raise WriterBusy(f"the writer at {path} is busy: too many clients connecting") from error
    except OSError as error:
        sock.close()
        raise WriterUnavailable(f"the writer at {path} cannot be reached: {error.strerror or error}") from error
    # An effect can take as long as it takes; the daemon bounds its own waits.
    sock.settimeout(None)
    reader = sock.makefile("rb")
    try:
        yield sock, reader
    finally:
        reader.close()
        sock.close()


def request(path: str, op: str, run_dir: Path, tool_adapter: Any = None, /, **fields: Any) -> Any:
    """Send one request and answer the daemon's questions until it says how it ended.

    Returns the ``outcome`` or ``result``; raises what the writer raised in the same
    process (``ValueError``, ``ConfirmationRefused``, ``RecordingIncomplete`` ...), and
    ``WriterUnavailable`` when the daemon cannot be reached or goes away.
    """
    message = {"op": op, "run": str(Path(run_dir).absolute())} | fields
    # Refused before the daemon took it (no connection or memory free): nothing of it was done,
    # so it is sent again, a while later and less often each time, for as long as a writer
    # waits for a lock (RECEIPTS_LOCK_WAIT_SECONDS); then WriterBusy says so.
    deadline = time.monotonic() + lock_wait_seconds()
    pause = 0.05
    while True:
        try:
            return _request_once(path, message, run_dir, tool_adapter)
        except WriterBusy:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(left, pause * (0.5 + random.random())))  # noqa: S311 - jitter, not a secret
            pause = min(pause * 2, 2.0)


def _request_once(path: str, message: dict[str, Any], run_dir: Path, tool_adapter: Any) -> Any:
    raised: list[BaseException] = []

    def gone(error: BaseException) -> WriterUnavailable:
        return WriterUnavailable(f"the writer at {path} went away before it answered ({error})")

    with _connection(path) as (sock, reader):
        try:
            send(sock, message)
        except (BrokenPipeError, ConnectionResetError) as error:
            # The daemon stopped reading before the request was whole: it says why (busy, or a
            # request it does not take) before it closes, and that is what the caller is told.
            try:
                answer = receive(reader)
            except (OSError, EOFError, ValueError):
                raise gone(error) from error
            if "error" in answer:
                raise _rebuilt(answer["error"]) from None
            raise gone(error) from error
        except OSError as error:
            raise gone(error) from error
        try:
            while True:
                answer = receive(reader)
                if "ask" in answer:
                    send(sock, _answer(tool_adapter, answer, Path(run_dir), raised))
                    continue
                break
        except (OSError, EOFError) as error:
            raise gone(error) from error
    if "error" in answer:
        if raised and answer["error"].get("type") == "callback":
            raise raised[-1]  # what the adapter raised here, as the caller would have seen it in process
        raise _rebuilt(answer["error"])
    return answer.get("outcome", answer.get("result"))


def _answer(adapter: Any, question: dict[str, Any], run_dir: Path, raised: list[BaseException]) -> dict[str, Any]:
    """Run one of the adapter's methods here, for the daemon: the effect runs where the tool runs."""
    from receipts.durable import failpoint
    from receipts.tools import NOT_DONE, OutcomeUnknown, Rejected

    ask = question.get("ask")
    args = question.get("args")
    call_id = str(question.get("call_id", ""))
    try:
        if ask == "normalise":
            value: Any = adapter.normalise(args)
        elif ask == "execute":
            value = adapter.execute(run_dir, args, call_id)
            failpoint("after_effect")  # the effect is done here; the daemon has not heard of it yet
        elif ask == "query":
            value = adapter.query(run_dir, args, call_id)
            if value is NOT_DONE:
                return {"not_done": True}
        elif ask == "evidence":
            found = adapter.evidence(run_dir, args, call_id, question.get("result"))
            value = {"verdict": found.verdict, "facts": [str(fact) for fact in found.facts]}
        else:
            return {"raised": "Exception", "type": "ValueError", "message": f"no such question {ask!r}"}
    except Rejected as rejection:
        return {"raised": "Rejected", "message": str(rejection), "kind": rejection.kind}
    except OutcomeUnknown as unknown:
        return {"raised": "OutcomeUnknown", "message": str(unknown)}
    except Exception as error:  # noqa: BLE001 - the writer words it as it would in process
        raised.append(error)
        return {"raised": "Exception", "type": type(error).__name__, "message": str(error)}
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        # The writer in process would find it unrecordable; over the wire it must say so itself.
        return {"raised": "Exception", "type": "TypeError", "message": f"not a JSON value: {error}"}
    problem = protocol.record_value_problem(value, protocol.MAX_RESULT_BYTES) if isinstance(value, dict) else None
    if problem is not None and ask in ("execute", "query"):
        # The wire would refuse it, and the daemon hear nothing of an effect that is done: said
        # instead, so that the call is recorded unknown and a person decides, as in process.
        message = f"the effect is done, and the adapter's result cannot be recorded ({problem}): a person decides"
        return {"raised": "OutcomeUnknown", "message": message}
    return {"answer": value}


def _rebuilt(error: Mapping[str, Any]) -> BaseException:
    """The exception the writer raised in the daemon, as this process would have seen it."""
    kind, message = str(error.get("type")), str(error.get("message"))
    if kind == "ConfirmationRefused":
        existing = error.get("existing")
        return ConfirmationRefused(
            message,
            current_receipt_sha256=str(error.get("current_receipt_sha256") or ""),
            existing=existing if isinstance(existing, dict) else None,
        )
    if kind == "UnsettledCalls":
        return UnsettledCalls(message, [str(call_id) for call_id in error.get("call_ids") or []])
    if kind == "RecordingIncomplete":
        outcome = error.get("outcome")
        done = outcome_of(outcome) if isinstance(outcome, dict) else None
        return RecordingIncomplete(done, ValueError(str(error.get("cause") or message)))
    if kind == "UnsafePath":
        return UnsafePath(message)
    if kind in ("FileExistsError", "FileNotFoundError", "PermissionError"):
        return {"FileExistsError": FileExistsError, "FileNotFoundError": FileNotFoundError,
                "PermissionError": PermissionError}[kind](message)  # fmt: skip
    if kind == "LockBusy":
        return LockBusy(message)
    if kind == "WriterBusy":
        return WriterBusy(message)
    if kind == "MessageRefused":
        return MessageRefused(message)
    if kind == "OSError":
        return OSError(message)
    if kind == "RuntimeError":
        return RuntimeError(message)
    if kind == "refused":
        return PermissionError(message)
    return ValueError(message)


def outcome_of(document: Mapping[str, Any]) -> Any:
    return CallOutcome(
        call_id=str(document.get("call_id", "")),
        status=document.get("status"),
        reused=bool(document.get("reused")),
        result=document.get("result"),
        error=document.get("error"),
        needs=document.get("needs"),
    )


def describe_adapter(adapter: Any) -> dict[str, Any]:
    """What the daemon needs to know of an adapter that runs here."""
    from receipts.tools import adapter_can_query

    return {
        "name": adapter.name,
        "version": adapter.version,
        "can_query": adapter_can_query(adapter),
        "has_evidence": callable(getattr(adapter, "evidence", None)),
        "checks_commits": getattr(adapter, "checks_commits", True) is not False,
    }
