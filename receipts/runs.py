"""A run directory's own files, and the rules a runtime must follow before it acts.

Standard library only. ``steer.json`` fixes the contract and the call_id
formula at ``init``; ``state.json`` says what the run may do now. Tools run and
tasks are created only while the run is ``running`` or ``retrying``, and a new
attempt (which gives every intent a new call_id) waits until no call of an
earlier attempt is in doubt: otherwise an effect that may have happened would
be made again under another id.
"""

from __future__ import annotations

import contextvars
import os
import pwd
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import read_json_file
from receipts.durable import append_event, json_file, write_durable
from receipts.protocol import CALLABLE_STATES, IDENTITY_V1, IDENTITY_V2, format_time, utc_now
from receipts.signing import key_for_new_run, key_for_run, new_run_uid, run_keys, writer_key

# The highest attempt the writer acts at. Before it runs a call it looks for the same intent
# in doubt at every earlier attempt (one digest and one stat each), so the count is bounded.
MAX_ATTEMPTS = 10_000
STATE_NAME_RE = re.compile(r"[^\x00-\x1f\x7f]{1,64}")


class UnsettledCalls(ValueError):  # noqa: N818 - a refusal, said to the person who asked
    """A new attempt refused: these calls of earlier attempts are still in doubt."""

    def __init__(self, message: str, call_ids: list[str]) -> None:
        super().__init__(message)
        self.call_ids = call_ids


def run_init(
    run_dir: Path, *, contract_sha256: str, attempts: int = 1, state: str = "running", identity: str = IDENTITY_V2
) -> None:
    """Create a run directory: steer.json (contract and call_id formula), state.json, an empty ledger."""
    if not protocol.HEX64_RE.fullmatch(contract_sha256):
        raise ValueError("contract_sha256 must be 64 lowercase hex digits")
    if identity not in protocol.IDENTITIES:
        raise ValueError(f"unknown identity formula {identity!r}; known: {', '.join(protocol.IDENTITIES)}")
    _check_state(state, attempts)
    run_dir = Path(run_dir)
    if not protocol.valid_run_id(run_dir.name):
        raise ValueError(f"{run_dir.name!r} is not a valid run_id")
    if (run_dir / "steer.json").exists():
        raise FileExistsError(f"{run_dir} is already a run directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        # What is there (receipts, a ledger) was made under a contract and formula this init would replace.
        raise FileExistsError(f"{run_dir} is not empty: a run is made in a new directory")
    for folder in protocol.RUN_FOLDERS:
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    now = format_time(utc_now())
    steer = {"contract_sha256": contract_sha256, "created_at": now, "identity": identity}
    if writer_key() is not None:
        steer["run_uid"] = new_run_uid()  # what its signatures are bound to: this run, not its name
    key = key_for_new_run(run_dir, steer)
    if key is not None:
        steer["signing_key_id"] = key.key_id  # a signed run: every record the writer makes is signed
    write_durable(run_dir / "steer.json", json_file(protocol.signed(steer, key)), root=run_dir)
    (run_dir / protocol.LEDGER_NAME).touch()
    _write_state(run_dir, state, attempts, attempt_of(state, attempts) or 0)


def run_set_state(run_dir: Path, *, state: str, attempts: int, override_unsettled: str | None = None) -> None:
    """Record the run's state. A state that starts a new attempt is refused (``UnsettledCalls``)
    while a call of an earlier attempt is in doubt, unless ``override_unsettled`` gives the
    reason, which goes to the ledger with the calls it passes over."""
    _check_state(state, attempts)
    key_for_run(Path(run_dir))  # a signed run's state changes only with its key (the event is signed)
    try:
        _, current_attempts, reached = _read_state(run_dir)
    except ValueError:
        current_attempts = reached = 0  # a state the writer cannot read is replaced; the calls are checked below
    new_attempt = attempt_of(state, attempts)
    # Attempts only grow, for the number in the file and for the attempt a call runs at (retrying/1
    # runs calls at attempt 2, running/1 at attempt 1): going back would reach calls of an attempt
    # left behind, in doubt, under other call_ids, and make their effects again.
    if attempts < current_attempts:
        raise ValueError(
            f"attempts only grow: the run is at {current_attempts} (calls at attempt {reached}), "
            f"not going back to {attempts}"
        )
    if new_attempt is not None and new_attempt < reached:
        raise ValueError(
            f"attempts only grow: calls have run at attempt {reached}, and {state} with attempts {attempts} "
            f"would run them at attempt {new_attempt}"
        )
    if new_attempt is not None:
        unsettled = [call_id for call_id, at in unsettled_calls(run_dir) if at is None or at < new_attempt]
        if unsettled:
            require_override(
                run_dir, unsettled, override_unsettled, f"state {state}, attempts {attempts}", f"attempt {new_attempt}"
            )
    _write_state(Path(run_dir), state, attempts, max(reached, new_attempt or 0))


def _check_state(state: Any, attempts: Any) -> None:
    if not isinstance(state, str) or not STATE_NAME_RE.fullmatch(state):
        raise ValueError("the state name must be 1 to 64 characters, none of them a control character")
    if not protocol.is_whole_number(attempts, minimum=1) or attempts > MAX_ATTEMPTS:
        raise ValueError(f"attempts must be a whole number from 1 to {MAX_ATTEMPTS}")


def _write_state(run_dir: Path, state: str, attempts: int, reached: int) -> None:
    now = format_time(utc_now())
    write_durable(
        run_dir / "state.json",
        json_file({"name": state, "attempts": attempts, "attempt_reached": reached, "updated_at": now}),
        root=run_dir,
    )
    append_event(run_dir, "state", {"state": state, "attempts": attempts})


# Who passes over calls in doubt (``require_override``): the writer's own user, or, under
# ``callproof serve``, the settler the daemon serves (the kernel's word for it, SO_PEERCRED).
OVERRIDER: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar("overrider", default=None)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def require_override(run_dir: Path, call_ids: list[str], reason: str | None, action: str, what: str) -> None:
    """Refuse ``action`` over the unsettled ``call_ids``, or record the person's reason for going on,
    with who gave it (a uid, and its user's name): the writer's own user, or the settler the
    daemon serves (``OVERRIDER``)."""
    if reason is None:
        names = ", ".join(call_ids[:10]) + (f" and {len(call_ids) - 10} more" if len(call_ids) > 10 else "")
        raise UnsettledCalls(
            f"{len(call_ids)} call(s) of an earlier attempt are in doubt and would be made again under new "
            f"call_ids at {what}: settle them first (a person confirms them), or override with a reason: {names}",
            call_ids,
        )
    if not reason.strip():
        raise ValueError("an override of calls in doubt needs a reason")
    uid, user = OVERRIDER.get() or (os.geteuid(), _user_name(os.geteuid()))
    append_event(run_dir, "unsettled_override", {"action": action, "call_ids": call_ids, "reason": reason.strip(),
                                                 "uid": uid, "user": user})  # fmt: skip


def attempt_of(state: str, attempts: int) -> int | None:
    """The attempt a call belongs to in this state, or ``None`` when the state refuses calls.

    ``attempts`` while running; ``attempts + 1`` while retrying (the attempt
    that failed is behind us).
    """
    if state not in CALLABLE_STATES:
        return None
    return attempts + 1 if state == "retrying" else attempts


def run_contract(run_dir: Path) -> str:
    contract = _steer(run_dir).get("contract_sha256")
    if not isinstance(contract, str) or not protocol.HEX64_RE.fullmatch(contract):
        raise ValueError(f"{run_dir}/steer.json has no contract_sha256 of 64 lowercase hex digits")
    return contract


def run_identity(run_dir: Path) -> str:
    """The run's call_id formula for new calls, fixed at init. A run whose steer.json records none
    was written to the seed article (its steer.json holds the contract alone): call-id-v1, the
    article's formula. ``recorded_identity`` tells the two apart."""
    return formula_for_new_calls(recorded_identity(run_dir))


def formula_for_new_calls(recorded: str | None) -> str:
    """The formula of a run's new calls, from what its steer.json records (``recorded_identity``)."""
    return recorded or IDENTITY_V1


def recorded_identity(run_dir: Path) -> str | None:
    """The formula steer.json records, or ``None`` for a run that records none: the seed
    article's runs, and this project's before it recorded one (whose receipts are call-id-v2
    and say so in their own ``identity``: ``Executor`` finds them under either formula)."""
    identity = _steer(run_dir).get("identity")
    if identity is not None and identity not in protocol.IDENTITIES:
        raise ValueError(f"{run_dir}/steer.json names an unknown identity formula: a person has to look")
    return identity


def _steer(run_dir: Path) -> dict[str, Any]:
    steer = read_json_file(Path(run_dir) / "steer.json", Path(run_dir))
    if not isinstance(steer, dict):
        raise ValueError(f"{run_dir}/steer.json is not a JSON object: a person has to look")
    return steer


def run_state(run_dir: Path) -> tuple[str, int]:
    """The run's state name and attempt count from state.json; ``ValueError`` when unreadable."""
    name, attempts, _ = _read_state(run_dir)
    return name, attempts


def _read_state(run_dir: Path) -> tuple[str, int, int]:
    """state.json's name and attempts, and the highest attempt the run has allowed calls at: its
    ``attempt_reached``, which the writer keeps through states that run nothing (retrying/1,
    failed/1, then running/1 is a step back), and at least what the state now allows (a run
    written before it was kept: the state's). ``ValueError`` when unreadable."""
    state = read_json_file(Path(run_dir) / "state.json", Path(run_dir))
    name = state.get("name") if isinstance(state, dict) else None
    attempts = state.get("attempts") if isinstance(state, dict) else None
    if not isinstance(name, str) or not protocol.is_whole_number(attempts):
        raise ValueError(f"{run_dir}/state.json needs a string name and a whole number of attempts")
    recorded = state.get("attempt_reached", 0)
    if not protocol.is_whole_number(recorded):
        raise ValueError(f"{run_dir}/state.json has an attempt_reached that is not a whole number")
    return name, attempts, max(recorded, attempt_of(name, attempts) or 0)


def next_attempt(run_dir: Path) -> int:
    """The attempt a tool call or a task belongs to now; ``ValueError`` when the state refuses them."""
    name, attempts, reached = _read_state(run_dir)
    attempt = attempt_of(name, attempts)
    if attempt is None:
        allowed = " or ".join(CALLABLE_STATES)
        raise ValueError(f"the run is {name[:64]!r}: tool calls and tasks are refused (only {allowed} allow them)")
    if not 1 <= attempt <= MAX_ATTEMPTS:
        raise ValueError(f"state.json gives attempt {attempt}: the writer acts at attempts 1 to {MAX_ATTEMPTS}")
    if attempt < reached:
        raise ValueError(
            f"state.json gives attempt {attempt}, but calls have run at attempt {reached}: attempts only grow "
            "(the state was set back by hand); record a state at that attempt or later"
        )
    return attempt


# --- calls in doubt --------------------------------------------------------------


def unsettled_calls(run_dir: Path, adapters: Mapping[str, Any] | None = None) -> list[tuple[str, int | None]]:
    """``(call_id, attempt)`` of every call a person (or a query) must still settle.

    The reader reads the run as replay does, and replay's decision says which:
    one rule for "in doubt", wherever it is asked.
    """
    from receipts.reader import read_run
    from receipts.replay import apply_decisions

    files, _ = read_run(Path(run_dir), keep_events=False, keys=run_keys())
    apply_decisions(files, adapters)
    return [(call.call_id, call.attempt) for call in files.calls if protocol.in_doubt(call.decision)]
