"""The writer: run directories and tool calls through receipts.

Standard library only. A call's receipt is written ``prepared`` before the
effect and ``committed``, ``rejected`` or ``unknown`` after it; a committed
call is never executed twice, and nothing is called committed that the writer
cannot prove. Task creation (``receipts.tasks``) and the tools
(``receipts.tools``) are re-exported here, as the interface docs name them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.durable import (
    append_event,
    exclusive_lock,
    failpoint,
    fsync_directory,
    json_file,
    read_json_file,
    remove_temp_files,
    temp_files_of,
    write_durable,
)
from receipts.protocol import CALLABLE_STATES, IDENTITY_V2, WRITER_DIR, format_time, sha256_hex, utc_now
from receipts.tasks import TaskResult, write_task
from receipts.tools import (
    BUILTIN_ADAPTERS,
    Adapter,
    OutcomeUnknown,
    Rejected,
    SendMessage,
    WriteFile,
    adapter_can_query,
)

__all__ = [
    "BUILTIN_ADAPTERS",
    "Adapter",
    "CallOutcome",
    "ConfirmationRefused",
    "Executor",
    "OutcomeUnknown",
    "Rejected",
    "SendMessage",
    "TaskResult",
    "WriteFile",
    "call_in_doubt",
    "confirm_call",
    "next_attempt",
    "read_confirmation",
    "read_receipt",
    "run_contract",
    "run_init",
    "run_set_state",
    "run_state",
    "write_task",
]

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
    for folder in protocol.RUN_FOLDERS:
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    now = format_time(utc_now())
    write_durable(run_dir / "steer.json", json_file({"contract_sha256": contract_sha256, "created_at": now}))
    (run_dir / protocol.LEDGER_NAME).touch()
    run_set_state(run_dir, state=state, attempts=attempts)


def run_set_state(run_dir: Path, *, state: str, attempts: int) -> None:
    now = format_time(utc_now())
    write_durable(Path(run_dir) / "state.json", json_file({"name": state, "attempts": attempts, "updated_at": now}))
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
            remove_temp_files(receipt_path)
            if existing is not None:
                return self._resume(adapter, existing, receipt_path, contract)
            return self._execute(adapter, receipt, receipt_path)

    def _write_receipt(self, receipt: dict[str, Any], path: Path, before_replace: Any = None) -> None:
        now = format_time(utc_now())
        receipt.setdefault("created_at", now)
        receipt["updated_at"] = now
        write_durable(path, json_file(receipt), before_replace)
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
        if existing.get("status") not in protocol.IN_DOUBT_STATUSES:
            return None
        call_id = path.stem
        if not protocol.check_receipt_identity(existing, call_id=call_id, contract_sha256=contract).verified:
            return None
        for temp in reversed(temp_files_of(path)):
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
            fsync_directory(path.parent)
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
        # A person's decision about exactly these receipt bytes comes first, whatever they say.
        confirmation = read_confirmation(self.run_dir, call_id, path.read_bytes())
        if confirmation is not None:
            if confirmation["resolution"] == "committed":
                append_event(self.run_dir, "call_reused", {"call_id": call_id})
                return CallOutcome(call_id, "committed", True, {"confirmation_id": confirmation["confirmation_id"]})
            error = {"kind": "retryable", "message": f"confirmed not done: {confirmation['reason']}"}
            return CallOutcome(call_id, "rejected", False, None, error)
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
        if status not in protocol.IN_DOUBT_STATUSES:
            raise ValueError(f"receipt {call_id} has status {status[:32]!r}: a person has to look")
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
    if confirmation is None:
        return None
    if protocol.confirmation_problem(confirmation, call_id, sha256_hex(receipt_bytes)) is not None:
        return None
    return confirmation


# --- a person's decision ------------------------------------------------------


class ConfirmationRefused(ValueError):  # noqa: N818 - a verdict, said to the person who asked
    """The confirmation was not written; ``reason`` says why in a person's words."""

    def __init__(self, reason: str, *, current_receipt_sha256: str = "", existing: dict[str, Any] | None = None):
        super().__init__(reason)
        self.current_receipt_sha256 = current_receipt_sha256
        self.existing = existing


def confirm_call(
    run_dir: Path,
    call_id: str,
    *,
    resolution: str,
    reason: str,
    actor: str,
    receipt_sha256: str,
    confirmed_at: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Write a person's decision about a call in doubt, for the runtime to follow.

    Under the call's lock (so a resuming runtime and a person never cross): the
    receipt must still be the bytes the person saw (``receipt_sha256``), and the
    call must still be in doubt (prepared, unknown, or a receipt that fails its
    identity check). ``confirmations/<call_id>.json`` is written durably and a
    ``confirmation`` event appended; if the event cannot be appended the file is
    removed again, so either both exist or neither. Returns the confirmation and
    whether it was written now (``False``: the same decision was already there,
    recorded once). Raises ``ConfirmationRefused`` otherwise.
    """
    run_dir = Path(run_dir)
    if resolution not in protocol.RESOLUTIONS:
        raise ConfirmationRefused(f"resolution must be one of {', '.join(protocol.RESOLUTIONS)}")
    if not isinstance(reason, str) or not reason.strip():
        raise ConfirmationRefused("a reason is required")
    if not protocol.valid_call_name(call_id) or not isinstance(actor, str) or not actor.strip():
        raise ConfirmationRefused("a call_id and an actor are required")
    with exclusive_lock(run_dir / WRITER_DIR / f"call-{call_id}.lock"):
        receipt_path = run_dir / "receipts" / f"{call_id}.json"
        try:
            receipt_bytes = receipt_path.read_bytes()
        except FileNotFoundError:
            raise ConfirmationRefused("there is no receipt for this call_id") from None
        current = sha256_hex(receipt_bytes)
        if current != receipt_sha256:
            raise ConfirmationRefused("the receipt changed since it was shown", current_receipt_sha256=current)
        if not call_in_doubt(run_dir, call_id, receipt_bytes):
            raise ConfirmationRefused("the call is not in doubt: its verified receipt says what happened")
        wanted = protocol.confirmation_id(call_id, resolution, receipt_sha256)
        existing = read_confirmation(run_dir, call_id, receipt_bytes)
        if existing is not None:
            if existing["confirmation_id"] == wanted:
                return existing, False
            raise ConfirmationRefused("another decision about this call is already on record", existing=existing)
        document = {
            "schema": protocol.CONFIRMATION_SCHEMA,
            "call_id": call_id,
            "resolution": resolution,
            "reason": reason.strip(),
            "actor": actor,
            "confirmed_at": confirmed_at or format_time(utc_now()),
            "receipt_sha256": receipt_sha256,
            "confirmation_id": wanted,
        }
        path = run_dir / "confirmations" / f"{call_id}.json"
        write_durable(path, json_file(document))
        event = {key: document[key] for key in ("call_id", "resolution", "actor", "reason", "confirmation_id")}
        try:
            append_event(run_dir, "confirmation", event | {"receipt_sha256": receipt_sha256})
        except OSError:
            path.unlink(missing_ok=True)
            raise
        return document, True


def call_in_doubt(run_dir: Path, call_id: str, receipt_bytes: bytes) -> bool:
    """Prepared, unknown, or a receipt that does not prove it is this call: a person may settle it."""
    try:
        receipt = protocol.load_json_strict(receipt_bytes)
    except ValueError:
        return True
    if not isinstance(receipt, dict):
        return True
    check = protocol.check_receipt_identity(receipt, call_id=call_id, contract_sha256=run_contract(run_dir))
    return receipt.get("status") in protocol.IN_DOUBT_STATUSES or not check.verified
