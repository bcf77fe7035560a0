"""The kit's child processes: each step runs as ``python -m receipts.conformance REQUEST``, so a
kill is a real kill of a real process; ``Child`` is the kit's side, ``child_main`` the child's."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import runtime
from receipts.conformance.loading import load_adapter
from receipts.conformance.report import KitError
from receipts.tools import NOT_DONE, OutcomeUnknown

STEP_TIMEOUT = 60.0


@dataclasses.dataclass
class Ended:
    """One child as it ended."""

    pid: int
    returncode: int
    output: dict[str, Any]
    stderr: str
    killed: bool = False
    hung: bool = False

    def describe(self) -> str:
        if self.hung:
            return f"hung past {STEP_TIMEOUT:.0f} s"
        if self.killed:
            return "killed"
        said = self.output.get("error") or self.output.get("status")
        if isinstance(said, dict):
            said = said.get("message")
        extra = f", needs {self.output['needs']}" if self.output.get("needs") else ""
        reused = ", reused" if self.output.get("reused") else ""
        tail = "" if self.output else f": {self.stderr.strip()[-300:]!r}"
        words = f"{said or ''}{reused}{extra}".strip(", ")
        return f"exit {self.returncode}" + (f" ({words})" if words else "") + tail

    @property
    def committed(self) -> bool:
        return self.returncode == 0 and self.output.get("status") == "committed" and not self.output.get("needs")

    @property
    def awaiting(self) -> bool:
        return self.returncode == 4 and self.output.get("needs") == "confirmation"


class Child:
    """``python -m receipts.conformance REQUEST``: prints ``ready`` once the adapter is loaded, then one JSON line."""

    def __init__(self, request: dict[str, Any], env: Mapping[str, str]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "receipts.conformance", json.dumps(request)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
        )
        self.early = b""
        self.ready_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self) -> bool:
        """Block until the child says ready (its adapter loaded); ``False`` when it ended first."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + STEP_TIMEOUT
        while b"\n" not in self.early and time.monotonic() < deadline:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self.early += chunk
        self.ready_at = time.monotonic()
        return self.early.startswith(b"ready\n")

    def go(self) -> None:
        assert self.popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.popen.stdin.write(b"go\n")
            self.popen.stdin.flush()

    def end(self, *, killed: bool = False) -> Ended:
        hung = False
        try:
            stdout, stderr = self.popen.communicate(timeout=STEP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            stdout, stderr = self.popen.communicate()
            hung = True
        lines = (self.early + stdout).decode(errors="replace").splitlines()
        try:
            output = json.loads(lines[-1]) if lines and lines[-1] != "ready" else {}
        except ValueError:
            output = {}
        killed = killed or self.popen.returncode == -signal.SIGKILL
        return Ended(self.pid, self.popen.returncode, output if isinstance(output, dict) else {},
                     stderr.decode(errors="replace"), killed, hung)  # fmt: skip


def child_main(request: dict[str, Any]) -> int:
    """One step in a child process: a call through the writer, the adapter's execute alone, or
    several steps beneath the writer at once (``steps``: execute, query, the clock moved on)."""
    try:
        adapter = load_adapter(request["adapter"])
    except KitError as error:
        _say({"error": str(error)})
        return 1
    if request.get("break_target"):
        try:
            adapter.break_target()
        except Exception as error:  # noqa: BLE001 - said to the kit, which judges it
            _say({"error": f"break_target() raised {type(error).__name__}: {error}"})
            return 1
    if request.get("lose_response"):
        adapter = _AnswerLost(adapter)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if request.get("wait_for_go"):
        sys.stdin.readline()
    if request["mode"] == "normalise":
        _say({"normalised": [_normalised_or_refusal(adapter, args) for args in request["args_list"]]})
        return 0
    run_dir = Path(request["run_dir"])
    if request["mode"] == "steps":
        steps = [_step(adapter, run_dir, {"args": request["args"], "call_id": request.get("call_id"), **step})
                 for step in request["steps"]]  # fmt: skip
        _say({"steps": steps})
        return 0
    if request["mode"] == "execute":
        said = _step(adapter, run_dir, {"do": "execute", "args": request["args"], "call_id": request["call_id"]})
        _say(said)
        return 3 if "error" in said else 0
    try:
        outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, request["args"])
    except runtime.RecordingIncomplete as incomplete:
        _say(incomplete.outcome.as_dict() | {"recording_incomplete": str(incomplete.cause)})
        return 5
    except (ValueError, OSError) as error:
        _say({"error": f"{type(error).__name__}: {error}"})
        return 1
    _say(outcome.as_dict())
    if outcome.needs:
        return 4
    return 0 if outcome.status == "committed" else 3


def _step(adapter: Any, run_dir: Path, step: Mapping[str, Any]) -> dict[str, Any]:
    """One step beneath the writer, in this process: ``execute`` or ``query`` of a call, or ``clock``,
    which moves the writer's clock (``RECEIPTS_CLOCK``, read by ``protocol.utc_now``) to ``at``."""
    if step["do"] == "clock":
        os.environ["RECEIPTS_CLOCK"] = step["at"]
        return {"clock": step["at"]}
    args = adapter.normalise(step["args"])
    if step["do"] == "query":
        try:
            answer = adapter.query(run_dir, args, step["call_id"])
        except Exception as error:  # noqa: BLE001 - the writer counts any failure as "cannot tell"
            return {"answer": "cannot tell", "why": f"{type(error).__name__}: {error}"}
        if answer is NOT_DONE:
            return {"answer": "NOT_DONE"}
        return {"answer": "result", "result": answer} if isinstance(answer, dict) else {"answer": "cannot tell"}
    try:
        return {"result": adapter.execute(run_dir, args, step["call_id"])}
    except Exception as error:  # noqa: BLE001 - said to the kit, which judges it
        return {"error": f"{type(error).__name__}: {error}"}


def _normalised_or_refusal(adapter: Any, args: Any) -> Any:
    try:
        return adapter.normalise(args)
    except Exception as error:  # noqa: BLE001 - compared with the kit's own attempt
        return {"refused": type(error).__name__}


def _say(document: Any) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


class _AnswerLost:
    """The adapter, whose answer is lost after the effect (a timeout after sending): ``OutcomeUnknown``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        self._inner.execute(run_dir, args, call_id)
        raise OutcomeUnknown("the conformance kit dropped the answer after the effect (a lost response)")
