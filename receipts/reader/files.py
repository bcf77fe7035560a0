"""The reading of a run as a whole: state, steer (and whether the run is signed), the cross-checks.

``read_run_files`` makes the run's ``RunContext`` and hands it to each reader in
turn: ``receipts``, ``confirmations`` and ``submissions`` each read their folder;
what is checked across them and against the ledger is checked here. Given a sink, the
calls are handed to it in bounded batches, each cross-checked, instead of kept.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import os
from collections.abc import Callable, Collection, Iterable, Mapping, MutableSet
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import UnsafePath, open_folder
from receipts.findings import Sentence, storable_text
from receipts.protocol import RUN_FOLDERS
from receipts.reader.checks import RunContext
from receipts.reader.confirmations import read_confirmations
from receipts.reader.diskset import DiskSet, among
from receipts.reader.ledger import LedgerCursor
from receipts.reader.receipts import ReceiptReader, check_stale_call
from receipts.reader.records import CallRecord, ConfirmationRecord, RunFiles
from receipts.reader.safe_open import DEFAULT_LIMITS, Limits, _exists, list_names, read_regular
from receipts.reader.spill import Spill
from receipts.reader.submissions import read_submissions

# A batch of calls, cross-checked, and the RunFiles they are read into (its other files read).
CallSink = Callable[[list[CallRecord], RunFiles], None]

# How many calls a sink is handed at a time: what a reader with a sink holds of them.
CALLS_BATCH = 10_000


def read_run_files(
    run_dir: Path,
    *,
    ledger: LedgerCursor | Callable[[], LedgerCursor],
    limits: Limits = DEFAULT_LIMITS,
    now: dt.datetime | None = None,
    known_receipts: dict[str, CallRecord] | None = None,
    known_contract: str = "",
    listed_signatures: dict[str, str] | None = None,
    keys: Mapping[str, protocol.SigningKey] | None = None,
    require_signed: bool = False,
    receipt_names: Collection[str] | None = None,
    sink: CallSink | None = None,
    calls_batch: int = CALLS_BATCH,
) -> RunFiles:
    """Everything in a run directory but the ledger, checked against what the ledger says
    (``ledger``: the cursor after the whole ledger was read: the calls it names, commits, disputes;
    or a function that returns it, called once the run's own files are read, so that they can be
    read while the ledger still is).

    ``known_receipts``: records of receipts read before (with their ``file_signature``),
    made under ``known_contract``. A receipt whose signature has not changed is not read
    again: its known record is used (and named in ``reused_calls``). Only records whose
    file raised no finding of its own should be passed, since a reused file reports none.
    ``listed_signatures``: the receipts' signatures as ``run_fingerprint`` just took them
    (a file that changes after it is cannot be reused past the next import's fingerprint).
    ``keys``: signing keys by id; signatures are checked only by a reader given keys (a run
    is signed when steer.json names its key id), and ``require_signed`` makes an unsigned
    run a finding too.

    ``receipt_names``: the receipt files to look at (names in ``receipts/``), when the caller
    knows which may have changed; the others are neither read nor checked, nor in the result.
    The cross-checks then cover those calls only, so ``ledger``'s sets of call ids must be
    narrowed to the same calls (a call the ledger names but that is not among them would be
    a missing receipt). A run whose contract is not ``known_contract`` is not read this way:
    ``contract_changed`` says so, and the caller reads it again whole.

    ``sink``: given, the calls are not kept in the result (its ``calls`` stays empty): they are
    handed to ``sink`` a batch of at most ``calls_batch`` at a time, each batch cross-checked
    and whole, with the ``RunFiles`` being made (its confirmations read), the ledger's calls
    that have no receipt last. Until the ledger is known the batches wait on disk
    (``Spill``): memory holds one batch of records, whatever the run's size. The findings
    are those of a read without a sink, in another order.
    """
    run = RunContext(Path(run_dir), LedgerCursor(), limits, now or protocol.utc_now())
    try:
        run_fd = open_folder(run.run_dir)
    except (UnsafePath, OSError) as error:
        said = error.detail if isinstance(error, UnsafePath) else Sentence("unsafe_path.os_error", error=error)
        run.finding("unsafe_path", str(run.run_dir), said)
        return run.out
    folders: dict[str, int | None] = {}
    spill = Spill() if sink is not None else None
    try:
        _read_state(run, run_fd)
        signing_key = _read_steer(run, run_fd, keys or {}, require_signed)
        if run.out.contract_sha256 != known_contract:
            known_receipts = None  # every identity check depends on the contract: check them all again
            if receipt_names is not None:
                run.out.contract_changed = True
                return run.out
        for name in RUN_FOLDERS:
            folders[name] = run.folder(run_fd, name)
        receipts = ReceiptReader(
            run,
            known=known_receipts or {},
            listed_signatures=listed_signatures or {},
            signing_key=signing_key,
            spill=spill,
            batch=calls_batch,
            confirmed=None if sink is None else _confirmed(folders["confirmations"]),
        )
        receipts.read(folders["receipts"], receipt_names)
        confirmations = read_confirmations(run, folders["confirmations"], receipts.shas, signing_key)
        read_submissions(run, folders["submissions"], folders["tasks"])
        run.ledger = ledger() if callable(ledger) else ledger
        if sink is None:
            _cross_check(run, receipts.present, confirmations)
        else:
            _cross_check_batches(run, receipts, confirmations, sink, calls_batch)
    finally:
        for fd in folders.values():
            if fd is not None:
                os.close(fd)
        os.close(run_fd)
        if spill is not None:
            spill.close()
    return run.out


def _confirmed(dir_fd: int | None) -> set[str]:
    """The call ids that confirmations/ names (the receipts whose digest a confirmation needs)."""
    if dir_fd is None:
        return set()
    try:
        return {name[: -len(".json")] for name in list_names(dir_fd) if name.endswith(".json")}
    except OSError:
        return set()  # the confirmations' own read says what is wrong


def _read_state(run: RunContext, run_fd: int) -> None:
    """The run's state name and attempts, from state.json (an absent one says nothing)."""
    parsed = run.read_json("state.json", run_fd, "state.json")
    if parsed is None:
        return
    state, _ = parsed
    name, attempts = (state.get("name"), state.get("attempts")) if isinstance(state, dict) else (None, None)
    if not protocol.is_whole_number(attempts):
        attempts = None
    if not isinstance(name, str) or attempts is None:
        run.finding("schema_error", "state.json", Sentence("schema_error.state", max=protocol.MAX_INT))
    name = name[:64] if isinstance(name, str) else ""
    if "\x00" in name:
        run.finding("unstorable_value", "state.json", Sentence("unstorable_value.state_name"))
    run.out.state = storable_text(name)
    run.out.attempts = attempts


def _read_steer(
    run: RunContext, run_fd: int, keys: Mapping[str, protocol.SigningKey], require_signed: bool
) -> protocol.SigningKey | None:
    """The receipts' contract, from steer.json; the run's signing key when it is signed with one of ``keys``."""
    if not _exists(run_fd, "steer.json"):
        run.finding("schema_error", "steer.json", Sentence("schema_error.steer_missing"))
        return None
    parsed = run.read_json("steer.json", run_fd, "steer.json")
    if parsed is None:
        return None
    steer, _ = parsed
    contract = steer.get("contract_sha256") if isinstance(steer, dict) else None
    signing_key = _check_signed_run(run, steer, keys, require_signed) if isinstance(steer, dict) else None
    if not isinstance(contract, str) or not protocol.HEX64_RE.fullmatch(contract):
        run.finding("schema_error", "steer.json", Sentence("schema_error.steer_contract"))
        return signing_key
    run.out.contract_sha256 = contract
    return signing_key


def _check_signed_run(
    run: RunContext, steer: dict[str, Any], keys: Mapping[str, protocol.SigningKey], require_signed: bool
) -> protocol.SigningKey | None:
    """Whose key signs this run, and whether steer.json itself verifies with it."""
    if not keys:
        return None  # without keys, nothing about signatures is said
    signing_key = signing_key_of(steer, keys, run.run_dir.name)
    key_id = steer.get("signing_key_id")
    if key_id is None:
        if require_signed:
            run.finding("signature_missing", "steer.json", Sentence("signature_missing.unsigned_run"))
    elif signing_key is None:
        run.finding(
            "signature_unchecked",
            "steer.json",
            Sentence("signature_unchecked.key", key_id=repr(str(key_id)[:40])),
        )
    elif (wrong := protocol.signature_problem(steer, signing_key)) is not None:
        run.finding(wrong[0], "steer.json", wrong[1])
    return signing_key


def _cross_check(run: RunContext, receipt_files: set[str], confirmations: dict[str, ConfirmationRecord]) -> None:
    """The calls against the ledger: a call it names with no receipt file (``receipt_files``: the
    call ids that have one), a receipt it does not name, an open call unconfirmed too long."""
    _check_against_the_ledger(run, run.out.calls)
    missing = [_missing_receipt(run, call_id) for call_id in sorted(run.ledger.call_ids - receipt_files)]
    _check_each(run, run.out.calls, confirmations)
    run.out.calls.extend(missing)


def _cross_check_batches(
    run: RunContext,
    receipts: ReceiptReader,
    confirmations: dict[str, ConfirmationRecord],
    sink: CallSink,
    batch: int,
) -> None:
    """``_cross_check``, a batch of receipts at a time, each handed to ``sink`` once checked.

    Each batch is checked against the ledger's sets narrowed to its calls: sets on disk
    (``DiskSet``) are asked once a batch, not once a call, and the calls the ledger names
    with no receipt are found on disk too, so that memory holds a batch whatever the run's size.
    """
    ledger = run.ledger
    receipted: MutableSet[str] = set()
    if isinstance(ledger.call_ids, DiskSet):
        receipted = DiskSet(ledger.call_ids.path, "receipted")
    try:
        for calls, receipt_files in receipts.batches():
            named = [call.call_id for call in calls]
            run.ledger = dataclasses.replace(
                ledger,
                call_ids=among(named, ledger.call_ids),
                committed_call_ids=among(named, ledger.committed_call_ids),
                disputed_call_ids=among(named, ledger.disputed_call_ids),
            )
            _check_against_the_ledger(run, calls)
            _check_each(run, calls, confirmations)
            receipted |= receipt_files
            if calls:
                sink(calls, run.out)
    finally:
        run.ledger = ledger
    if isinstance(ledger.call_ids, DiskSet) and isinstance(receipted, DiskSet):
        unreceipted: Iterable[str] = ledger.call_ids.sorted_without(receipted)
    else:
        unreceipted = sorted(ledger.call_ids - receipted)
    ids = iter(unreceipted)
    while missing := list(itertools.islice(ids, max(batch, 1))):
        sink([_missing_receipt(run, call_id) for call_id in missing], run.out)


def _missing_receipt(run: RunContext, call_id: str) -> CallRecord:
    """A call the ledger names with no receipt file: a finding, and a record of the call."""
    run.finding("missing_receipt", call_id, Sentence("missing_receipt.ledger"), call_id=call_id)
    return CallRecord(call_id=call_id, receipt_present=False)


def _check_each(run: RunContext, calls: list[CallRecord], confirmations: dict[str, ConfirmationRecord]) -> None:
    """A receipt the ledger does not name; an open call unconfirmed too long."""
    for call in calls:
        if call.receipt_present and call.call_id not in run.ledger.call_ids:
            run.finding(
                "orphan_receipt",
                f"receipts/{call.call_id}.json",
                Sentence("orphan_receipt.ledger"),
                call_id=call.call_id,
            )
        confirmation = confirmations.get(call.call_id)
        if call.status in protocol.OPEN_STATUSES and not (confirmation is not None and confirmation.valid):
            check_stale_call(run, call)


def _check_against_the_ledger(run: RunContext, calls: list[CallRecord]) -> None:
    """What the receipts say against what the ledger recorded of them.

    A committed receipt without a committed event: a kill between the rename
    and the event (the writer appends it, ``recovered``, at the next touch), or
    a status edited afterwards. A receipt that says anything but committed for a
    call whose commit the ledger records: the writer never writes a receipt again
    once it is committed (a later attempt is another call), so it was changed
    since. A committed receipt whose last reuse the writer
    refused (``reuse_refused``: its target did not show the result) is
    ``disputed``: it proves nothing until a person settles it. Receipts not
    read again get the same verdict from the ledger as it stands now.
    """
    for call in calls:
        subject = f"receipts/{call.call_id}.json"
        if call.verification == protocol.DISPUTED:
            call.verification = protocol.VERIFIED  # judged again from the ledger below
        if call.status != "committed":
            if call.receipt_present and call.call_id in run.ledger.committed_call_ids:
                run.finding(
                    "receipt_contradicts_ledger",
                    subject,
                    Sentence("receipt_contradicts_ledger.committed", status=repr(call.status)),
                    call_id=call.call_id,
                )
            continue
        if call.call_id not in run.ledger.committed_call_ids:
            run.finding(
                "committed_event_missing",
                subject,
                Sentence("committed_event_missing.ledger"),
                call_id=call.call_id,
            )
        if call.verification == protocol.VERIFIED and call.call_id in run.ledger.disputed_call_ids:
            call.verification = protocol.DISPUTED
            run.finding(
                "effect_not_shown",
                subject,
                Sentence("effect_not_shown.reuse_refused"),
                call_id=call.call_id,
            )


def signing_key_of(steer: Any, keys: Mapping[str, protocol.SigningKey], run_id: str) -> protocol.SigningKey | None:
    """The key among ``keys`` whose id steer.json names (a signed run), bound to the run, or ``None``."""
    key_id = steer.get("signing_key_id") if isinstance(steer, dict) else None
    key = keys.get(key_id) if isinstance(key_id, str) else None
    return None if key is None else key.for_run(protocol.signing_subject(steer, run_id))


def run_signing_key(run_dir: Path, keys: Mapping[str, protocol.SigningKey] | None) -> protocol.SigningKey | None:
    """A signed run's key, read from its steer.json before its ledger is (no symlink followed)."""
    if not keys:
        return None
    try:
        fd = open_folder(run_dir)
    except (UnsafePath, OSError):
        return None
    try:
        steer = protocol.load_json_strict(read_regular("steer.json", fd, DEFAULT_LIMITS.max_json_bytes))
    except (UnsafePath, OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return signing_key_of(steer, keys, Path(run_dir).name)
