"""The writer: run directories, idempotent task creation, receipts around tool calls.

Standard library only. Every file is written through ``protocol.write_durable``
or ``protocol.create_durable`` and every step is recorded in the ledger. The
failpoints named in INTERFACES.md end the process with ``os._exit(137)`` when
``RECEIPTS_FAILPOINT`` names them, as if it had been killed there.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from receipts import protocol
from receipts.protocol import (
    DIGEST_SCHEMA,
    IDENTITY_V2,
    append_event,
    canonical_json,
    create_durable,
    exclusive_lock,
    format_time,
    load_json_strict,
    sha256_hex,
    utc_now,
    write_durable,
)

WRITER_DIR = ".writer"  # locks and the task counter; readers skip dot names
TASK_NUMBER_LOCK = "task-number.lock"
TASK_COUNTER = "task-counter"
MAX_SUBMISSION_ID_LENGTH = 256
# The seed's rule: tools run only while the run may still act. A run starts in
# "running" at attempt 1; "retrying" means the next attempt is due.
CALLABLE_STATES = ("running", "retrying")


def failpoint(name: str) -> None:
    if os.environ.get("RECEIPTS_FAILPOINT") == name:
        os._exit(137)


def _json_file(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, allow_nan=False).encode() + b"\n"


def read_json_file(path: Path) -> Any:
    """A strict read of one JSON file; ``None`` when it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return load_json_strict(data)


# --- run directories -------------------------------------------------------


def run_init(run_dir: Path, *, contract_sha256: str, attempts: int = 1, state: str = "running") -> None:
    """Create a run directory: state.json, steer.json and an empty ledger."""
    if not protocol.HEX64_RE.fullmatch(contract_sha256):
        raise ValueError("contract_sha256 must be 64 lowercase hex digits")
    run_dir = Path(run_dir)
    if not protocol.valid_run_id(run_dir.name):
        raise ValueError(f"{run_dir.name!r} is not a valid run_id")
    if (run_dir / "steer.json").exists():
        raise FileExistsError(f"{run_dir} is already a run directory")
    for folder in ("receipts", "submissions", "tasks", "confirmations"):
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    now = format_time(utc_now())
    write_durable(run_dir / "steer.json", _json_file({"contract_sha256": contract_sha256, "created_at": now}))
    (run_dir / protocol.LEDGER_NAME).touch()
    run_set_state(run_dir, state=state, attempts=attempts)


def run_set_state(run_dir: Path, *, state: str, attempts: int) -> None:
    now = format_time(utc_now())
    write_durable(Path(run_dir) / "state.json", _json_file({"name": state, "attempts": attempts, "updated_at": now}))
    append_event(run_dir, "state", {"state": state, "attempts": attempts})


def run_contract(run_dir: Path) -> str:
    steer = read_json_file(Path(run_dir) / "steer.json")
    contract = steer.get("contract_sha256") if isinstance(steer, dict) else None
    if not isinstance(contract, str) or not protocol.HEX64_RE.fullmatch(contract):
        raise ValueError(f"{run_dir}/steer.json has no contract_sha256 of 64 lowercase hex digits")
    return contract


def run_state(run_dir: Path) -> tuple[str, int]:
    """The run's state name and attempt count from state.json; ``ValueError`` when unreadable."""
    state = read_json_file(Path(run_dir) / "state.json")
    name = state.get("name") if isinstance(state, dict) else None
    attempts = state.get("attempts") if isinstance(state, dict) else None
    if not isinstance(name, str) or not protocol.is_whole_number(attempts):
        raise ValueError(f"{run_dir}/state.json needs a string name and a whole number of attempts")
    return name, attempts


def next_attempt(run_dir: Path) -> int:
    """The attempt a tool call belongs to now; ``ValueError`` when the state refuses calls.

    ``attempts`` while running; ``attempts + 1`` while retrying (the attempt
    that failed is behind us).
    """
    name, attempts = run_state(run_dir)
    if name not in CALLABLE_STATES:
        allowed = " or ".join(CALLABLE_STATES)
        raise ValueError(f"the run is {name[:64]!r}: tool calls are refused (only {allowed} allow them)")
    attempt = attempts + 1 if name == "retrying" else attempts
    if not 1 <= attempt <= protocol.MAX_INT:
        raise ValueError(f"state.json gives attempt {attempt}: attempts start at 1")
    return attempt


# --- task creation ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskResult:
    disposition: str
    action_taken: bool
    task_id: str | None
    task_path: str | None
    legacy: bool = False
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def submission_key(client_submission_id: str) -> str:
    return sha256_hex(client_submission_id.encode("utf-8"))


def render_task(task_id: str, request: Mapping[str, Any], client_submission_id: str | None) -> bytes:
    """The task file. Deterministic, so a resumed call can recognise its own file."""
    fields = protocol._normalise_text(protocol.semantic_request(request))
    lines = [f"# {task_id}: {fields['subject'] or '(no subject)'}", ""]
    for name in protocol.REQUEST_FIELDS:
        if name not in ("subject", "body") and fields[name] is not None:
            lines.append(f"- {name}: {json.dumps(fields[name], ensure_ascii=False)}")
    if client_submission_id is not None:
        lines.append(f"- client_submission_id: {json.dumps(client_submission_id, ensure_ascii=False)}")
    lines += ["", str(fields["body"] or ""), ""]
    return "\n".join(lines).encode("utf-8")


def _allocate_task_id(run_dir: Path) -> str:
    """The next task number, persisted before use so no two callers share one."""
    writer = run_dir / WRITER_DIR
    with exclusive_lock(writer / TASK_NUMBER_LOCK):
        counter = read_json_file(writer / TASK_COUNTER)
        number = counter.get("next") if isinstance(counter, dict) else 1 if counter is None else None
        if not protocol.is_whole_number(number, minimum=1):
            raise ValueError(f"{writer / TASK_COUNTER} is not a task counter: a person has to look")
        while (run_dir / "tasks" / f"TASK-{number:06d}.md").exists():
            number += 1
        write_durable(writer / TASK_COUNTER, _json_file({"next": number + 1}))
    return f"TASK-{number:06d}"


def _submission_event(
    run_dir: Path, result: TaskResult, client_submission_id: str | None, digest: str, **extra: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_digest": digest,
        "digest_schema_version": DIGEST_SCHEMA,
        "disposition": result.disposition,
        "action_taken": result.action_taken,
        "task_id": result.task_id,
        "legacy": result.legacy,
    }
    if client_submission_id is not None:
        fields["client_submission_id"] = client_submission_id
    if result.reason is not None:
        fields["reason"] = result.reason
    fields.update(extra)
    return append_event(run_dir, "submission", fields)


def write_task(run_dir: Path, request: Mapping[str, Any], client_submission_id: str | None = None) -> TaskResult:
    """Create a task at most once per ``client_submission_id``.

    The three-phase contract of RUN_DIRECTORY.md: reserved -> task_created ->
    committed, each persisted before the next step, under a per-submission
    lock. Returns the disposition (created, reused, conflict); one
    ``submission`` event is appended per call.
    """
    run_dir = Path(run_dir)
    if not isinstance(request, Mapping):
        raise ValueError("request must be a JSON object")
    digest = protocol.request_digest(request)
    if client_submission_id is None:
        return _write_legacy_task(run_dir, request, digest)
    if not isinstance(client_submission_id, str) or not 1 <= len(client_submission_id) <= MAX_SUBMISSION_ID_LENGTH:
        raise ValueError("client_submission_id must be a string of 1 to 256 characters")
    key = submission_key(client_submission_id)
    record_path = run_dir / "submissions" / f"{key}.json"
    # The event is appended under the submission's lock, so that the record can
    # say which event recorded its creation (see _record_creation_event).
    with exclusive_lock(run_dir / WRITER_DIR / f"submission-{key}.lock"):
        result = _write_task_locked(run_dir, request, client_submission_id, record_path, digest)
        if result.disposition == "reused":
            _recover_creation_event(run_dir, record_path, client_submission_id)
        event = _submission_event(run_dir, result, client_submission_id, digest)
        if result.disposition == "created":
            _note_creation_event(record_path, event["seq"])
    return result


def _note_creation_event(record_path: Path, seq: int) -> None:
    record = read_json_file(record_path)
    record["created_event_seq"] = seq
    write_durable(record_path, _json_file(record))


def _recover_creation_event(run_dir: Path, record_path: Path, client_submission_id: str) -> None:
    """Append the ``created`` event a crash kept out of the ledger, marked as recovered.

    The process that created the task may die between committing the record
    and appending its event; the history would then start with ``reused``. A
    committed record without ``created_event_seq`` is that case (or a record
    from before the field): the ledger is searched once, and the event is
    appended only when no ``created`` event for this submission is there.
    """
    record = read_json_file(record_path)
    if "created_event_seq" in record:
        return
    seq = next(
        (
            event.get("seq")
            for event in protocol.read_events(run_dir)
            if event.get("type") == "submission"
            and event.get("client_submission_id") == client_submission_id
            and event.get("disposition") == "created"
        ),
        None,
    )
    if seq is None:
        first = record["creation_result"]
        created = TaskResult("created", True, first.get("task_id"), first.get("task_path"))
        event = _submission_event(
            run_dir,
            created,
            client_submission_id,
            record["request_digest"],
            recovered=True,
            created_at=first.get("created_at"),
        )
        seq = event["seq"]
    record["created_event_seq"] = seq
    write_durable(record_path, _json_file(record))


def _write_legacy_task(run_dir: Path, request: Mapping[str, Any], digest: str) -> TaskResult:
    # No submission id: a new task every call, and no idempotency claimed.
    task_id = _allocate_task_id(run_dir)
    task_path = f"tasks/{task_id}.md"
    create_durable(run_dir / task_path, render_task(task_id, request, None))
    result = TaskResult("created", True, task_id, task_path, legacy=True)
    _submission_event(run_dir, result, None, digest)
    return result


def _record_problem(record: Any) -> str | None:
    """Why a submission record has a shape the writer cannot act on, or ``None``."""
    if not isinstance(record, dict) or record.get("state") not in protocol.SUBMISSION_STATES:
        return "no known state"
    for name in ("client_submission_id", "request_digest", "digest_schema_version", "task_id", "task_path"):
        if not isinstance(record.get(name), str):
            return f"{name} is not a string"
    if not isinstance(record.get("request"), dict):
        return "request is not an object"
    if record["state"] != "reserved" and not isinstance(record.get("task_sha256"), str):
        return "task_sha256 is not a string"
    if record["state"] == "committed" and not isinstance(record.get("creation_result"), dict):
        return "creation_result is not an object"
    return None


def _write_task_locked(
    run_dir: Path, request: Mapping[str, Any], client_submission_id: str, record_path: Path, digest: str
) -> TaskResult:
    try:
        record = read_json_file(record_path)
    except ValueError:
        # Never overwrite a record we cannot read: a person has to look.
        return TaskResult("conflict", False, None, None, reason="record_unreadable")
    now = format_time(utc_now())

    if record is None:
        task_id = _allocate_task_id(run_dir)
        record = {
            "client_submission_id": client_submission_id,
            "digest_schema_version": DIGEST_SCHEMA,
            "request_digest": digest,
            "request": protocol.semantic_request(request),
            "state": "reserved",
            "task_id": task_id,
            "task_path": f"tasks/{task_id}.md",
            "reserved_at": now,
            "updated_at": now,
        }
        write_durable(record_path, _json_file(record))
        failpoint("after_reserve")

    if _record_problem(record) is not None or record["client_submission_id"] != client_submission_id:
        return TaskResult("conflict", False, None, None, reason="record_invalid")
    task_id, task_path = record["task_id"], record["task_path"]
    if record["digest_schema_version"] != DIGEST_SCHEMA:
        return TaskResult("conflict", False, task_id, task_path, reason="digest_schema_version_differs")
    if record["request_digest"] != digest:
        return TaskResult("conflict", False, task_id, task_path, reason="request_digest_differs")
    if record["state"] == "committed":
        first = record["creation_result"]
        return TaskResult("reused", False, first.get("task_id", task_id), first.get("task_path", task_path))
    if not _safe_task_path(task_path):
        return TaskResult("conflict", False, task_id, task_path, reason="record_invalid")
    task_file = run_dir / task_path

    if record["state"] == "reserved":
        content = render_task(task_id, record["request"], client_submission_id)
        try:
            create_durable(task_file, content)
        except FileExistsError:
            if task_file.read_bytes() != content:
                return TaskResult("conflict", False, task_id, task_path, reason="task_file_differs")
            # Our own file from a call that died after creating it: adopt it.
        failpoint("after_task_file")
        record.update(state="task_created", task_sha256=sha256_hex(content), updated_at=format_time(utc_now()))
        write_durable(record_path, _json_file(record))
        failpoint("after_task_created")

    try:
        present = task_file.read_bytes()
    except FileNotFoundError:
        return TaskResult("conflict", False, task_id, task_path, reason="task_missing")
    if sha256_hex(present) != record.get("task_sha256"):
        return TaskResult("conflict", False, task_id, task_path, reason="task_digest_mismatch")
    now = format_time(utc_now())
    record.update(
        state="committed",
        updated_at=now,
        creation_result={
            "task_id": task_id,
            "task_path": task_path,
            "task_sha256": record["task_sha256"],
            "created_at": now,
        },
    )
    write_durable(record_path, _json_file(record))
    failpoint("after_commit")
    return TaskResult("created", True, task_id, task_path)


def _safe_task_path(task_path: Any) -> bool:
    if not isinstance(task_path, str) or not task_path.startswith("tasks/"):
        return False
    normal = posixpath.normpath(task_path)
    return normal == task_path and "/" not in normal[len("tasks/") :] and normal != "tasks/"


# --- tool calls through receipts ------------------------------------------


class Rejected(Exception):  # noqa: N818 - it is an outcome, not a failure of ours
    """The target refused or the request was invalid: nothing was executed."""

    def __init__(self, message: str, *, kind: str = "permanent") -> None:
        if kind not in ("retryable", "permanent"):
            raise ValueError(f"unknown rejection kind {kind!r}")
        super().__init__(message)
        self.kind = kind


class OutcomeUnknown(Exception):  # noqa: N818 - it is an outcome, not a failure of ours
    """The request may have taken effect (a timeout after sending)."""


class Adapter(Protocol):
    """A side-effecting tool. ``query`` exists only on adapters that can ask the target."""

    name: ClassVar[str]
    version: ClassVar[str]

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]: ...

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]: ...


def adapter_can_query(adapter: Any) -> bool:
    return callable(getattr(adapter, "query", None))


def _require_text(args: Mapping[str, Any], *names: str) -> dict[str, str]:
    if not isinstance(args, Mapping):
        raise Rejected("args must be a JSON object")
    unknown = set(args) - set(names)
    if unknown:
        raise Rejected(f"unknown argument(s): {', '.join(sorted(unknown))}")
    values = {}
    for name in names:
        value = args.get(name)
        if not isinstance(value, str):
            raise Rejected(f"argument {name!r} must be a string")
        values[name] = value
    return values


class WriteFile:
    """Writes ``content`` to ``RUN_DIR/workspace/<path>``; can check the file's digest."""

    name = "write_file"
    version = "1.0.0"

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        values = _require_text(args, "path", "content")
        path = posixpath.normpath(values["path"].replace("\\", "/"))
        if path.startswith(("/", "../")) or path in (".", "..") or "\x00" in path:
            raise Rejected(f"path {values['path']!r} leaves the workspace")
        return {"path": path, "content": values["content"]}

    def _target(self, run_dir: Path, args: Mapping[str, Any]) -> Path:
        return Path(run_dir) / "workspace" / args["path"]

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        target = self._target(run_dir, args)
        write_durable(target, args["content"].encode("utf-8"))
        return self._result(args, target.read_bytes())

    def query(self, run_dir: Path, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The result when the file holds the content already, else ``None``."""
        try:
            present = self._target(run_dir, args).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None
        if present != args["content"].encode("utf-8"):
            return None
        return self._result(args, present)

    def _result(self, args: Mapping[str, Any], present: bytes) -> dict[str, Any]:
        expected = sha256_hex(args["content"].encode("utf-8"))
        if sha256_hex(present) != expected:
            raise OutcomeUnknown("the file does not hold what was written")
        return {"path": f"workspace/{args['path']}", "file_sha256": expected}


class SendMessage:
    """Appends a message to ``RUN_DIR/outbox.jsonl``. Not queryable, as e-mail is not."""

    name = "send_message"
    version = "1.0.0"

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        values = _require_text(args, "to", "body")
        if not values["to"].strip():
            raise Rejected("argument 'to' is empty")
        return {"to": values["to"].strip(), "body": values["body"]}

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        # The call_id is the target's idempotency key, and the message id is what
        # the target gives back: a person checking the outbox finds the line by either.
        message_id = f"msg-{os.urandom(8).hex()}"
        message = {
            "call_id": call_id,
            "message_id": message_id,
            "to": args["to"],
            "body": args["body"],
            "sent_at": format_time(utc_now()),
        }
        line = canonical_json(message) + b"\n"
        with exclusive_lock(Path(run_dir) / WRITER_DIR / "outbox.lock"):
            fd = os.open(Path(run_dir) / "outbox.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                protocol.write_all(fd, line)
                os.fsync(fd)
            except protocol.ShortWriteError as error:
                if error.written == 0:
                    raise Rejected(f"the outbox took no byte: {error.strerror}", kind="retryable") from error
                # Part of the line is in the outbox: whether the message counts is not ours to say.
                raise OutcomeUnknown(f"the outbox write stopped short: {error.strerror}") from error
            finally:
                os.close(fd)
        return {"outbox": "outbox.jsonl", "remote_resource_id": message_id, "message_sha256": sha256_hex(line[:-1])}


BUILTIN_ADAPTERS: dict[str, Adapter] = {adapter.name: adapter for adapter in (WriteFile(), SendMessage())}


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    call_id: str
    status: str
    reused: bool
    result: dict[str, Any] | None
    error: dict[str, Any] | None = None
    needs: str | None = None  # "confirmation" when a person must decide

    def as_dict(self) -> dict[str, Any]:
        document = {"call_id": self.call_id, "status": self.status, "reused": self.reused, "result": self.result}
        if self.error:
            document["error"] = self.error
        if self.needs:
            document["needs"] = self.needs
        return document


def _new_receipt(adapter: Adapter, contract: str, attempt: int, args: dict[str, Any], identity: str) -> dict[str, Any]:
    """A receipt's fixed part: identity inputs and args never change after this."""
    return {
        "call_id": protocol.make_call_id(contract, attempt, adapter.name, args, adapter.version, identity),
        "identity": identity,
        "contract_sha256": contract,
        "attempt": attempt,
        "tool": adapter.name,
        "tool_version": adapter.version,
        "args": args,
        "input_sha256": protocol.input_sha256(args),
        "queryable": adapter_can_query(adapter),
    }


class Executor:
    """Runs tool calls through receipts: a committed call is never executed twice."""

    def __init__(self, run_dir: Path, adapters: Mapping[str, Adapter] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.adapters = dict(BUILTIN_ADAPTERS if adapters is None else adapters)
        misnamed = [key for key, adapter in self.adapters.items() if key != adapter.name]
        if misnamed:
            # The id is computed from the name the caller used, the receipt records adapter.name.
            raise ValueError(f"adapters registered under another name than their own: {', '.join(misnamed)}")

    def call(
        self, tool: str, args: Mapping[str, Any], *, attempt: int | None = None, identity: str = IDENTITY_V2
    ) -> CallOutcome:
        """Run one tool call through its receipt.

        ``attempt`` defaults to the run's (``next_attempt``); a run whose state
        refuses calls raises ``ValueError``, as does a record file the writer
        cannot read. ``identity`` is the call_id formula (``call-id-v1`` only for
        ids that must match a runtime written to the seed article).
        """
        adapter = self.adapters.get(tool)
        if adapter is None:
            raise ValueError(f"unknown tool {tool!r}; known: {', '.join(sorted(self.adapters))}")
        if identity not in protocol.IDENTITIES:
            raise ValueError(f"unknown identity formula {identity!r}; known: {', '.join(protocol.IDENTITIES)}")
        default_attempt = next_attempt(self.run_dir)
        attempt = default_attempt if attempt is None else attempt
        if not protocol.is_whole_number(attempt, minimum=1):
            raise ValueError("attempt must be a whole number from 1")
        contract = run_contract(self.run_dir)
        try:
            normalised = adapter.normalise(copy.deepcopy(dict(args)))
        except Rejected as rejection:
            normalised = copy.deepcopy(dict(args))
            return self._reject_unnormalisable(adapter, normalised, attempt, contract, identity, rejection)
        # The id is fixed from a private copy before the adapter sees the args,
        # so an adapter that mutates its input cannot move the identity.
        receipt = _new_receipt(adapter, contract, attempt, copy.deepcopy(normalised), identity)
        receipt_path = self.run_dir / "receipts" / f"{receipt['call_id']}.json"
        with exclusive_lock(self.run_dir / WRITER_DIR / f"call-{receipt['call_id']}.lock"):
            existing = read_receipt(receipt_path)
            if existing is not None:
                recovered = self._finish_crashed_commit(existing, receipt_path, contract)
                if recovered is not None:
                    return recovered
            protocol.remove_temp_files(receipt_path)
            if existing is not None:
                return self._resume(adapter, existing, receipt_path, contract)
            return self._execute(adapter, receipt, receipt_path)

    def _write_receipt(self, receipt: dict[str, Any], path: Path, before_replace: Any = None) -> None:
        now = format_time(utc_now())
        receipt.setdefault("created_at", now)
        receipt["updated_at"] = now
        write_durable(path, _json_file(receipt), before_replace)
        self._receipt_event(receipt)

    def _receipt_event(self, receipt: dict[str, Any], **extra: Any) -> None:
        fields = {key: receipt[key] for key in ("call_id", "tool", "attempt", "status")}
        append_event(self.run_dir, "receipt", fields | extra)

    def _finish_crashed_commit(self, existing: dict[str, Any], path: Path, contract: str) -> CallOutcome | None:
        """Complete the rename a crash interrupted, when its temp receipt proves the commit.

        The temp file was fsynced before the rename was due, so a complete one
        that says committed, for this very call, is the outcome: the effect
        happened and must not happen again. Anything less proves nothing and is
        removed by the caller.
        """
        if existing.get("status") not in ("prepared", "unknown"):
            return None
        call_id = path.stem
        if not protocol.check_receipt_identity(existing, call_id=call_id, contract_sha256=contract).verified:
            return None
        for temp in reversed(protocol.temp_files_of(path)):
            try:
                candidate = protocol.load_json_strict(temp.read_bytes())
            except (OSError, ValueError):
                continue
            if not isinstance(candidate, dict) or candidate.get("status") != "committed":
                continue
            if not protocol.check_receipt_identity(candidate, call_id=call_id, contract_sha256=contract).verified:
                continue
            if candidate.get("output_sha256") != protocol.input_sha256(candidate.get("result")):
                continue
            os.replace(temp, path)
            protocol.fsync_directory(path.parent)
            self._receipt_event(candidate, recovered=True)
            return CallOutcome(call_id, "committed", True, candidate.get("result"))
        return None

    def _execute(self, adapter: Adapter, receipt: dict[str, Any], path: Path) -> CallOutcome:
        receipt["status"] = "prepared"
        self._write_receipt(receipt, path)
        failpoint("after_prepared")
        return self._run_effect(adapter, receipt, path)

    def _run_effect(self, adapter: Adapter, receipt: dict[str, Any], path: Path) -> CallOutcome:
        try:
            result = adapter.execute(self.run_dir, copy.deepcopy(receipt["args"]), receipt["call_id"])
        except Rejected as rejection:
            return self._finish_rejected(receipt, path, rejection)
        except OutcomeUnknown as unknown:
            return self._finish_unknown(receipt, path, str(unknown))
        except Exception as error:  # noqa: BLE001 - any surprise after sending is an unknown outcome
            return self._finish_unknown(receipt, path, f"{type(error).__name__}: {error}")
        failpoint("after_effect")
        return self._commit(receipt, path, result)

    def _commit(self, receipt: dict[str, Any], path: Path, result: dict[str, Any]) -> CallOutcome:
        receipt.update(status="committed", result=result, output_sha256=protocol.input_sha256(result))
        receipt.pop("error", None)
        self._write_receipt(receipt, path, lambda: failpoint("after_temp_receipt"))
        return CallOutcome(receipt["call_id"], "committed", False, result)

    def _finish_rejected(self, receipt: dict[str, Any], path: Path, rejection: Rejected) -> CallOutcome:
        error = {"kind": rejection.kind, "message": str(rejection)}
        receipt.update(status="rejected", error=error)
        self._write_receipt(receipt, path)
        return CallOutcome(receipt["call_id"], "rejected", False, None, error)

    def _finish_unknown(self, receipt: dict[str, Any], path: Path, message: str) -> CallOutcome:
        receipt.update(status="unknown", error={"kind": "unknown", "message": message})
        self._write_receipt(receipt, path)
        return self._awaiting(receipt)

    def _awaiting(self, receipt: dict[str, Any]) -> CallOutcome:
        return CallOutcome(receipt["call_id"], receipt["status"], False, None, receipt.get("error"), "confirmation")

    def _reject_unnormalisable(
        self, adapter: Adapter, args: dict[str, Any], attempt: int, contract: str, identity: str, rejection: Rejected
    ) -> CallOutcome:
        # Args the schema refuses still get a receipt, so the refusal is on record.
        receipt = _new_receipt(adapter, contract, attempt, args, identity)
        path = self.run_dir / "receipts" / f"{receipt['call_id']}.json"
        with exclusive_lock(self.run_dir / WRITER_DIR / f"call-{receipt['call_id']}.lock"):
            existing = read_receipt(path)
            if existing is not None:
                return self._resume(adapter, existing, path, contract)
            return self._finish_rejected(receipt, path, rejection)

    def _resume(self, adapter: Adapter, receipt: dict[str, Any], path: Path, contract: str) -> CallOutcome:
        call_id, status = path.stem, receipt["status"]
        check = protocol.check_receipt_identity(receipt, call_id=call_id, contract_sha256=contract)
        if not check.verified:
            # The file at this call's path does not prove it holds this call: altered,
            # misfiled or incomplete. Reusing it could skip an effect that never
            # happened; re-running could repeat one. A person decides.
            error = {"kind": "unknown", "message": f"the receipt does not pass its identity check: {check.summary()}"}
            return CallOutcome(call_id, status, False, None, error, "confirmation")
        if status == "committed":
            append_event(self.run_dir, "call_reused", {"call_id": call_id})
            return CallOutcome(call_id, "committed", True, receipt.get("result"))
        if status == "rejected":
            # Not executed at this attempt; a retry goes under the next attempt.
            return CallOutcome(call_id, "rejected", False, None, receipt.get("error"))
        if status not in ("prepared", "unknown"):
            raise ValueError(f"receipt {call_id} has status {status[:32]!r}: a person has to look")
        confirmation = read_confirmation(self.run_dir, call_id, path.read_bytes())
        if confirmation is not None:
            if confirmation["resolution"] == "committed":
                append_event(self.run_dir, "call_reused", {"call_id": call_id})
                return CallOutcome(call_id, "committed", True, {"confirmation_id": confirmation["confirmation_id"]})
            error = {"kind": "retryable", "message": f"confirmed not done: {confirmation['reason']}"}
            return CallOutcome(call_id, "rejected", False, None, error)
        if adapter_can_query(adapter):
            found = adapter.query(self.run_dir, copy.deepcopy(receipt["args"]))
            if found is not None:
                return self._commit(receipt, path, found)
            # The target says the effect is absent, so running it now is safe.
            return self._run_effect(adapter, receipt, path)
        return self._awaiting(receipt)


def read_receipt(path: Path) -> dict[str, Any] | None:
    """The receipt at ``path``, ``None`` when there is none, ``ValueError`` when the writer cannot act on it."""
    try:
        receipt = read_json_file(path)
    except ValueError as error:
        raise ValueError(f"{path} is not a receipt the writer can read ({error}): a person has to look") from None
    if receipt is None:
        return None
    wrong = (
        ["a JSON object"]
        if not isinstance(receipt, dict)
        else [
            f"{name} as {kind.__name__}"
            for name, kind in (("call_id", str), ("status", str), ("tool", str), ("args", dict))
            if not isinstance(receipt.get(name), kind)
        ]
    )
    if wrong:
        needs = ", ".join(wrong)
        raise ValueError(f"{path} is not a receipt the writer can read (it needs {needs}): a person has to look")
    return receipt


def read_confirmation(run_dir: Path, call_id: str, receipt_bytes: bytes) -> dict[str, Any] | None:
    """The human decision for ``call_id`` when it is valid for these receipt bytes."""
    try:
        confirmation = read_json_file(Path(run_dir) / "confirmations" / f"{call_id}.json")
    except ValueError:
        return None
    if confirmation is None or confirmation_problem(confirmation, call_id, sha256_hex(receipt_bytes)) is not None:
        return None
    return confirmation


def confirmation_id(call_id: str, resolution: str, receipt_sha256: str) -> str:
    return sha256_hex(canonical_json({"call_id": call_id, "resolution": resolution, "receipt_sha256": receipt_sha256}))


def confirmation_problem(confirmation: Any, call_id: str, receipt_sha256: str | None) -> str | None:
    """Why a confirmation does not hold for the receipt with this digest, or ``None`` when it does."""
    if not isinstance(confirmation, dict) or confirmation.get("schema") != "confirmation/v1":
        return "not a confirmation/v1 document"
    if confirmation.get("call_id") != call_id:
        return "names another call_id"
    resolution = confirmation.get("resolution")
    if resolution not in ("committed", "rejected"):
        return f"resolution {resolution!r} is neither committed nor rejected"
    if receipt_sha256 is None:
        return "there is no receipt to confirm"
    if confirmation.get("receipt_sha256") != receipt_sha256:
        return "the receipt changed since the person saw it"
    if confirmation.get("confirmation_id") != confirmation_id(call_id, resolution, receipt_sha256):
        return "confirmation_id does not match"
    if not isinstance(confirmation.get("reason"), str) or not confirmation["reason"].strip():
        return "no reason given"
    return None
