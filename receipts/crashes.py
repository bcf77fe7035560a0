"""What a killed writer left on disk, and killing one at a window: shared by the kill harnesses.

Standard library only. ``tests/torture.py`` (random SIGKILLs of the built-in
tools) and the conformance kit (``receipts.conformance``, any adapter) both
name where a kill left a call from the files alone, and check the ledger's
chain over its complete lines. The kit also stops a writer at one of its
failpoints and SIGKILLs it there: a real kill, at a window somebody chose.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from receipts import protocol

# Where a kill can leave a call, in the order the write passes them, each told by what the disk
# shows (docs/KILL_TESTING.md says what each one is). A temp receipt counts only when the killed
# process left it: its pid is in the name.
CALL_WINDOWS = (
    "before_receipt",
    "temp_receipt_prepared",
    "prepared_without_event",
    "prepared_no_effect",
    "effect_done_receipt_prepared",
    "temp_receipt_committed",
    "committed_without_event",
    "recorded_note_left",
    "recorded",
)
# The windows where the effect exists and its record does not yet say so: the ones a kill test exists for.
CALL_EFFECT_DONE_UNRECORDED = frozenset({"effect_done_receipt_prepared", "temp_receipt_committed",
                                         "committed_without_event"})  # fmt: skip
# The writer's failpoints of a call, in the order it passes them (RECEIPTS_FAILPOINT).
CALL_FAILPOINTS = ("after_prepared_temp", "after_prepared", "after_effect", "after_temp_receipt", "after_commit_rename")


def json_or_none(path: Path) -> Any:
    """A JSON file as it is now: ``None`` when absent, ``{"unreadable": True}`` when torn."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return {"unreadable": True}


def bytes_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def ledger_events(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The complete lines' events and what breaks the chain among them.

    A last line without its newline is a kill mid-append (the writer cuts it at
    the next append): never an event, never a break. tests/ledger.py is the
    strict form, for ledgers no kill has touched.
    """
    try:
        data = (run_dir / protocol.LEDGER_NAME).read_bytes()
    except FileNotFoundError:
        return [], ["events.jsonl is gone"]
    complete = data[: data.rfind(b"\n") + 1]
    events, problems, previous = [], [], protocol.ZERO_HASH
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            event = json.loads(line)
        except ValueError:
            problems.append(f"ledger line {number} is not JSON: {line[:80]!r}")
            break
        if not isinstance(event, dict) or event.get("seq") != number:
            problems.append(f"ledger line {number} has seq {event.get('seq') if isinstance(event, dict) else None}")
            break
        if event.get("prev_sha256") != previous:
            problems.append(f"ledger line {number}: prev_sha256 is not the digest of line {number - 1}")
            break
        previous = hashlib.sha256(line).hexdigest()
        events.append(event)
    return events, problems


def call_window(run_dir: Path, call_id: str, killed_pids: set[int], effect_present: Callable[[], bool]) -> str:
    """Where a kill left the call ``call_id``, from the files alone (one of ``CALL_WINDOWS``).

    ``effect_present`` tells whether the target holds the call's effect: the
    only part that depends on the tool.
    """
    receipts = run_dir / "receipts"
    receipt = json_or_none(receipts / f"{call_id}.json")
    temp_statuses = {
        str((json_or_none(temp) or {}).get("status"))
        for temp in receipts.glob(f".{call_id}.json.*.tmp")
        if int(temp.name.split(".")[3]) in killed_pids
    }
    if not isinstance(receipt, dict):
        return "temp_receipt_prepared" if temp_statuses else "before_receipt"
    events, _ = ledger_events(run_dir)
    recorded = {
        event.get("status") for event in events if event.get("type") == "receipt" and event.get("call_id") == call_id
    }
    status = receipt.get("status")
    if status == "prepared":
        if "committed" in temp_statuses:
            return "temp_receipt_committed"
        if effect_present():
            return "effect_done_receipt_prepared"
        return "prepared_no_effect" if "prepared" in recorded else "prepared_without_event"
    if status == "committed":
        if "committed" not in recorded:
            return "committed_without_event"
        # The lock file keeps {"installed": true} for good; a note that still names the
        # receipt being installed is the one a kill left before its event was cleared.
        lock = run_dir / protocol.WRITER_DIR / f"call-{call_id}.lock"
        return "recorded_note_left" if b'"receipt"' in bytes_or_empty(lock) else "recorded"
    return f"receipt_{status}"


def kill_at_failpoint(child: subprocess.Popen, timeout: float) -> str:
    """SIGKILL ``child`` where it stopped itself (``RECEIPTS_FAILPOINT=NAME:stop``).

    Returns ``"killed"`` when it was stopped there and is now dead of SIGKILL,
    ``"exited"`` when it ended without reaching the failpoint (a reuse passes
    none), ``"hung"`` when neither came within ``timeout`` seconds (it is killed).
    """
    deadline = time.monotonic() + timeout
    while True:
        # WNOWAIT: only look, so that Popen still reaps the child and learns its exit.
        state = os.waitid(os.P_PID, child.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if state is not None and state.si_pid == child.pid:
            if state.si_code == os.CLD_STOPPED:
                child.send_signal(signal.SIGKILL)
                return "killed" if child.wait() == -signal.SIGKILL else "exited"
            child.wait()
            return "exited"
        if time.monotonic() > deadline:
            child.kill()
            child.wait()
            return "hung"
        time.sleep(0.002)
