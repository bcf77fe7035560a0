"""A call's records as the writer reads them under the call's lock: its receipt, a person's
decision about it, the lock file's note, and whether the target backs a commit.

The note is how a kill is repaired: before a receipt or a confirmation is put in place the
writer notes in the call's lock file what it is installing and how long the ledger was; a kill
between the file and its event leaves the note, and the next writer under that lock appends
the lost event (``recovered``). Once a receipt was put in place the note keeps a mark for good,
so a receipt removed later is never run again.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import UnsafePath, open_file, read_json_file
from receipts.durable import append_event, read_events
from receipts.protocol import WRITER_DIR, SigningKey, sha256_hex
from receipts.tools import PRESENT


@dataclasses.dataclass(frozen=True)
class HeldCall:
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


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def write_note(fd: int, note: dict[str, Any], *, durable: bool = True) -> None:
    """Replace the lock file's note. Written over the old one, then cut to length: a kill in
    between leaves the new note first, which is all ``read_note`` reads."""
    data = json.dumps(note, separators=(",", ":")).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    if durable:
        # Before the receipt is put in place: a machine that stops right after the rename
        # must still find the note, or the lost event would never come back.
        os.fsync(fd)


def read_note(fd: int) -> dict[str, Any]:
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


def recover_lost_confirmation_event(run_dir: Path, call_id: str, lock_fd: int, key: SigningKey | None) -> None:
    """Append the ``confirmation`` event a kill kept out of the ledger after its file was written
    (the lock file's note names the confirmation): a decision delivered again finds it recorded once.

    Only for a confirmation the writer can stand behind (signed with the run's key in a signed
    run, whole and consistent): anyone who can write the run can plant a note and a file, and
    the writer would sign its line for them."""
    note = read_note(lock_fd)
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
        append_event(run_dir, "confirmation", confirmation_event(document) | {"recovered": True})
    write_note(lock_fd, {"installed": note["installed"]}, durable=False)


def confirmation_event(document: Mapping[str, Any]) -> dict[str, Any]:
    fields = ("call_id", "resolution", "actor", "reason", "confirmation_id", "receipt_sha256")
    return {key: document.get(key) for key in fields}


def receipt_was_installed(run_dir: Path, call_id: str) -> bool:
    """Whether the writer put a receipt in place for ``call_id`` (its lock file keeps the mark)."""
    try:
        fd = open_file(Path(run_dir) / WRITER_DIR / f"call-{call_id}.lock", Path(run_dir), os.O_RDONLY)
    except (OSError, UnsafePath):  # absent, or not a lock the writer made
        return False
    try:
        return read_note(fd).get("installed", False)
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
