"""Random SIGKILLs of the real writer, with the invariants checked from the disk after every one.

Each trial is one intent (a ``write_file`` or ``send_message`` call, or a
``write-task`` with a submission id) in a fresh run directory: the real
``python -m receipts`` is started, killed with SIGKILL at a random moment after
it first touches the run directory, 1 to 4 times in a row, then run once more to
completion. The concurrent mode starts four writers of the same intent at once
and kills random ones. After every step the files on disk must keep the
promises of docs/RUN_DIRECTORY.md; docs/KILL_TESTING.md lists them.

    python -m tests.torture --trials 1000 [--tools write_file send_message write-task] [--workers K] [--seed S]

Kill times are real time, so a seed fixes the plan (how many kills, their
delays, which writers) but not to the microsecond where each one lands: the
table says where they did land, from what the disk showed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evidence.lib.inotify import CHANGE_EVENTS, IN_CREATE, IN_MOVED_TO, IN_OPEN, inotify_watch, read_inotify_events
from receipts import protocol, runtime
from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.changes import open_tree, planned_manifest, tree_digest
from receipts.crashes import (
    CALL_EFFECT_DONE_UNRECORDED,
    CALL_WINDOWS,
    call_window,
    json_or_none,
    ledger_events,
)
from receipts.demo import login_request, writer_command, writer_env
from receipts.reader import read_run
from receipts.replay import replay_run

CONTRACT = protocol.sha256_hex(b"torture contract")
TOOLS = ("write_file", "send_message", "write-task", "apply_changes", "apply_changes-git")
# The harness's apply_changes modes, by the args' mode: the same tool, a tree of each layout.
APPLY_MODES = {"apply_changes": "content", "apply_changes-git": "git"}
FILE_ARGS = {"path": "notes/kill.txt", "content": "written once, whatever the kills\n"}
MESSAGE_ARGS = {"to": "ops@example.com", "body": "sent once, whatever the kills"}
SUBMISSION_ID = "torture-submission"
# apply_changes: a tree made before the trial (the version the call starts from), then one call that
# changes a file, removes one and adds one. A reader process looks at the tree throughout.
TREE = "site"
TREE_BEFORE = [
    {"path": "index.html", "content": "<h1>v0</h1>\n"},
    {"path": "old.txt", "content": "to be removed\n"},
    {"path": "keep/same.txt", "content": "unchanged\n"},
]
TREE_CHANGES = [
    {"path": "index.html", "content": "<h1>v1</h1>\n"},
    {"path": "old.txt", "remove": True},
    {"path": "news/today.txt", "content": "new\n"},
]
WRITERS_AT_ONCE = 4
MAX_KILLS = 4
STEP_TIMEOUT = 60.0
# Kills are drawn up to this multiple of the median calibrated write (first touch to last change),
# so that some fall past the end of the write (the last event, the exit) and all of it is covered.
SPAN_MARGIN = 1.5
CALIBRATION_RUNS = 6
# Trials per mode between two calibrations.
CALIBRATE_EVERY = 25
SHOWN_VIOLATIONS = 5
# The writers wait on fsync and on the kill thread's sleeps: one trial more than cores keeps them busy.
DEFAULT_WORKERS = (os.cpu_count() or 2) + 1

# Where a kill can leave a write (receipts.crashes has a call's), in the order the write passes
# them, each told by what the disk shows (docs/KILL_TESTING.md says what each one is).
TASK_WINDOWS = (
    "no_record",
    "reserved",
    "reserved_with_task_file",
    "task_created",
    "committed_without_event",
    "event_not_noted",
    "recorded",
)
# The windows where the effect exists and its record does not yet say so all: the ones a
# kill test exists for. A run whose kills never land in one of them has tested little.
EFFECT_DONE_UNRECORDED = {
    "write_file": set(CALL_EFFECT_DONE_UNRECORDED),
    "send_message": set(CALL_EFFECT_DONE_UNRECORDED),
    "write-task": {"reserved_with_task_file", "task_created", "committed_without_event"},
    "apply_changes": set(CALL_EFFECT_DONE_UNRECORDED),
    "apply_changes-git": set(CALL_EFFECT_DONE_UNRECORDED),
}


def mode_name(tool: str, together: bool) -> str:
    return f"{WRITERS_AT_ONCE}x {tool}" if together else tool


def windows_of(tool: str) -> tuple[str, ...]:
    return TASK_WINDOWS if tool == "write-task" else CALL_WINDOWS


# --- the first touch, through inotify ------------------------------------------------

# Opening steer.json is the writer's first act in a run directory, so IN_OPEN sees it
# before any lock or receipt; the rest catch a writer that would start by changing something.
TOUCH_EVENTS = CHANGE_EVENTS | IN_OPEN
WRITTEN_FOLDERS = (
    protocol.WRITER_DIR,
    "receipts",
    "submissions",
    "tasks",
    "workspace",
    str(Path(FILE_ARGS["path"]).parent),
)


class TouchWatch:
    """Tells when a process first opens or changes anything directly in a run directory; with
    ``depth``, also when the last change anywhere in the folders a write touches came."""

    def __init__(self, run_dir: Path, *, depth: bool = False) -> None:
        folders = [run_dir]
        if depth:
            # Made in advance: inotify cannot watch a folder before it exists.
            folders += [run_dir / name for name in WRITTEN_FOLDERS]
            for folder in folders:
                folder.mkdir(parents=True, exist_ok=True)
        self.fd = inotify_watch(folders, TOUCH_EVENTS)

    def first_touch(self, children: Sequence[subprocess.Popen], timeout: float) -> float | None:
        """The monotonic time of the first touch; ``None`` when every child ended first, or the timeout."""
        touched, _ = self._follow(children, timeout, until_exit=False)
        return touched

    def write_span(self, children: Sequence[subprocess.Popen], timeout: float) -> tuple[float, float] | None:
        """Seconds from the first touch to the last change, and to the last exit (``None``: no touch)."""
        touched, last_change = self._follow(children, timeout, until_exit=True)
        if touched is None or last_change is None:
            return None
        return last_change - touched, time.monotonic() - touched

    def _follow(
        self, children: Sequence[subprocess.Popen], timeout: float, *, until_exit: bool
    ) -> tuple[float | None, float | None]:
        exits = {os.pidfd_open(child.pid): child for child in children}
        touched = last_change = None
        try:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            for pidfd in exits:
                poller.register(pidfd, select.POLLIN)
            deadline = time.monotonic() + timeout
            while exits:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                ready = {fd for fd, _ in poller.poll(remaining * 1000)}
                now = time.monotonic()
                if self.fd in ready:
                    touched = touched or now
                    if not until_exit:
                        break
                    if any(mask & CHANGE_EVENTS for mask, _ in read_inotify_events(self.fd)):
                        last_change = now
                for pidfd in ready & set(exits):
                    poller.unregister(pidfd)
                    del exits[pidfd]
            return touched, last_change
        finally:
            for pidfd in exits:
                os.close(pidfd)

    def close(self) -> None:
        os.close(self.fd)


# --- running the writer --------------------------------------------------------------


@dataclasses.dataclass
class Finished:
    """One writer process, as it ended."""

    pid: int
    returncode: int
    stdout: bytes
    stderr: bytes
    kill_delay: float | None  # seconds after the first touch; None: left to finish
    window: str | None  # where its kill landed, when it did
    hung: bool = False

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def output(self) -> dict[str, Any]:
        try:
            document = json.loads(self.stdout)
        except ValueError:
            return {}
        return document if isinstance(document, dict) else {}

    def describe(self) -> str:
        """The exit and the writer's own words for it, then what it printed (after " | ")."""
        error = self.output().get("error")
        reason = error.get("message") if isinstance(error, dict) else None
        lines = self.stderr.decode(errors="replace").strip().splitlines()
        reason = str(reason or (lines[-1] if lines else "no error text"))[:300]
        printed = self.stdout.decode(errors="replace").strip()[:400]
        return f"exit {self.returncode}: {reason} | stdout {printed!r}, stderr {self.stderr[-600:]!r}"


def _spawn(command: list[str], stdin: bytes | None, env: dict[str, str]) -> subprocess.Popen:
    if stdin is None:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
    # The request sits whole in the pipe before the child starts, so a kill never finds us mid-write.
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, stdin)
        os.close(write_end)
        return subprocess.Popen(command, stdin=read_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    finally:
        os.close(read_end)


def run_writers(
    run_dir: Path,
    command: list[str],
    stdin: bytes | None,
    delays: Sequence[float | None],
    classify: Callable[[int], str],
) -> list[Finished]:
    """Start one writer per entry of ``delays`` at once; SIGKILL each whose delay is set, that many
    seconds after the first touch of ``run_dir`` by any of them. Right after a kill that found its
    writer running, ``classify(pid)`` names the window from the disk (the others may still be at work)."""
    env = writer_env()
    watch = TouchWatch(run_dir)
    windows: dict[int, str] = {}
    try:
        children = [_spawn(command, stdin, env) for _ in delays]
        planned = sorted((delay, index) for index, delay in enumerate(delays) if delay is not None)
        if planned:
            touched = watch.first_touch(children, STEP_TIMEOUT)
            start = time.monotonic() if touched is None else touched
            for delay, index in planned:
                pause = start + delay - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                victim = children[index]
                # send_signal polls first: a child that has ended is never signalled, its pid may be another's.
                victim.send_signal(signal.SIGKILL)
                if victim.wait() == -signal.SIGKILL:
                    windows[index] = classify(victim.pid)
    finally:
        watch.close()
    finished = []
    for index, (child, kill_delay) in enumerate(zip(children, delays, strict=True)):
        try:
            stdout, stderr = child.communicate(timeout=STEP_TIMEOUT)
            hung = False
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
            hung = True
        finished.append(Finished(child.pid, child.returncode, stdout, stderr, kill_delay, windows.get(index), hung))
    return finished


# --- what the disk shows ---------------------------------------------------------------


def _visible_files(folder: Path, suffix: str) -> list[Path]:
    """What a reader sees in ``folder``: the writer's temp files start with a dot."""
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if path.name.endswith(suffix) and not path.name.startswith("."))


def replay_rows(run_dir: Path, *, by_cli: bool) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Replay's decisions by call_id: ``python -m receipts replay --json``, or the function it prints
    (``replay_run``), which spares a Python start after every kill."""
    if not by_cli:
        return {row["call_id"]: row for row in replay_run(run_dir)["decisions"]}, []
    completed = subprocess.run(
        writer_command("replay", str(run_dir), "--json"), capture_output=True, env=writer_env(), check=False
    )
    if completed.returncode != 0 or b"Traceback" in completed.stderr:
        return {}, [f"replay failed: exit {completed.returncode}, {completed.stderr.decode(errors='replace')[-400:]}"]
    return {row["call_id"]: row for row in json.loads(completed.stdout)["decisions"]}, []


def expected_decisions(tool: str, status: str) -> set[str]:
    """What replay must say of a receipt in ``status`` (RUN_DIRECTORY.md, "Recovery decisions")."""
    if status == "committed":
        return {"reuse"}
    if status in protocol.OPEN_STATUSES:
        return {"query"} if tool in ("write_file", *APPLY_MODES) else {"confirm"}
    if status == "rejected":
        return {"retry", "stop"}
    return {"confirm"}


class Intent:
    """One intent retried against one run directory, and the invariants its files must keep."""

    tool: str

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def command(self) -> tuple[list[str], bytes | None]:
        raise NotImplementedError

    def window(self, killed_pids: set[int]) -> str:
        raise NotImplementedError

    def start(self) -> None:
        """Start what watches the trial (a reader of the tree) once its run directory is ready."""

    def close(self) -> list[str]:
        """Let go of what the intent watches; what it found broken over the whole trial."""
        return []

    def window_after_kill(self, pid: int) -> str:
        # Other writers may be at work: a file can go between a listing and its read.
        try:
            return self.window({pid})
        except (OSError, ValueError):
            return "read_while_changing"

    def effect_problems(self) -> list[str]:
        raise NotImplementedError

    def clean_problems(self, finished: Finished) -> tuple[list[str], str]:
        """What is wrong with a run left to finish, and its outcome in a word or two."""
        raise NotImplementedError

    def allowed_exits(self) -> set[int]:
        return {0}

    def problems(self, *, replay_by_cli: bool) -> list[str]:
        """Every invariant that must hold after any step, killed or not."""
        _, problems = ledger_events(self.run_dir)
        problems += self.effect_problems()
        rows, replay_problems = replay_rows(self.run_dir, by_cli=replay_by_cli)
        problems += replay_problems
        if not replay_problems:
            problems += self._replay_disagreements(rows)
        return problems

    def _replay_disagreements(self, rows: dict[str, dict[str, Any]]) -> list[str]:
        problems = []
        on_disk = {path.stem: json_or_none(path) for path in _visible_files(self.run_dir / "receipts", ".json")}
        for call_id, receipt in on_disk.items():
            row = rows.get(call_id)
            status = receipt.get("status") if isinstance(receipt, dict) else None
            if row is None:
                problems.append(f"replay does not list the receipt {call_id[:12]} ({status})")
                continue
            if row["status"] != status:
                problems.append(f"replay says {row['status']} for the {status} receipt {call_id[:12]}")
            if row["decision"] not in expected_decisions(self.tool, str(status)):
                problems.append(f"replay decides {row['decision']} for the {status} receipt: {row['reason']}")
        problems += [f"replay names {call_id[:12]}, which has no receipt" for call_id in set(rows) - set(on_disk)]
        return problems

    def exit_problems(self, finished: Finished) -> list[str]:
        """A writer that ended on its own: never a traceback, never exit 1, only the codes its tool allows."""
        if finished.hung:
            return [f"the writer hung past {STEP_TIMEOUT:.0f} s and was killed"]
        if finished.killed:
            return []
        problems = []
        if b"Traceback" in finished.stderr:
            problems.append(f"a traceback, {finished.describe()}")
        if finished.returncode not in self.allowed_exits():
            problems.append(f"unexpected {finished.describe()}")
        return problems

    def call_exit(self, finished: Finished, receipt_path: Path) -> tuple[list[str], str, dict[str, Any]]:
        """A call's clean run: its exit's problems, its outcome in a word or two, and its receipt."""
        problems = self.exit_problems(finished)
        receipt = json_or_none(receipt_path) or {}
        outcome = f"exit {finished.returncode}"
        if finished.returncode == 0:
            outcome = "exit 0 reused" if finished.output().get("reused") else "exit 0 committed"
            if finished.output().get("status") != "committed" or receipt.get("status") != "committed":
                problems.append(f"exit 0 without a committed receipt: {finished.describe()}")
        return problems, outcome, receipt

    def findings_problems(self) -> list[str]:
        files, _ = read_run(self.run_dir, keep_events=False)
        return [f"reader finding {f.code} on {f.subject}: {f.detail}" for f in files.findings]


class CallIntent(Intent):
    def __init__(self, run_dir: Path, tool: str) -> None:
        super().__init__(run_dir)
        self.tool = tool
        self.args = dict(FILE_ARGS if tool == "write_file" else MESSAGE_ARGS)
        adapter = BUILTIN_ADAPTERS[tool]
        self.call_id = protocol.make_call_id(
            CONTRACT, 1, tool, adapter.normalise(self.args), adapter.version, protocol.IDENTITY_V2
        )
        self.receipt_path = run_dir / "receipts" / f"{self.call_id}.json"
        self.target = run_dir / "workspace" / FILE_ARGS["path"]
        self.inodes: set[int] = set()
        self.placements = 0
        self.placement_watch: int | None = None
        if tool == "write_file":
            # Two writers of one round could each put the file in place between two looks at its
            # inode; inotify counts every rename onto it. The folder is made first so it can be
            # watched (the writer makes it when missing, and is content to find it).
            self.target.parent.mkdir(parents=True)
            self.placement_watch = inotify_watch([self.target.parent], IN_MOVED_TO | IN_CREATE)

    def close(self) -> list[str]:
        if self.placement_watch is not None:
            os.close(self.placement_watch)
        return []

    def command(self) -> tuple[list[str], bytes | None]:
        args = json.dumps(self.args)
        return writer_command("call", str(self.run_dir), "--tool", self.tool, "--args", args), None

    def allowed_exits(self) -> set[int]:
        # A message killed after its prepared receipt cannot be queried: a person decides (exit 4).
        return {0, 4} if self.tool == "send_message" else {0}

    def outbox_lines(self) -> list[bytes]:
        try:
            return (self.run_dir / "outbox.jsonl").read_bytes().splitlines()
        except FileNotFoundError:
            return []

    def outbox_messages(self) -> list[dict[str, Any]]:
        """Each outbox line as JSON; a line that is not (a torn write) stands as an empty message."""
        messages = []
        for line in self.outbox_lines():
            try:
                message = json.loads(line)
            except ValueError:
                message = {}
            messages.append(message if isinstance(message, dict) else {})
        return messages

    def effect_present(self) -> bool:
        if self.tool == "write_file":
            return self.target.exists()
        return any(message.get("call_id") == self.call_id for message in self.outbox_messages())

    def effect_problems(self) -> list[str]:
        problems = []
        receipt = json_or_none(self.receipt_path)
        if self.tool == "write_file":
            with contextlib.suppress(FileNotFoundError):
                self.inodes.add(os.stat(self.target).st_ino)
                if self.target.read_bytes() != FILE_ARGS["content"].encode():
                    problems.append("the workspace file holds other bytes than the call writes")
            if len(self.inodes) > 1:
                problems.append(
                    f"the workspace file was written {len(self.inodes)} times (inodes {sorted(self.inodes)})"
                )
            assert self.placement_watch is not None  # made with the run for write_file
            self.placements += sum(name == self.target.name for _, name in read_inotify_events(self.placement_watch))
            if self.placements > 1:
                problems.append(f"the workspace file was put in place {self.placements} times")
            if isinstance(receipt, dict) and receipt.get("status") == "committed":
                expected = protocol.sha256_hex(FILE_ARGS["content"].encode())
                present = protocol.sha256_hex(self.target.read_bytes()) if self.target.exists() else None
                if present != expected or (receipt.get("result") or {}).get("file_sha256") != expected:
                    problems.append(f"committed, but the workspace file's digest is {present}")
            return problems
        lines = self.outbox_lines()
        if len(lines) > 1:
            problems.append(f"{len(lines)} outbox lines: the message went out more than once")
        messages = self.outbox_messages()
        problems += [
            f"an outbox line carries call_id {m.get('call_id')!r}" for m in messages if m.get("call_id") != self.call_id
        ]
        if isinstance(receipt, dict) and receipt.get("status") == "committed":
            result = receipt.get("result") or {}
            recorded = [
                line
                for line, message in zip(lines, messages, strict=True)
                if protocol.sha256_hex(line) == result.get("message_sha256")
                and message.get("message_id") == result.get("remote_resource_id")
            ]
            if not recorded:
                problems.append("committed, but no outbox line is the one its result records")
        return problems

    def window(self, killed_pids: set[int]) -> str:
        return call_window(self.run_dir, self.call_id, killed_pids, self.effect_present)

    def clean_problems(self, finished: Finished) -> tuple[list[str], str]:
        problems, outcome, receipt = self.call_exit(finished, self.receipt_path)
        output = finished.output()
        if finished.returncode == 0:
            once = (
                len(self.inodes) == 1 == self.placements if self.tool == "write_file" else len(self.outbox_lines()) == 1
            )
            if not once:
                problems.append("exit 0, but the effect is not there exactly once")
        elif finished.returncode == 4 and self.tool == "send_message":
            outcome = "exit 4 in doubt"
            if output.get("needs") != "confirmation" or receipt.get("status") not in protocol.OPEN_STATUSES:
                problems.append(f"exit 4 without a call in doubt: {finished.describe()}")
        return problems, outcome


class TaskIntent(Intent):
    tool = "write-task"

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.request = json.dumps(login_request()).encode()
        self.record_path = run_dir / "submissions" / f"{protocol.submission_key(SUBMISSION_ID)}.json"

    def command(self) -> tuple[list[str], bytes | None]:
        arguments = ("write-task", str(self.run_dir), "--request", "-", "--submission-id", SUBMISSION_ID)
        return writer_command(*arguments), self.request

    def task_files(self) -> list[Path]:
        return _visible_files(self.run_dir / "tasks", ".md")

    def effect_problems(self) -> list[str]:
        problems = []
        tasks = self.task_files()
        if len(tasks) > 1:
            problems.append(f"{len(tasks)} task files for one submission: {[path.name for path in tasks]}")
        for record_path in _visible_files(self.run_dir / "submissions", ".json"):
            record = json_or_none(record_path)
            if not isinstance(record, dict) or record.get("state") not in ("task_created", "committed"):
                continue
            task = self.run_dir / str(record.get("task_path"))
            digest = protocol.sha256_hex(task.read_bytes()) if task.is_file() else None
            if digest is None or digest != record.get("task_sha256"):
                problems.append(f"{record['state']} record, but its task file's digest is {digest}")
            if record["state"] == "committed" and (record.get("creation_result") or {}).get("task_sha256") != digest:
                problems.append("committed record whose creation_result is not its task file")
        return problems

    def window(self, killed_pids: set[int]) -> str:
        record = json_or_none(self.record_path)
        if not isinstance(record, dict):
            return "no_record"
        state = record.get("state")
        if state == "reserved":
            return "reserved_with_task_file" if (self.run_dir / str(record.get("task_path"))).is_file() else "reserved"
        if state == "committed":
            events, _ = ledger_events(self.run_dir)
            created = [
                event
                for event in events
                if event.get("type") == "submission"
                and event.get("client_submission_id") == SUBMISSION_ID
                and event.get("disposition") == "created"
            ]
            if not created:
                return "committed_without_event"
            return "recorded" if "created_event_seq" in record else "event_not_noted"
        return str(state)

    def clean_problems(self, finished: Finished) -> tuple[list[str], str]:
        problems = self.exit_problems(finished)
        disposition = finished.output().get("disposition")
        record = json_or_none(self.record_path) or {}
        if finished.returncode != 0 or disposition not in ("created", "reused"):
            problems.append(f"a clean run must create or reuse: {finished.describe()}")
        if len(self.task_files()) != 1 or record.get("state") != "committed":
            problems.append(f"after a clean run: {len(self.task_files())} task files, record {record.get('state')}")
        return problems, f"exit {finished.returncode} {disposition}"


class ApplyIntent(Intent):
    """One ``apply_changes`` call on a tree made before the trial, with a reader process looking at
    the tree throughout: every look must find the version before the call or the one it makes."""

    def __init__(self, run_dir: Path, tool: str) -> None:
        super().__init__(run_dir)
        self.tool, self.mode = tool, APPLY_MODES[tool]
        self.args = {"tree": TREE, "mode": self.mode, "changes": TREE_CHANGES}
        adapter = BUILTIN_ADAPTERS["apply_changes"]
        normal = adapter.normalise(self.args)
        self.call_id = protocol.make_call_id(CONTRACT, 1, "apply_changes", normal, adapter.version,
                                             protocol.IDENTITY_V2)  # fmt: skip
        self.receipt_path = run_dir / "receipts" / f"{self.call_id}.json"
        before = planned_manifest({}, TREE_BEFORE)
        self.before, self.after = tree_digest(before), tree_digest(planned_manifest(before, normal["changes"]))
        # The version the call starts from, made by a call of its own before any kill.
        made = runtime.Executor(run_dir).call(
            "apply_changes", {"tree": TREE, "mode": self.mode, "changes": TREE_BEFORE}
        )
        if made.status != "committed":
            raise RuntimeError(f"the tree before the trial was not made: {made.error}")
        self.placements = 0
        self.placement_watch = inotify_watch([run_dir / "workspace"], IN_MOVED_TO) if self.mode == "content" else None
        self.reader: subprocess.Popen | None = None
        self.reader_log = run_dir.with_name(run_dir.name + ".reader")
        self.reads = 0

    def start(self) -> None:
        command = [sys.executable, "-m", "tests.tree_reader", str(self.run_dir), TREE, self.mode,
                   str(self.reader_log), self.before, self.after]  # fmt: skip
        self.reader = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=writer_env())

    def close(self) -> list[str]:
        if self.placement_watch is not None:
            os.close(self.placement_watch)
        if self.reader is None:
            return []
        stdout, _ = self.reader.communicate(b"", timeout=STEP_TIMEOUT)  # its standard input closed: it ends
        problems = self.reader_problems()
        try:
            self.reads = int(json.loads(stdout)["reads"])
        except (ValueError, KeyError, TypeError):
            problems.append(f"the reader ended without its count: exit {self.reader.returncode}")
        if self.reads == 0:
            problems.append("the reader never looked at the tree")
        with contextlib.suppress(FileNotFoundError):
            self.reader_log.unlink()
        return problems

    def reader_problems(self) -> list[str]:
        try:
            lines = self.reader_log.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [f"{lines[0]} ({len(lines)} such looks)"] if lines else []

    def command(self) -> tuple[list[str], bytes | None]:
        return writer_command(
            "call", str(self.run_dir), "--tool", "apply_changes", "--args", json.dumps(self.args)
        ), None

    def visible(self) -> str | None:
        """The digest of the tree's current version, read as the adapter reads it."""
        tree = open_tree(self.run_dir, self.args)
        current = tree.current()
        return None if current is None else tree_digest(tree.manifest(current))

    def effect_present(self) -> bool:
        return self.visible() == self.after

    def effect_problems(self) -> list[str]:
        problems = self.reader_problems()
        if self.placement_watch is not None:
            self.placements += sum(name == TREE for _, name in read_inotify_events(self.placement_watch))
        else:
            log = self.run_dir / "workspace" / f"{TREE}.git" / "logs" / "refs" / "heads" / "main"
            self.placements = len(log.read_bytes().splitlines()) - 1  # the first line made the tree before
        if self.placements > 1:
            problems.append(f"the tree was made current {self.placements} times")
        try:
            visible = self.visible()
        except (OSError, ValueError) as error:
            return [*problems, f"the tree cannot be read: {error}"]
        if visible not in (self.before, self.after):
            problems.append(f"the tree is at {visible}, neither the version before nor the one the call makes")
        receipt = json_or_none(self.receipt_path)
        if isinstance(receipt, dict) and receipt.get("status") == "committed":
            result = receipt.get("result") or {}
            if visible != self.after or result.get("files_sha256") != self.after:
                problems.append(f"committed, but the tree is at {visible} (the result records {result})")
        return problems

    def window(self, killed_pids: set[int]) -> str:
        return call_window(self.run_dir, self.call_id, killed_pids, self.effect_present)

    def clean_problems(self, finished: Finished) -> tuple[list[str], str]:
        problems, outcome, _ = self.call_exit(finished, self.receipt_path)
        if finished.returncode == 0 and (self.placements != 1 or self.visible() != self.after):
            problems.append(f"exit 0, but the tree was made current {self.placements} times")
        return problems, outcome


def make_intent(tool: str, run_dir: Path) -> Intent:
    if tool in APPLY_MODES:
        return ApplyIntent(run_dir, tool)
    return TaskIntent(run_dir) if tool == "write-task" else CallIntent(run_dir, tool)


# --- trials ------------------------------------------------------------------------------


@dataclasses.dataclass
class TrialResult:
    mode: str  # the tool, or "4x <tool>" for the concurrent mode
    seed: int
    run_dir: Path
    spans: tuple[float, float] = (0.0, 0.0)  # the spans its kills were drawn over (one writer, four)
    kills_sent: int = 0
    kills_landed: int = 0
    windows: Counter = dataclasses.field(default_factory=Counter)
    outcomes: Counter = dataclasses.field(default_factory=Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    history: list[str] = dataclasses.field(default_factory=list)
    reads: int = 0  # apply_changes: the reader process's looks at the tree, all of them one version or the other


def _step(intent: Intent, result: TrialResult, delays: list[float | None], last: bool, replay_cli: bool) -> bool:
    """One round of writers, then every invariant; False once something broke (the trial stops).
    Replay is asked through its command after the clean run when ``replay_cli``, else in process."""
    command, stdin = intent.command()
    finished = run_writers(intent.run_dir, command, stdin, delays, intent.window_after_kill)
    result.kills_sent += sum(delay is not None for delay in delays)
    # The clean run's own checks include these.
    problems = [] if last else [problem for done in finished for problem in intent.exit_problems(done)]
    problems += intent.problems(replay_by_cli=last and replay_cli)
    notes = []
    for done in finished:
        if done.kill_delay is None:
            continue
        if done.window is None:
            notes.append(f"{done.kill_delay * 1000:.1f}ms (ended first: exit {done.returncode})")
            continue
        result.kills_landed += 1
        result.windows[done.window] += 1
        notes.append(f"{done.kill_delay * 1000:.1f}ms -> {done.window}")
    if last:
        outcomes = []
        for done in finished:
            clean, outcome = intent.clean_problems(done)
            problems += clean
            outcomes.append(outcome)
            result.outcomes[outcome] += 1
        problems += intent.findings_problems()
        notes.append("clean: " + ", ".join(outcomes))
    result.history.append(("kill " if not last else "") + ", ".join(notes))
    result.violations += [f"step {len(result.history)}: {problem}" for problem in problems]
    return not problems


def kill_delays(rng: random.Random, writers: int, span: float, together_span: float) -> list[float | None]:
    """Which writers of a round die, and when. With several at once, half the kills are drawn over a
    single write (they find the first lock holder mid-write, the others waiting behind it), half
    over the whole round (they find the later writers mid-recovery)."""
    victims = set(rng.sample(range(writers), rng.randint(1, writers)))
    if writers == 1:
        return [rng.uniform(0, span)]
    return [
        (rng.uniform(0, span if rng.random() < 0.5 else together_span) if index in victims else None)
        for index in range(writers)
    ]


def run_trial(
    tool: str, seed: int, run_dir: Path, spans: tuple[float, float], together: bool, *, replay_cli: bool = True
) -> TrialResult:
    """One intent in a fresh run directory: 1 to 4 rounds of kills, then a clean run; checked after each.
    ``spans``: how long after the first touch kills are drawn, for one writer and for four at once."""
    rng = random.Random(seed)
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    intent = make_intent(tool, run_dir)
    result = TrialResult(mode_name(tool, together), seed, run_dir, spans)
    writers = WRITERS_AT_ONCE if together else 1
    try:
        intent.start()
        for _ in range(rng.randint(1, MAX_KILLS)):
            if not _step(intent, result, kill_delays(rng, writers, *spans), False, replay_cli):
                break
        else:
            _step(intent, result, [None] * writers, True, replay_cli)
    finally:
        result.violations += [f"over the trial: {problem}" for problem in intent.close()]
        result.reads = getattr(intent, "reads", 0)
    return result


def calibrate(tool: str, root: Path, together: bool, workers: int) -> list[tuple[float, float]]:
    """How long unkilled writes take from a fresh run directory, from the first touch to the last
    change and to the last exit, sorted; made as many at once as the trials will be, under their load."""
    writers = WRITERS_AT_ONCE if together else 1

    def measure(index: int) -> tuple[float, float]:
        run_dir = root / f"calibrate-{'4x-' if together else ''}{tool}-{index}"
        runtime.run_init(run_dir, contract_sha256=CONTRACT)
        intent = make_intent(tool, run_dir)
        command, stdin = intent.command()
        # Under the load of the trials: apply_changes's reader process looks at the tree meanwhile.
        intent.start()
        watch = TouchWatch(run_dir, depth=True)
        try:
            env = writer_env()
            children = [_spawn(command, stdin, env) for _ in range(writers)]
            span = watch.write_span(children, STEP_TIMEOUT)
        finally:
            watch.close()
            intent.close()
        for child in children:
            child.communicate(timeout=STEP_TIMEOUT)
            if child.returncode != 0:
                raise RuntimeError(f"a calibration write of {tool} ended with exit {child.returncode}")
        shutil.rmtree(run_dir)
        if span is None:
            raise RuntimeError(f"a calibration write of {tool} never touched its run directory")
        return span

    with ThreadPoolExecutor(workers) as pool:
        return sorted(pool.map(measure, range(CALIBRATION_RUNS)))


@contextlib.contextmanager
def prompt_thread_switches() -> Iterator[None]:
    # The thread that must kill at a given moment waits for the GIL behind the others' checks;
    # the default 5 ms switch interval would be as long as the whole write.
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@dataclasses.dataclass
class Report:
    seed: int
    workers: int
    spans: dict[str, float]
    calibrations: dict[str, list[tuple[float, float]]]
    trials: list[TrialResult]
    seconds: float

    def modes(self) -> list[str]:
        return list(dict.fromkeys(trial.mode for trial in self.trials))

    def of(self, mode: str) -> list[TrialResult]:
        return [trial for trial in self.trials if trial.mode == mode]

    def windows(self, mode: str) -> Counter:
        return sum((trial.windows for trial in self.of(mode)), Counter())

    def violations(self, mode: str | None = None) -> list[TrialResult]:
        return [trial for trial in self.trials if trial.violations and mode in (None, trial.mode)]

    def violation_kinds(self) -> Counter:
        """Broken trials by mode and by the first thing that broke, told apart from the details."""
        return Counter((trial.mode, violation_kind(trial.violations[0])) for trial in self.violations())


def violation_kind(violation: str) -> str:
    text = re.sub(r"^step \d+: ", "", violation).split(" | ")[0]
    return re.sub(r"\d{4,}", "N", re.sub(r"[0-9a-f]{12,}", "…", text))


def run_torture(
    *,
    trials: int,
    concurrent_trials: int,
    tools: Sequence[str] = TOOLS,
    workers: int = DEFAULT_WORKERS,
    seed: int = 0,
    root: Path,
    keep: bool = False,
    spans_ms: tuple[float, float] | None = None,
    replay_cli: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Every trial for ``tools``: ``trials`` single-writer ones and ``concurrent_trials`` with four
    writers at once; trial ``i`` of each mode has seed ``seed + i``. The run directories go under
    ``root``; passing ones are removed unless ``keep``. ``spans_ms`` (one writer, four) instead of
    calibrating: to draw the very delays of a reported trial again. ``replay_cli``: after the clean run,
    ask ``python -m receipts replay`` itself rather than the function it prints (a Python start a trial)."""
    started = time.monotonic()
    spans: dict[str, list[float]] = {}
    calibrations: dict[str, list[tuple[float, float]]] = {}
    counts = {False: trials, True: concurrent_trials}

    def calibrate_spans(first: int) -> dict[str, float]:
        """The span of each mode with trials from ``first`` on, from writes made just before them."""
        now: dict[str, float] = {}
        for tool in tools:
            for together in (False, True):
                mode = mode_name(tool, together)
                # The four-writer rounds draw half their kills over one write: they need its span too.
                if first >= counts[together] and (together or first >= counts[True]):
                    continue
                if spans_ms is not None:
                    now[mode] = spans_ms[together] / 1000
                elif counts[together] or not together:
                    measured = calibrate(tool, root, together, workers)
                    calibrations.setdefault(mode, []).extend(measured)
                    now[mode] = statistics.median(write for write, _ in measured) * SPAN_MARGIN
                else:
                    continue
                spans.setdefault(mode, []).append(now[mode])
        return now

    def one(job: tuple[str, int, bool, dict[str, float]]) -> TrialResult:
        tool, trial_seed, together, chunk_spans = job
        run_dir = root / f"{'4x-' if together else ''}{tool}-{trial_seed}"
        mode_spans = (chunk_spans[tool], chunk_spans.get(mode_name(tool, True), 0.0))
        try:
            result = run_trial(tool, trial_seed, run_dir, mode_spans, together, replay_cli=replay_cli)
        except Exception as error:  # noqa: BLE001 - a harness that stops at one surprise hides the rest
            result = TrialResult(mode_name(tool, together), trial_seed, run_dir)
            result.violations.append(f"the trial raised {type(error).__name__}: {error}")
        if not result.violations and not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        return result

    results: list[TrialResult] = []
    total = trials * len(tools) + concurrent_trials * len(tools)
    with prompt_thread_switches():
        # The machine's load changes while the trials run (a test suite beside them, a browser
        # starting): spans calibrated once at the start go stale, and a span made in a burst of load
        # sends most kills after the write has ended. Each chunk of trials has spans of its own.
        for first in range(0, max(trials, concurrent_trials), CALIBRATE_EVERY):
            chunk_spans = calibrate_spans(first)
            jobs = [
                (tool, seed + index, together, chunk_spans)
                for together, count in ((False, trials), (True, concurrent_trials))
                for tool in tools
                for index in range(first, min(count, first + CALIBRATE_EVERY))
            ]
            with ThreadPoolExecutor(workers) as pool:
                for result in pool.map(one, jobs):
                    results.append(result)
                    if progress is not None:
                        progress(len(results), total)
    shown_spans = {mode: statistics.median(values) for mode, values in spans.items()}
    return Report(seed, workers, shown_spans, calibrations, results, time.monotonic() - started)


# --- the table ------------------------------------------------------------------------------


def format_report(report: Report) -> str:
    lines = [
        f"seed {report.seed}, {report.workers} workers, {os.cpu_count()} cores, {report.seconds:.0f} s",
        "",
        "write ms / exit ms: medians of the calibration writes, from the writer's first touch of the run",
        "directory to its last change there / to the last exit. Kill delays are drawn from 0 to span ms after",
        f"the first touch: {SPAN_MARGIN} x the median write time, calibrated again every {CALIBRATE_EVERY} trials",
        "(span ms: the median of those spans).",
        "",
        f"{'mode':<16} {'trials':>6} {'kills sent':>10} {'landed':>7} {'landed %':>8} "
        f"{'write ms':>8} {'exit ms':>7} {'span ms':>7} {'violations':>10}",
    ]
    for mode in report.modes():
        trials = report.of(mode)
        sent = sum(trial.kills_sent for trial in trials)
        landed = sum(trial.kills_landed for trial in trials)
        calibration = report.calibrations.get(mode)
        write, end = (
            (f"{statistics.median(times) * 1000:.1f}" for times in zip(*calibration, strict=True))
            if calibration
            else ("-", "-")
        )
        lines.append(
            f"{mode:<16} {len(trials):>6} {sent:>10} {landed:>7} {100 * landed / max(sent, 1):>7.0f}% "
            f"{write:>8} {end:>7} {report.spans[mode] * 1000:>7.1f} {len(report.violations(mode)):>10}"
        )
    lines += ["", "windows: where the kills that landed did, by what the disk showed right after each"]
    for mode in report.modes():
        tool = mode.split()[-1]
        counts = report.windows(mode)
        lines.append(f"  {mode}")
        for window in (*windows_of(tool), *sorted(set(counts) - set(windows_of(tool)))):
            marker = "  *" if window in EFFECT_DONE_UNRECORDED[tool] else ""
            lines.append(f"    {window:<30} {counts[window]:>6}{marker}")
    lines.append("  (* the effect is done and its record is not complete yet)")
    lines += ["", "outcomes of the clean runs"]
    for mode in report.modes():
        outcomes = sum((trial.outcomes for trial in report.of(mode)), Counter())
        lines.append(f"  {mode:<16} " + ", ".join(f"{name}: {count}" for name, count in sorted(outcomes.items())))
    looked = [mode for mode in report.modes() if mode.split()[-1] in APPLY_MODES]
    if looked:
        lines += [
            "",
            "apply_changes: a reader process looked at the tree throughout each trial (each look one version)",
        ]
        lines += [f"  {mode:<24} {sum(trial.reads for trial in report.of(mode)):>8} looks" for mode in looked]
    broken = report.violations()
    lines += ["", f"violations: {len(broken)} trial(s)"]
    for (mode, kind), count in sorted(report.violation_kinds().items()):
        lines.append(f"  {count:>5}  {mode}: {kind}")
    if broken:
        lines += ["", f"the first {min(len(broken), SHOWN_VIOLATIONS)}:"]
    for trial in broken[:SHOWN_VIOLATIONS]:
        tool = trial.mode.split()[-1]
        again = "--trials 1 --concurrent-trials 0" if trial.mode == tool else "--trials 0 --concurrent-trials 1"
        spans = " ".join(f"{span * 1000:.1f}" for span in trial.spans)
        lines += [
            f"  {trial.mode}, seed {trial.seed}, run dir {trial.run_dir}",
            f"    again: python -m tests.torture --tools {tool} {again} --seed {trial.seed} --spans-ms {spans}",
            *(f"    step {number}: {step}" for number, step in enumerate(trial.history, start=1)),
            *(f"    ! {violation}" for violation in trial.violations[:6]),
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="single-writer trials per tool")
    parser.add_argument(
        "--concurrent-trials", type=int, default=None, help=f"trials per tool with {WRITERS_AT_ONCE} writers at once "
        "(default: a tenth of --trials)"
    )  # fmt: skip
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="trials run at once")
    parser.add_argument("--seed", type=int, default=None, help="trial i has seed SEED + i (default: random)")
    parser.add_argument(
        "--spans-ms",
        type=float,
        nargs=2,
        metavar=("ONE", "FOUR"),
        default=None,
        help="kill delays up to these (one writer, four at once) instead of calibrating them",
    )
    parser.add_argument("--keep", action="store_true", help="keep every run directory (failing ones are always kept)")
    options = parser.parse_args(argv)
    seed = random.SystemRandom().randrange(10**6) if options.seed is None else options.seed
    concurrent_trials = options.trials // 10 if options.concurrent_trials is None else options.concurrent_trials
    root = Path(tempfile.mkdtemp(prefix="callproof-torture-"))

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{done}/{total} trials")
            sys.stderr.flush()

    report = run_torture(
        trials=options.trials,
        concurrent_trials=concurrent_trials,
        tools=options.tools,
        workers=options.workers,
        seed=seed,
        root=root,
        keep=options.keep,
        spans_ms=None if options.spans_ms is None else tuple(options.spans_ms),
        progress=progress,
    )
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(format_report(report))
    if not report.violations() and not options.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"\nrun directories kept under {root}")
    return 1 if report.violations() else 0


if __name__ == "__main__":
    sys.exit(main())
