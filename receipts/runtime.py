"""The writer: tool calls through receipts, and a person's decision about a call in doubt.

Standard library only. A call's receipt is written ``prepared`` before the
effect and ``committed``, ``rejected`` or ``unknown`` after it; a committed
call is never executed twice, and nothing is called committed that the writer
cannot prove. A committed receipt is reused only with its evidence: it passes
its check (identity and outcome digest) and, where the adapter can look, the
target still shows that result. Run directories (``receipts.runs``), task
creation (``receipts.tasks``) and the tools (``receipts.tools``) are
re-exported here, as the interface docs name them.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts import protocol, runs, tasks
from receipts.client import describe_adapter, outcome_of
from receipts.client import writer_socket as writer_socket_from_env
from receipts.confined import UnsafePath, open_file, read_file, read_json_file
from receipts.durable import (
    RecordingIncomplete,
    append_event,
    exclusive_lock,
    failpoint,
    json_file,
    read_events,
    recording,
    remove_file,
    remove_temp_files,
    replace_durable,
    sweep_locks,
    sweep_temp_files,
    temp_files_of,
    write_durable,
)
from receipts.protocol import WRITER_DIR, SigningKey, format_time, sha256_hex, utc_now
from receipts.recovery import Decision, decide
from receipts.runs import (
    UnsettledCalls,
    formula_for_new_calls,
    next_attempt,
    recorded_identity,
    require_override,
    run_contract,
    run_identity,
    run_state,
    unsettled_calls,
)
from receipts.signing import key_for_run
from receipts.tasks import TaskResult
from receipts.tools import (
    BUILTIN_ADAPTERS,
    NOT_DONE,
    PRESENT,
    Adapter,
    OutcomeUnknown,
    Rejected,
    SendMessage,
    WriteFile,
    adapter_can_query,
)

__all__ = [
    "BUILTIN_ADAPTERS",
    "NOT_DONE",
    "Adapter",
    "CallOutcome",
    "ConfirmationRefused",
    "Executor",
    "OutcomeUnknown",
    "RecordingIncomplete",
    "Rejected",
    "SendMessage",
    "TaskResult",
    "UnsettledCalls",
    "WriteFile",
    "call_in_doubt",
    "confirm_call",
    "next_attempt",
    "read_confirmation",
    "read_receipt",
    "recorded_identity",
    "run_contract",
    "run_identity",
    "run_init",
    "run_set_state",
    "run_state",
    "sweep_locks",
    "sweep_temp_files",
    "unsettled_calls",
    "write_task",
]


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    call_id: str
    status: str | None  # None: the call was refused before it had a receipt
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


def _socket_or_env(writer_socket: str | None) -> str | None:
    """The writer daemon's socket a request goes to: the one given, else ``RECEIPTS_WRITER_SOCKET``;
    ``""`` or ``None`` in the end: this process writes."""
    return (writer_socket if writer_socket is not None else writer_socket_from_env()) or None


def run_init(
    run_dir: Path,
    *,
    contract_sha256: str,
    attempts: int = 1,
    state: str = "running",
    identity: str = protocol.IDENTITY_V2,
    writer_socket: str | None = None,
) -> None:
    """``runs.run_init``, by the writer daemon when one serves this process."""
    served_by = _socket_or_env(writer_socket)
    if served_by:
        from receipts import client

        client.request(served_by, "init", Path(run_dir), contract_sha256=contract_sha256, attempts=attempts,
                       state=state, identity=identity)  # fmt: skip
        return
    runs.run_init(Path(run_dir), contract_sha256=contract_sha256, attempts=attempts, state=state, identity=identity)


def run_set_state(
    run_dir: Path, *, state: str, attempts: int, override_unsettled: str | None = None, writer_socket: str | None = None
) -> None:
    """``runs.run_set_state``, by the writer daemon when one serves this process."""
    served_by = _socket_or_env(writer_socket)
    if served_by:
        from receipts import client

        client.request(served_by, "set_state", Path(run_dir), state=state, attempts=attempts,
                       override_unsettled=override_unsettled)  # fmt: skip
        return
    runs.run_set_state(Path(run_dir), state=state, attempts=attempts, override_unsettled=override_unsettled)


def write_task(
    run_dir: Path,
    request: Mapping[str, Any],
    client_submission_id: str | None = None,
    *,
    writer_socket: str | None = None,
) -> TaskResult:
    """``tasks.write_task``, by the writer daemon when one serves this process."""
    served_by = _socket_or_env(writer_socket)
    if served_by:
        from receipts import client

        result = client.request(served_by, "write_task", Path(run_dir), request=dict(request),
                                submission_id=client_submission_id)  # fmt: skip
        return TaskResult(**result)
    return tasks.write_task(Path(run_dir), request, client_submission_id)


# The calls this thread (or asyncio task) holds the lock of, by run and call_id.
_CALLS_UNDER_WAY: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "receipts_calls_under_way", default=frozenset()
)


def _require_recordable_args(args: dict[str, Any]) -> None:
    problem = protocol.record_value_problem(args, protocol.MAX_ARGS_BYTES)
    if problem is not None:
        raise ValueError(f"the arguments cannot be recorded: {problem}; nothing was done")


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


@dataclasses.dataclass(frozen=True)
class _Held:
    """One call under its lock: where its receipt lives, and the lock file that keeps its note.

    Before a receipt is put in place the writer notes in the lock file which
    status it is installing and how long the ledger was; the note is cleared
    once the receipt's event is appended. A kill in between leaves the note,
    and the next call for the same call_id appends the lost event (``recovered``).
    """

    lock_fd: int
    path: Path
    key: SigningKey | None  # the run's signing key (a signed run), or None
    # A kill cut an install short (the note still named a receipt when the lock was taken):
    # only then can temp receipts lie beside this one, so only then is the folder listed,
    # which at a hundred thousand receipts costs more than the call.
    interrupted: bool = False

    def check(self, receipt: Mapping[str, Any], contract: str) -> protocol.IdentityCheck:
        """The one receipt check, for this call, with the run's key."""
        return protocol.check_receipt_identity(
            receipt, call_id=self.call_id, contract_sha256=contract, signing_key=self.key
        )

    @property
    def call_id(self) -> str:
        return self.path.stem


class Executor:
    """Runs tool calls through receipts: a committed call is never executed twice."""

    def __init__(
        self, run_dir: Path, adapters: Mapping[str, Adapter] | None = None, *, writer_socket: str | None = None
    ) -> None:
        """``writer_socket``: a writer daemon's socket (``callproof serve``) that writes this run's
        records; by default ``RECEIPTS_WRITER_SOCKET``, and ``""`` is this process."""
        self.run_dir = Path(run_dir)
        self.writer_socket = _socket_or_env(writer_socket)
        self.adapters = dict(BUILTIN_ADAPTERS if adapters is None else adapters)
        misnamed = [key for key, adapter in self.adapters.items() if key != adapter.name]
        if misnamed:
            # The id is computed from the name the caller used, the receipt records adapter.name.
            raise ValueError(f"adapters registered under another name than their own: {', '.join(misnamed)}")

    def call(
        self,
        tool: str,
        args: Mapping[str, Any],
        *,
        attempt: int | None = None,
        identity: str | None = None,
        override_unsettled: str | None = None,
    ) -> CallOutcome:
        """Run one tool call through its receipt.

        ``attempt`` defaults to the run's (``next_attempt``); a run whose state
        refuses calls raises ``ValueError``, as does a record file the writer
        cannot read. ``identity``, when given, must be the run's formula (fixed
        at init). A new call whose intent is still in doubt at an earlier
        attempt is not run (``needs`` a confirmation) unless
        ``override_unsettled`` gives the reason, which goes to the ledger.
        """
        adapter = self.adapters.get(tool)
        if adapter is None:
            raise ValueError(f"unknown tool {tool!r}; known: {', '.join(sorted(self.adapters))}")
        if self.writer_socket:
            from receipts import client

            # What the wire cannot carry the writer could not record either: refused as in process.
            _require_recordable_args(dict(args))
            document = client.request(
                self.writer_socket, "call", self.run_dir, adapter, adapter=describe_adapter(adapter),
                args=dict(args), attempt=attempt, identity=identity, override_unsettled=override_unsettled,
            )  # fmt: skip
            return outcome_of(document)
        recorded = recorded_identity(self.run_dir)
        formula = formula_for_new_calls(recorded)
        if recorded is None and identity in protocol.IDENTITIES:
            formula = identity  # a run that records no formula takes the one its runtime names
        elif identity is not None and identity != formula:
            raise ValueError(
                f"the run's call_id formula is {formula}, fixed at init: a call under {identity!r} is refused"
            )
        current_attempt = next_attempt(self.run_dir)
        attempt = current_attempt if attempt is None else attempt
        if not protocol.is_whole_number(attempt, minimum=1) or attempt > current_attempt:
            # A later attempt starts with a state change, which waits for the calls in doubt.
            raise ValueError(f"attempt must be a whole number from 1 to the run's attempt, {current_attempt}")
        contract = run_contract(self.run_dir)
        key = key_for_run(self.run_dir)  # a signed run needs its key before anything is written
        try:
            normalised = adapter.normalise(copy.deepcopy(dict(args)))
        except Rejected as rejection:
            normalised = copy.deepcopy(dict(args))
            _require_recordable_args(normalised)
            return self._reject_unnormalisable(adapter, normalised, attempt, contract, formula, rejection, key)
        # Before anything is written: arguments recorded and not read back would stop every later
        # call of the run (each reads the receipts), a person's confirmation included.
        _require_recordable_args(normalised)
        # The id is fixed from a private copy before the adapter sees the args,
        # so an adapter that mutates its input cannot move the identity.
        receipt = _new_receipt(adapter, contract, attempt, copy.deepcopy(normalised), formula)
        if recorded is None and identity is None:
            # No formula recorded: new calls are the seed's (call-id-v1), and a receipt this
            # project wrote before it recorded one is call-id-v2: the intent's receipt under
            # that formula, when there is one, is this call's.
            earlier = _new_receipt(adapter, contract, attempt, copy.deepcopy(normalised), protocol.IDENTITY_V2)
            if self._receipt_or_mark(earlier["call_id"]) and not self._receipt_or_mark(receipt["call_id"]):
                receipt = earlier
        with self._lock(receipt["call_id"], key) as held:
            existing = read_receipt(held.path, self.run_dir)
            if existing is not None:
                recovered = self._finish_crashed_commit(adapter, existing, held, contract)
                if recovered is not None:
                    return recovered
            if held.interrupted:
                remove_temp_files(held.path, self.run_dir)
            if existing is not None:
                return self._resume(adapter, existing, held, contract)
            if _read_note(held.lock_fd).get("installed"):
                # The writer put a receipt here before: it was removed since, and whether the
                # effect happened is nobody's guess but a person's. Running it again could repeat it.
                message = "this call's receipt is gone, but the writer had put one in place: a person decides"
                return CallOutcome(receipt["call_id"], None, False, None, {"kind": "unknown", "message": message},
                                   "confirmation")  # fmt: skip
            try:
                self._check_other_attempts(
                    adapter, receipt, contract, current_attempt, override_unsettled, key, recorded
                )
            except UnsettledCalls as unsettled:
                error = {"kind": "unsettled", "message": str(unsettled), "call_ids": unsettled.call_ids}
                return CallOutcome(receipt["call_id"], None, False, None, error, "confirmation")
            return self._execute(adapter, receipt, held)

    def _receipt_or_mark(self, call_id: str) -> bool:
        """Whether the writer made a receipt for ``call_id``: one is there, or its lock says so."""
        return os.path.lexists(self.run_dir / "receipts" / f"{call_id}.json") or receipt_was_installed(
            self.run_dir, call_id
        )

    @contextlib.contextmanager
    def _lock(self, call_id: str, key: SigningKey | None) -> Any:
        path = self.run_dir / "receipts" / f"{call_id}.json"
        # A call made again from inside its own effect (a function that calls itself with the same
        # arguments) would wait for ever on the lock its caller holds: refused, said plainly.
        mine = f"{os.path.realpath(self.run_dir)}\x00{call_id}"
        held_here = _CALLS_UNDER_WAY.get()
        if mine in held_here:
            raise RuntimeError(
                f"call {call_id} ({self.run_dir.name}) calls itself with the same arguments from inside its own "
                "effect: it would wait for ever on its own lock"
            )
        token = _CALLS_UNDER_WAY.set(held_here | {mine})
        try:
            with exclusive_lock(self.run_dir / WRITER_DIR / f"call-{call_id}.lock", root=self.run_dir) as lock_fd:
                held = _Held(lock_fd, path, key, interrupted="receipt" in _read_note(lock_fd))
                self._recover_lost_event(held)
                _recover_lost_confirmation_event(self.run_dir, call_id, lock_fd, key)
                yield held
        finally:
            _CALLS_UNDER_WAY.reset(token)

    # --- receipts and their events ----------------------------------------------

    def _write_receipt(self, receipt: dict[str, Any], held: _Held, before_replace: Any = None) -> None:
        now = format_time(utc_now())
        receipt.setdefault("created_at", now)
        receipt["updated_at"] = now
        data = json_file(protocol.signed(receipt, held.key))
        self._install(held, receipt, lambda: write_durable(held.path, data, before_replace, root=self.run_dir))

    def _install(self, held: _Held, receipt: dict[str, Any], put_in_place: Callable[[], None], **extra: Any) -> None:
        """Put a receipt in place and append its event, with the note that lets a kill in between be repaired."""
        ledger_size = _size(self.run_dir / protocol.LEDGER_NAME)
        before = _read_note(held.lock_fd)
        # The mark stays as it was until the rename: a kill before it put nothing in place, and a
        # call whose first receipt never landed must run, not wait for a person.
        pending = {"receipt": receipt["status"], "ledger_size": ledger_size}
        _write_note(held.lock_fd, {"installed": before.get("installed", False)} | pending)
        try:
            put_in_place()
        except BaseException:
            _write_note(held.lock_fd, before)  # nothing was put in place
            raise
        if receipt["status"] == "committed":
            failpoint("after_commit_rename")
        self._receipt_event(receipt, **extra)
        # Kept for good: a receipt was put in place here, so one missing later was removed.
        _write_note(held.lock_fd, {"installed": True}, durable=False)

    def _receipt_event(self, receipt: dict[str, Any], **extra: Any) -> None:
        fields = {key: receipt[key] for key in ("call_id", "tool", "attempt", "status")}
        append_event(self.run_dir, "receipt", fields | extra)

    def _recover_lost_event(self, held: _Held) -> None:
        """Append the receipt event a kill kept out of the ledger (the lock file's note says which)."""
        note = _read_note(held.lock_fd)
        if note.get("receipt") is None:
            return
        status, ledger_size = note["receipt"], note["ledger_size"]
        try:
            current = read_receipt(held.path, self.run_dir)
        except ValueError:
            current = None
        # A receipt file there (readable or not) means the rename happened; none, with no mark
        # before it, means the kill came first (or a prepared receipt went before its effect began).
        installed = note["installed"] or os.path.lexists(held.path)
        if (  # this call's own receipt, at the status noted, with no event for it
            current is not None
            and current["call_id"] == held.call_id
            and current["status"] == status
            and (held.key is None or protocol.signature_problem(current, held.key) is None)
            and not self._has_event(held, status, ledger_size)
        ):
            self._receipt_event(current, recovered=True)
        _write_note(held.lock_fd, {"installed": installed}, durable=False)

    def _has_event(self, held: _Held, status: str, from_offset: int) -> bool:
        return any(
            event.get("type") == "receipt" and event.get("call_id") == held.call_id and event.get("status") == status
            for event in read_events(self.run_dir, from_offset)
        )

    def _finish_crashed_commit(
        self, adapter: Adapter, existing: dict[str, Any], held: _Held, contract: str
    ) -> CallOutcome | None:
        """Complete the rename a crash interrupted, when its temp receipt proves the commit.

        The temp file was fsynced before the rename was due, so a complete one
        that says committed, for this very call, with its outcome digest, is the
        outcome: the effect happened and must not happen again. Anything less
        proves nothing and is removed by the caller.
        """
        if existing["status"] not in protocol.OPEN_STATUSES or not held.interrupted:
            return None
        call_id = held.call_id
        if not held.check(existing, contract).verified:
            return None
        for temp in reversed(temp_files_of(held.path, self.run_dir)):
            try:
                candidate = protocol.load_json_strict(read_file(temp, self.run_dir))
            except (OSError, ValueError):
                continue
            if not isinstance(candidate, dict) or candidate.get("status") != "committed":
                continue
            # The check covers the outcome too: a committed receipt carries its result's digest.
            if not held.check(candidate, contract).verified:
                continue
            outcome = CallOutcome(call_id, "committed", True, candidate.get("result"))

            def rename(temp: Path = temp) -> None:
                replace_durable(temp, held.path, root=self.run_dir)

            with recording(outcome):
                self._install(held, candidate, rename, recovered=True)
            # The rename finished a commit; reusing it now still needs its target to show it.
            problem = commit_problem(self.run_dir, adapter, candidate)
            if problem is not None:
                append_event(self.run_dir, "reuse_refused", {"call_id": call_id, "reason": problem})
                return self._awaiting(candidate, problem)
            return outcome
        return None

    # --- running a call -----------------------------------------------------------

    def _check_other_attempts(
        self,
        adapter: Adapter,
        receipt: dict[str, Any],
        contract: str,
        current_attempt: int,
        override: str | None,
        key: SigningKey | None,
        recorded_formula: str | None,
    ) -> None:
        """The same intent still in doubt at another attempt of the run: running it now could make it twice."""
        attempt = receipt["attempt"]
        # A run that records no formula may hold the intent under either.
        formulas = [receipt["identity"]] if recorded_formula else list(protocol.IDENTITIES)
        unsettled = []
        for other in range(1, current_attempt + 1):
            for formula in formulas:
                if other == attempt and formula == receipt["identity"]:
                    continue
                call_id = protocol.make_call_id(
                    contract, other, adapter.name, receipt["args"], adapter.version, formula
                )
                decision = self._decision_of(adapter, call_id, contract, key)
                if decision is not None and protocol.in_doubt(decision.decision):
                    unsettled.append(call_id)
        if unsettled:
            action = f"call {receipt['call_id']} ({adapter.name}) at attempt {attempt}"
            require_override(self.run_dir, unsettled, override, action, f"attempt {attempt}")

    def _decision_of(self, adapter: Adapter, call_id: str, contract: str, key: SigningKey | None) -> Decision | None:
        """What a resume of one call would do, from its files and its target (``None``: never made)."""
        try:
            data = read_file(self.run_dir / "receipts" / f"{call_id}.json", self.run_dir)
        except FileNotFoundError:
            if receipt_was_installed(self.run_dir, call_id):
                return decide(status=None)  # a receipt that was there and is gone: a person decides
            return None
        try:
            receipt = protocol.load_json_strict(data)
        except ValueError:
            receipt = None
        if not isinstance(receipt, dict):
            return decide(status="", verification=protocol.UNVERIFIABLE)
        confirmation = read_confirmation(self.run_dir, call_id, data, key)
        error = receipt.get("error")
        check = protocol.check_receipt_identity(receipt, call_id=call_id, contract_sha256=contract, signing_key=key)
        verdict = check.verdict
        if verdict == protocol.VERIFIED and receipt.get("status") == "committed":
            # The writer would not reuse a commit its target does not show: neither is it settled.
            verdict = protocol.DISPUTED if commit_problem(self.run_dir, adapter, receipt) else verdict
        return decide(
            status=str(receipt.get("status")),
            error_kind=str(error.get("kind")) if isinstance(error, dict) else None,
            queryable=adapter_can_query(adapter),
            confirmation=confirmation["resolution"] if confirmation else None,
            verification=verdict,
        )

    def _execute(self, adapter: Adapter, receipt: dict[str, Any], held: _Held) -> CallOutcome:
        receipt["status"] = "prepared"
        self._write_receipt(receipt, held, lambda: failpoint("after_prepared_temp"))
        failpoint("after_prepared")
        return self._run_effect(adapter, receipt, held)

    def _run_effect(self, adapter: Adapter, receipt: dict[str, Any], held: _Held) -> CallOutcome:
        try:
            result = adapter.execute(self.run_dir, copy.deepcopy(receipt["args"]), receipt["call_id"])
        except Rejected as rejection:
            return self._finish_rejected(receipt, held, rejection)
        except OutcomeUnknown as unknown:
            return self._finish_unknown(receipt, held, str(unknown))
        except Exception as error:  # noqa: BLE001 - any surprise after sending is an unknown outcome
            return self._finish_unknown(receipt, held, f"{type(error).__name__}: {error}")
        failpoint("after_effect")
        return self._commit(receipt, held, result, reused=False)

    def _commit(self, receipt: dict[str, Any], held: _Held, result: dict[str, Any], *, reused: bool) -> CallOutcome:
        """Record a done effect. ``reused``: nothing ran now (a query found the effect already there).

        A result the writer cannot record and read back proves nothing: the call is ``unknown``
        (a person decides) and ``RecordingIncomplete`` says the effect is done (exit 5)."""
        problem = protocol.record_value_problem(result, protocol.MAX_RESULT_BYTES)
        if problem is not None:
            message = f"the effect is done, and the adapter's result cannot be recorded ({problem}): a person decides"
            outcome = self._finish_unknown(receipt, held, message)
            raise RecordingIncomplete(outcome, ValueError(message))
        receipt.update(status="committed", result=result, output_sha256=protocol.input_sha256(result))
        receipt.pop("error", None)
        outcome = CallOutcome(receipt["call_id"], "committed", reused, result)
        with recording(outcome):
            self._write_receipt(receipt, held, lambda: failpoint("after_temp_receipt"))
        return outcome

    def _finish_rejected(self, receipt: dict[str, Any], held: _Held, rejection: Rejected) -> CallOutcome:
        error = {"kind": rejection.kind, "message": str(rejection)}
        receipt.update(status="rejected", error=error)
        self._write_receipt(receipt, held)
        return CallOutcome(receipt["call_id"], "rejected", False, None, error)

    def _finish_unknown(self, receipt: dict[str, Any], held: _Held, message: str) -> CallOutcome:
        receipt.update(status="unknown", error={"kind": "unknown", "message": message})
        try:
            self._write_receipt(receipt, held)
        except (OSError, ValueError) as error:
            # The effect may have happened: the receipt stays prepared, in doubt, and a person decides.
            return self._awaiting(receipt, f"{message}; recording that the outcome is unknown failed too: {error}")
        return self._awaiting(receipt)

    def _awaiting(self, receipt: dict[str, Any], message: str | None = None, *, call_id: str = "") -> CallOutcome:
        """A person must decide. ``call_id``: the call asked for, when the receipt may claim another."""
        error = {"kind": "unknown", "message": message} if message else receipt.get("error")
        return CallOutcome(call_id or receipt["call_id"], receipt["status"], False, None, error, "confirmation")

    def _reject_unnormalisable(
        self,
        adapter: Adapter,
        args: dict[str, Any],
        attempt: int,
        contract: str,
        identity: str,
        rejection: Rejected,
        key: SigningKey | None,
    ) -> CallOutcome:
        # Args the schema refuses still get a receipt, so the refusal is on record.
        receipt = _new_receipt(adapter, contract, attempt, args, identity)
        with self._lock(receipt["call_id"], key) as held:
            existing = read_receipt(held.path, self.run_dir)
            if existing is not None:
                return self._resume(adapter, existing, held, contract)
            return self._finish_rejected(receipt, held, rejection)

    # --- a receipt that is already there -------------------------------------------

    def _resume(self, adapter: Adapter, receipt: dict[str, Any], held: _Held, contract: str) -> CallOutcome:
        call_id, status = held.call_id, receipt["status"]
        # A person's decision about exactly these receipt bytes comes first, whatever they say.
        confirmation = read_confirmation(self.run_dir, call_id, read_file(held.path, self.run_dir), held.key)
        if confirmation is not None:
            if confirmation["resolution"] == "committed":
                # A commit a person stood by gives its recorded answer; a call settled as done
                # with none on record (prepared, unknown) gives the decision that stands for it.
                recorded = receipt.get("result") if status == "committed" else None
                answer = (
                    recorded if isinstance(recorded, dict) else {"confirmation_id": confirmation["confirmation_id"]}
                )
                return self._reused(call_id, answer)
            error = {"kind": "retryable", "message": f"confirmed not done: {confirmation['reason']}"}
            return CallOutcome(call_id, "rejected", False, None, error)
        check = held.check(receipt, contract)
        if not check.verified:
            # The file at this call's path does not prove it holds this call (or the outcome it
            # claims): altered, misfiled or incomplete. Reusing it could skip an effect that
            # never happened; re-running could repeat one. A person decides.
            message = f"the receipt does not pass its identity check: {check.summary()}"
            return self._awaiting(receipt, message, call_id=call_id)
        if status == "committed":
            problem = commit_problem(self.run_dir, adapter, receipt)
            if problem is not None:
                append_event(self.run_dir, "reuse_refused", {"call_id": call_id, "reason": problem})
                return self._awaiting(receipt, problem)
            return self._reused(call_id, receipt.get("result"))
        if status == "rejected":
            # Not executed at this attempt; a retry goes under the next attempt.
            return CallOutcome(call_id, "rejected", False, None, receipt.get("error"))
        if status not in protocol.OPEN_STATUSES:
            raise ValueError(f"receipt {call_id} has status {status[:32]!r}: a person has to look")
        if adapter_can_query(adapter):
            return self._resume_by_query(adapter, receipt, held)
        return self._awaiting(receipt)

    def _reused(self, call_id: str, result: dict[str, Any] | None) -> CallOutcome:
        outcome = CallOutcome(call_id, "committed", True, result)
        with recording(outcome):
            append_event(self.run_dir, "call_reused", {"call_id": call_id})
        return outcome

    def _resume_by_query(self, adapter: Adapter, receipt: dict[str, Any], held: _Held) -> CallOutcome:
        """Ask the target: only "it happened" or "it did not" moves the call; anything else waits for a person."""
        try:
            # query is optional, outside the Adapter protocol: the caller asked adapter_can_query first.
            answer = adapter.query(self.run_dir, copy.deepcopy(receipt["args"]), receipt["call_id"])  # type: ignore[attr-defined]
        except OutcomeUnknown as unknown:
            return self._awaiting(receipt, f"the target cannot tell whether it happened: {unknown}")
        except Exception as error:  # noqa: BLE001 - a query that fails tells nothing either way
            return self._awaiting(receipt, f"the query failed, so nobody knows: {type(error).__name__}: {error}")
        if answer is NOT_DONE:
            # Positive evidence that the effect is absent: running it now makes it once.
            return self._run_effect(adapter, receipt, held)
        if isinstance(answer, dict):
            return self._commit(receipt, held, answer, reused=True)
        return self._awaiting(receipt, f"the query gave no answer the writer can act on: {type(answer).__name__}")


def commit_problem(run_dir: Path, adapter: Any, receipt: Mapping[str, Any]) -> str | None:
    """Why the target does not back a committed receipt (that passes its check), or ``None`` when it does.

    Only an adapter with ``evidence`` can look; for one without, or one whose ``checks_commits``
    is false (its evidence can only say where a person would look), the receipt's own check is
    all the evidence there is.
    """
    evidence = getattr(adapter, "evidence", None)
    if evidence is None or getattr(adapter, "checks_commits", True) is False:
        # An adapter that cannot look at its target (it says so): the receipt's own check is all.
        return None
    args, result = copy.deepcopy(receipt.get("args")), copy.deepcopy(receipt.get("result"))
    try:
        found = evidence(Path(run_dir), args, receipt["call_id"], result=result)
    except Exception as error:  # noqa: BLE001 - the adapter's code: whatever it raises, nobody has looked
        return f"the target could not be read to check the commit: {type(error).__name__}: {error}"
    if getattr(found, "verdict", None) == PRESENT:
        return None
    facts = "; ".join(getattr(found, "facts", ())) or "no facts"
    return f"the target does not show this committed result ({facts}): a person decides"


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _write_note(fd: int, note: dict[str, Any], *, durable: bool = True) -> None:
    """Replace the lock file's note. Written over the old one, then cut to length: a kill in
    between leaves the new note first, which is all ``_read_note`` reads."""
    data = json.dumps(note, separators=(",", ":")).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    if durable:
        # Before the receipt is put in place: a machine that stops right after the rename
        # must still find the note, or the lost event would never come back.
        os.fsync(fd)


def _read_note(fd: int) -> dict[str, Any]:
    """``{"installed": bool}``, with ``receipt`` and ``ledger_size`` while a receipt is being put in place."""
    text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    try:
        note, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return {}
    if not isinstance(note, dict):
        return {}
    found: dict[str, Any] = {"installed": note.get("installed") is True}
    if not protocol.is_whole_number(note.get("ledger_size")):
        return found
    if note.get("receipt") in protocol.RECEIPT_STATUSES:
        found |= {"receipt": note["receipt"], "ledger_size": note["ledger_size"]}
    elif isinstance(note.get("confirmation"), str) and protocol.HEX64_RE.fullmatch(note["confirmation"]):
        found |= {"confirmation": note["confirmation"], "ledger_size": note["ledger_size"]}
    return found


def _recover_lost_confirmation_event(run_dir: Path, call_id: str, lock_fd: int, key: SigningKey | None) -> None:
    """Append the ``confirmation`` event a kill kept out of the ledger after its file was written
    (the lock file's note names the confirmation): a decision delivered again finds it recorded once.

    Only for a confirmation the writer can stand behind (signed with the run's key in a signed
    run, whole and consistent): anyone who can write the run can plant a note and a file, and
    the writer would sign its line for them."""
    note = _read_note(lock_fd)
    wanted = note.get("confirmation")
    if wanted is None:
        return
    try:
        document = read_json_file(run_dir / "confirmations" / f"{call_id}.json", run_dir)
    except ValueError:
        document = None
    recorded = any(
        event.get("type") == "confirmation" and event.get("confirmation_id") == wanted
        for event in read_events(run_dir, note["ledger_size"])
    )
    verified = (
        isinstance(document, dict)
        and document.get("confirmation_id") == wanted
        and protocol.confirmation_problem(document, call_id, document.get("receipt_sha256"), key) is None
    )
    if verified and not recorded:
        append_event(run_dir, "confirmation", _confirmation_event(document) | {"recovered": True})
    _write_note(lock_fd, {"installed": note["installed"]}, durable=False)


def _confirmation_event(document: Mapping[str, Any]) -> dict[str, Any]:
    fields = ("call_id", "resolution", "actor", "reason", "confirmation_id", "receipt_sha256")
    return {key: document.get(key) for key in fields}


def receipt_was_installed(run_dir: Path, call_id: str) -> bool:
    """Whether the writer put a receipt in place for ``call_id`` (its lock file keeps the mark)."""
    try:
        fd = open_file(Path(run_dir) / WRITER_DIR / f"call-{call_id}.lock", Path(run_dir), os.O_RDONLY)
    except (OSError, UnsafePath):  # absent, or not a lock the writer made
        return False
    try:
        return _read_note(fd).get("installed", False)
    finally:
        os.close(fd)


def read_receipt(path: Path, run_dir: Path) -> dict[str, Any] | None:
    """The receipt at ``path``, ``None`` when there is none, ``ValueError`` when the writer cannot act on it."""
    try:
        receipt = read_json_file(path, run_dir)
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


def read_confirmation(
    run_dir: Path, call_id: str, receipt_bytes: bytes, key: SigningKey | None = None
) -> dict[str, Any] | None:
    """The human decision for ``call_id`` when it is valid for these receipt bytes (signed, in a signed run)."""
    try:
        confirmation = read_json_file(Path(run_dir) / "confirmations" / f"{call_id}.json", Path(run_dir))
    except ValueError:
        return None
    if confirmation is None:
        return None
    if protocol.confirmation_problem(confirmation, call_id, sha256_hex(receipt_bytes), key) is not None:
        return None
    return confirmation


# --- a person's decision ------------------------------------------------------


class ConfirmationRefused(ValueError):  # noqa: N818 - a verdict, said to the person who asked
    """The confirmation was not written; ``reason`` says why in a person's words."""

    def __init__(self, reason: str, *, current_receipt_sha256: str = "", existing: dict[str, Any] | None = None):
        super().__init__(reason)
        self.current_receipt_sha256 = current_receipt_sha256
        self.existing = existing


def refusal_text(refused: ConfirmationRefused) -> str:
    """Why a decision was not written, as the dashboard says it (the host's delivery and the
    shipper's say the same)."""
    if refused.current_receipt_sha256:
        return (
            "the receipt changed after the decision was made (the runtime moved on): the decision holds to "
            f"bytes that are no longer there (now {refused.current_receipt_sha256[:12]}…)"
        )
    if refused.existing is not None:
        other = refused.existing
        return (
            f"the run directory already holds another decision: {other.get('actor')} settled it as "
            f"{other.get('resolution')} at {protocol.human_time(other.get('confirmed_at'))}"
        )
    return str(refused)


def confirm_call(
    run_dir: Path,
    call_id: str,
    *,
    resolution: str,
    reason: str,
    actor: str,
    receipt_sha256: str,
    confirmed_at: str | None = None,
    writer_socket: str | None = None,
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
    served_by = _socket_or_env(writer_socket)
    if served_by:
        from receipts import client

        answer = client.request(served_by, "confirm", run_dir, call_id=call_id, resolution=resolution, reason=reason,
                                actor=actor, receipt_sha256=receipt_sha256, confirmed_at=confirmed_at)  # fmt: skip
        return answer["document"], bool(answer["written"])
    if resolution not in protocol.RESOLUTIONS:
        raise ConfirmationRefused(f"resolution must be one of {', '.join(protocol.RESOLUTIONS)}")
    if not isinstance(reason, str) or not reason.strip():
        raise ConfirmationRefused("a reason is required")
    if not protocol.valid_call_name(call_id) or not isinstance(actor, str) or not actor.strip():
        raise ConfirmationRefused("a call_id and an actor are required")
    signing_key = key_for_run(run_dir)  # in a signed run, only a signed decision holds
    with exclusive_lock(run_dir / WRITER_DIR / f"call-{call_id}.lock", root=run_dir) as lock_fd:
        _recover_lost_confirmation_event(run_dir, call_id, lock_fd, signing_key)
        receipt_path = run_dir / "receipts" / f"{call_id}.json"
        try:
            receipt_bytes = read_file(receipt_path, run_dir)
        except FileNotFoundError:
            raise ConfirmationRefused("there is no receipt for this call_id") from None
        current = sha256_hex(receipt_bytes)
        if current != receipt_sha256:
            raise ConfirmationRefused("the receipt changed since it was shown", current_receipt_sha256=current)
        if not call_in_doubt(run_dir, call_id, receipt_bytes, signing_key=signing_key):
            raise ConfirmationRefused("the call is not in doubt: its verified receipt says what happened")
        wanted = protocol.confirmation_id(call_id, resolution, receipt_sha256)
        existing = read_confirmation(run_dir, call_id, receipt_bytes, signing_key)
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
        # As a receipt's: a note first, so that a kill between the file and its event is repaired
        # by the next writer under this lock (``_recover_lost_confirmation_event``).
        before = _read_note(lock_fd)
        installed = before.get("installed", False)
        pending = {"confirmation": wanted, "ledger_size": _size(run_dir / protocol.LEDGER_NAME)}
        _write_note(lock_fd, {"installed": installed} | pending)
        write_durable(path, json_file(protocol.signed(document, signing_key)), root=run_dir)
        failpoint("after_confirmation_file")
        try:
            append_event(run_dir, "confirmation", _confirmation_event(document))
        except (OSError, ValueError):  # a full disk, or a ledger that is a symlink (UnsafePath)
            remove_file(path, run_dir)
            _write_note(lock_fd, before)
            raise
        _write_note(lock_fd, {"installed": installed}, durable=False)
        return document, True


def call_in_doubt(
    run_dir: Path,
    call_id: str,
    receipt_bytes: bytes,
    adapters: Mapping[str, Any] = BUILTIN_ADAPTERS,
    signing_key: SigningKey | None = None,
) -> bool:
    """Whether a person may settle the call: its recovery decision, made from its receipt (and,
    for a commit, its target) with no confirmation, waits for someone (``protocol.in_doubt``).

    Prepared, unknown, a receipt that does not prove it is this call, a commit its target does
    not show (the writer would not reuse it), a legacy "failed": yes. Rejected or a proven
    commit: no.
    """
    try:
        receipt = protocol.load_json_strict(receipt_bytes)
    except ValueError:
        return True
    if not isinstance(receipt, dict):
        return True
    contract = run_contract(run_dir)
    check = protocol.check_receipt_identity(receipt, call_id=call_id, contract_sha256=contract, signing_key=signing_key)
    status = receipt.get("status") if isinstance(receipt.get("status"), str) else ""
    verification = check.verdict
    if check.verified and status == "committed":
        tool = receipt.get("tool")
        adapter = adapters.get(tool) if isinstance(tool, str) else None
        if commit_problem(run_dir, adapter, receipt) is not None:
            verification = protocol.DISPUTED
    return protocol.in_doubt(decide(status=status, verification=verification).decision)
