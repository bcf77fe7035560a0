"""Tool calls through receipts: ``Executor``, and the ``CallOutcome`` it answers with.

A call's receipt is written ``prepared`` before the effect and ``committed``, ``rejected`` or
``unknown`` after it; a committed call is never executed twice, and nothing is called committed
that the writer cannot prove. A committed receipt is reused only with its evidence: it passes
its check (identity and outcome digest) and, where the adapter can look, the target still shows
that result. Each call runs under its lock (``call_records.HeldCall``), whose note lets the next
writer repair what a kill cut short.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.client import describe_adapter, outcome_of
from receipts.confined import read_file
from receipts.durable import (
    RecordingIncomplete,
    append_event,
    exclusive_lock,
    failpoint,
    json_file,
    read_events,
    recording,
    remove_temp_files,
    replace_durable,
    temp_files_of,
    write_durable,
)
from receipts.outcomes import CallOutcome
from receipts.protocol import WRITER_DIR, SigningKey, format_time, utc_now
from receipts.runs import UnsettledCalls, formula_for_new_calls, next_attempt, recorded_identity, run_contract
from receipts.runtime.attempts import check_other_attempts
from receipts.runtime.call_records import (
    HeldCall,
    commit_problem,
    file_size,
    read_confirmation,
    read_note,
    read_receipt,
    receipt_was_installed,
    recover_lost_confirmation_event,
    write_note,
)
from receipts.runtime.served import daemon_socket
from receipts.signing import key_for_run
from receipts.tools import NOT_DONE, Adapter, OutcomeUnknown, Rejected, adapter_can_query

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


class Executor:
    """Runs tool calls through receipts: a committed call is never executed twice."""

    def __init__(
        self, run_dir: Path, adapters: Mapping[str, Adapter] | None = None, *, writer_socket: str | None = None
    ) -> None:
        """``writer_socket``: a writer daemon's socket (``callproof serve``) that writes this run's
        records; by default ``RECEIPTS_WRITER_SOCKET``, and ``""`` is this process."""
        self.run_dir = Path(run_dir)
        self.writer_socket = daemon_socket(writer_socket)
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
        try:
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
                if read_note(held.lock_fd).get("installed"):
                    # The writer put a receipt here before: it was removed since, and whether the
                    # effect happened is nobody's guess but a person's. Running it again could repeat it.
                    message = "this call's receipt is gone, but the writer had put one in place: a person decides"
                    return CallOutcome(receipt["call_id"], None, False, None, {"kind": "unknown", "message": message},
                                       "confirmation")  # fmt: skip
                try:
                    check_other_attempts(
                        self.run_dir, adapter, receipt, contract, current_attempt, override_unsettled, key, recorded
                    )
                except UnsettledCalls as unsettled:
                    error = {"kind": "unsettled", "message": str(unsettled), "call_ids": unsettled.call_ids}
                    return CallOutcome(receipt["call_id"], None, False, None, error, "confirmation")
                return self._execute(adapter, receipt, held)
        except OSError as error:
            # An I/O error says nothing was done only when nothing of this call was: a receipt in
            # place says otherwise, read without the lock the error kept the writer from.
            in_doubt = self._outcome_despite(receipt["call_id"], error)
            if in_doubt is None:
                raise
            return in_doubt

    def _outcome_despite(self, call_id: str, error: OSError) -> CallOutcome | None:
        """``error`` stopped the call; when its receipt shows the effect happened or may have, that
        is said instead of the error (which reads as "nothing was done", exit 1): a committed call
        raises ``RecordingIncomplete`` (exit 5: never again as a new request), a call in doubt is
        an outcome that needs a person (exit 4). ``None``: no receipt says so. Nothing is written."""
        try:
            receipt = read_receipt(self.run_dir / "receipts" / f"{call_id}.json", self.run_dir)
        except (OSError, ValueError):
            return None
        if receipt is None or receipt.get("call_id") != call_id:
            return None
        status = receipt["status"]
        if status == "committed":
            raise RecordingIncomplete(CallOutcome(call_id, "committed", True, receipt.get("result")), error) from error
        if status in protocol.OPEN_STATUSES:
            message = (
                f"this call is {status}, in doubt, and the writer cannot act on it here ({error}): a person decides"
            )
            return CallOutcome(call_id, status, False, None, {"kind": "unknown", "message": message}, "confirmation")
        return None

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
                held = HeldCall(lock_fd, path, key, interrupted="receipt" in read_note(lock_fd))
                self._recover_lost_event(held)
                recover_lost_confirmation_event(self.run_dir, call_id, lock_fd, key)
                yield held
        finally:
            _CALLS_UNDER_WAY.reset(token)

    # --- receipts and their events ----------------------------------------------

    def _write_receipt(self, receipt: dict[str, Any], held: HeldCall, before_replace: Any = None) -> None:
        now = format_time(utc_now())
        receipt.setdefault("created_at", now)
        receipt["updated_at"] = now
        data = json_file(protocol.signed(receipt, held.key))
        self._install(held, receipt, lambda: write_durable(held.path, data, before_replace, root=self.run_dir))

    def _install(self, held: HeldCall, receipt: dict[str, Any], put_in_place: Callable[[], None], **extra: Any) -> None:
        """Put a receipt in place and append its event, with the note that lets a kill in between be repaired."""
        ledger_size = file_size(self.run_dir / protocol.LEDGER_NAME)
        before = read_note(held.lock_fd)
        # The mark stays as it was until the rename: a kill before it put nothing in place, and a
        # call whose first receipt never landed must run, not wait for a person.
        pending = {"receipt": receipt["status"], "ledger_size": ledger_size}
        write_note(held.lock_fd, {"installed": before.get("installed", False)} | pending)
        try:
            put_in_place()
        except BaseException:
            write_note(held.lock_fd, before)  # nothing was put in place
            raise
        if receipt["status"] == "committed":
            failpoint("after_commit_rename")
        self._receipt_event(receipt, **extra)
        # Kept for good: a receipt was put in place here, so one missing later was removed.
        write_note(held.lock_fd, {"installed": True}, durable=False)

    def _receipt_event(self, receipt: dict[str, Any], **extra: Any) -> None:
        fields = {key: receipt[key] for key in ("call_id", "tool", "attempt", "status")}
        append_event(self.run_dir, "receipt", fields | extra)

    def _recover_lost_event(self, held: HeldCall) -> None:
        """Append the receipt event a kill kept out of the ledger (the lock file's note says which)."""
        note = read_note(held.lock_fd)
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
        write_note(held.lock_fd, {"installed": installed}, durable=False)

    def _has_event(self, held: HeldCall, status: str, from_offset: int) -> bool:
        return any(
            event.get("type") == "receipt" and event.get("call_id") == held.call_id and event.get("status") == status
            for event in read_events(self.run_dir, from_offset)
        )

    def _finish_crashed_commit(
        self, adapter: Adapter, existing: dict[str, Any], held: HeldCall, contract: str
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

    def _execute(self, adapter: Adapter, receipt: dict[str, Any], held: HeldCall) -> CallOutcome:
        receipt["status"] = "prepared"
        self._write_receipt(receipt, held, lambda: failpoint("after_prepared_temp"))
        failpoint("after_prepared")
        return self._run_effect(adapter, receipt, held)

    def _run_effect(self, adapter: Adapter, receipt: dict[str, Any], held: HeldCall) -> CallOutcome:
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

    def _commit(self, receipt: dict[str, Any], held: HeldCall, result: dict[str, Any], *, reused: bool) -> CallOutcome:
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

    def _finish_rejected(self, receipt: dict[str, Any], held: HeldCall, rejection: Rejected) -> CallOutcome:
        error = {"kind": rejection.kind, "message": str(rejection)}
        receipt.update(status="rejected", error=error)
        self._write_receipt(receipt, held)
        return CallOutcome(receipt["call_id"], "rejected", False, None, error)

    def _finish_unknown(self, receipt: dict[str, Any], held: HeldCall, message: str) -> CallOutcome:
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

    def _resume(self, adapter: Adapter, receipt: dict[str, Any], held: HeldCall, contract: str) -> CallOutcome:
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

    def _resume_by_query(self, adapter: Adapter, receipt: dict[str, Any], held: HeldCall) -> CallOutcome:
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
