"""What every reader of a run's files shares: the run, where findings go, how a JSON file is read."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, TypeGuard

from receipts import protocol
from receipts.confined import UnsafePath, open_folder
from receipts.findings import FindingRecord, Sentence, storable_text
from receipts.reader.ledger import LedgerCursor
from receipts.reader.records import RunFiles
from receipts.reader.safe_open import Limits, considered, list_names, read_regular


class RunContext:
    """One pass over a run's files: ``out`` is what is kept, ``out.findings`` what is wrong."""

    def __init__(self, run_dir: Path, ledger: LedgerCursor, limits: Limits, now: dt.datetime) -> None:
        self.run_dir = run_dir
        self.ledger = ledger  # what the ledger says of calls: which it names, commits, disputes
        self.limits = limits
        self.now = now
        self.out = RunFiles(run_id=run_dir.name)

    def mismatch(self, code: str, subject: str, detail: str, stored: str, recomputed: str, **values: str) -> None:
        """A finding that shows what the file says beside what it should say."""
        self.finding(code, subject, detail, stored_value=stored[:200], recomputed_value=recomputed, **values)

    def finding(self, code: str, subject: str, detail: str, **fields: str) -> None:
        """A finding; ``detail`` is a ``Sentence`` (its key and values kept with it), ``fields``
        the record's others (``call_id``, ``record_key``)."""
        self.out.findings.append(FindingRecord(code, subject, detail, **fields))  # type: ignore[arg-type]

    def read_json(self, name: str, dir_fd: int, subject: str) -> tuple[Any, str] | None:
        """The parsed document and the digest of its bytes, or ``None``: after a finding, or
        with none when the file is absent (or was removed since it was listed)."""
        try:
            data = read_regular(name, dir_fd, self.limits.max_json_bytes)
        except FileNotFoundError:
            return None
        except UnsafePath as unsafe:
            self.finding(unsafe.code, subject, unsafe.detail)
            return None
        except OSError as error:
            self.finding("unsafe_path", subject, Sentence("unsafe_path.unreadable", error=error.strerror))
            return None
        try:
            return protocol.load_json_strict(data), hashlib.sha256(data).hexdigest()
        except ValueError as error:
            self.finding("invalid_json", subject, Sentence("invalid_json.parse", error=error))
            return None

    def folder(self, run_fd: int, name: str) -> int | None:
        try:
            return open_folder(name, run_fd)
        except FileNotFoundError:
            return None
        except UnsafePath as unsafe:
            self.finding(unsafe.code, f"{name}/", unsafe.detail)
            return None

    def json_names(self, dir_fd: int, folder: str, listed: Collection[str] | None = None) -> Iterator[str]:
        """The ``.json`` names of a folder whose names are UTF-8, sorted; any other name is a finding.
        ``listed``: the names to consider, when the caller knows which (else the folder is listed)."""
        for name in list_names(dir_fd) if listed is None else considered(listed):
            if not name.endswith(".json"):
                continue
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                self.finding("unsafe_path", f"{folder}/{name}", Sentence("unsafe_path.name_not_utf8"))
                continue
            yield name

    def call_files(
        self, dir_fd: int, folder: str, too_long: str, listed: Collection[str] | None = None
    ) -> Iterator[tuple[str, str, str]]:
        """The ``.json`` files of a folder named by call id (receipts, confirmations): each one's
        name, call id and subject. A name too long for a call id is a finding (``too_long``), not read."""
        for name in self.json_names(dir_fd, folder, listed):
            subject = f"{folder}/{name}"
            stem = name[: -len(".json")]
            if len(stem) > protocol.MAX_CALL_ID_LENGTH:
                self.finding("unsafe_path", subject, too_long)
                continue
            yield name, stem, subject

    def storable(self, record: Any, subject: str) -> None:
        """Replace U+0000 in the record's text fields (the database cannot hold it), with a finding."""
        changed = [name for name, value in vars(record).items() if type(value) is str and "\x00" in value]
        for name in changed:
            setattr(record, name, storable_text(getattr(record, name)))
        if changed:
            self.finding(
                "unstorable_value",
                subject,
                Sentence("unstorable_value.fields", fields=", ".join(changed)),
            )

    def past_stale_age(self, since: dt.datetime | None) -> TypeGuard[dt.datetime]:
        """Whether ``since`` is older than the stale age; if not yet, remember when it will be."""
        if since is None:
            return False
        try:
            stale_at = since + self.limits.stale_after
        except OverflowError:  # a time at the end of the calendar never grows stale
            return False
        if self.now < stale_at:
            if self.out.next_stale_at is None or stale_at < self.out.next_stale_at:
                self.out.next_stale_at = stale_at
            return False
        return True
