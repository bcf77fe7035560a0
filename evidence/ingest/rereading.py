"""What does a re-import read again? Nothing when the files have not changed; otherwise,
when few may have changed, only the calls that may have.

``Listing`` takes a run's fingerprint and its receipts' signatures in one pass, and
``Known`` (what the last import recorded) says whether there is anything to read. The
receipts are kept as one digest per bucket of call ids (``receipt_buckets``): ``Scope`` is
the calls a re-import reads and checks again, those of the changed buckets, those the
ledger's new lines name, the open ones and those a confirmation or a decision waits on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, MutableMapping
from os.path import lexists
from pathlib import Path
from typing import Any

from django.conf import settings

from evidence.models import Call, Run
from receipts import protocol
from receipts.reader import Glance, RunParts, list_run, receipt_bucket, relist_run, run_glance
from receipts.reader.diskset import SpillingMap


@dataclasses.dataclass
class Listing:
    """A run directory's fingerprint, its receipts' signatures and its confirmations' names,
    taken in one pass; with ``glance``, the run's glance taken just before (a watch keeps it).

    ``parts``: the fingerprint by parts, which a watch keeps to list the run ``again``. A
    listing taken ``again`` is not ``whole`` (not every file stat-ed): it holds the signatures
    of the buckets of receipts stat-ed again (``relisted``; ``None``: every one) alone, and
    every bucket's digest (``buckets``), the others as the database held them."""

    fingerprint: str
    receipt_signatures: MutableMapping[str, str]
    confirmation_names: set[str] = dataclasses.field(default_factory=set)
    glance: Glance | None = None
    parts: RunParts | None = None
    relisted: set[str] | None = None
    buckets: dict[str, str] | None = None
    run_dir: Path | None = None
    whole: bool = True

    @classmethod
    def of(cls, path: Path, *, glance: bool = False) -> Listing:
        # The glance first: a change made after it changes the next glance, so the glance can
        # stand for this fingerprint; taken after, it could stand for files the listing missed.
        first = run_glance(path) if glance else None
        # Past a batch of receipts, the signatures go to a private SQLite file: a million took 210 MiB.
        signatures = SpillingMap(in_memory=settings.EVIDENCE_IMPORT_CALLS_BATCH)
        confirmations: set[str] = set()
        parts = list_run(path, signatures, confirmations)
        return cls(parts.fingerprint(), signatures, confirmations, first, parts, run_dir=path)

    @classmethod
    def again(cls, path: Path, before: RunParts, buckets: Mapping[str, str]) -> Listing:
        """The run listed again by names and inodes (``relist_run``), ``before`` its parts when
        its ``buckets`` of receipts were stored: only the files of the parts that changed are
        stat-ed. Taken with its glance, as a watch takes it."""
        first = run_glance(path)
        signatures: dict[str, str] = {}
        confirmations: set[str] = set()
        parts, relisted = relist_run(path, before, signatures, confirmations)
        if relisted is None:  # every receipt stat-ed (or none listed): the digests from them
            return cls(parts.fingerprint(), signatures, confirmations, first, parts, run_dir=path, whole=False)
        kept = {bucket: digest for bucket, digest in buckets.items() if bucket not in relisted}
        digests = kept | receipt_buckets(signatures)
        return cls(parts.fingerprint(), signatures, confirmations, first, parts, relisted, digests, path, False)

    @property
    def receipt_count(self) -> int:
        return self.parts.count("receipts") if self.parts is not None else len(self.receipt_signatures)

    def receipt_buckets(self) -> dict[str, str]:
        """Every bucket's digest (``receipt_buckets``)."""
        return self.buckets if self.buckets is not None else receipt_buckets(self.receipt_signatures)

    def receipts_among(self, names: Iterable[str]) -> set[str]:
        """Those of ``names`` in ``receipts/``: in the signatures, or, in a bucket a listing
        taken ``again`` did not stat, on disk (a symlink counts, as a listing lists it)."""
        if self.relisted is None or self.run_dir is None:
            return {name for name in names if name in self.receipt_signatures}
        folder = self.run_dir / "receipts"
        return {
            name
            for name in names
            if (name in self.receipt_signatures if receipt_bucket(name) in self.relisted else lexists(folder / name))
        }


# Above this share of the receipts (and this many calls), a re-import reads them all: it costs
# what reading some would. Below the floor it reads some, so every run exercises the one way.
SCOPED_READ_AT_MOST = 0.25
SCOPED_READ_FLOOR = 1_000


def _call_id_of(name: str) -> str:
    return name.removesuffix(".json")


def receipt_buckets(signatures: Mapping[str, str]) -> dict[str, str]:
    """The names and signatures of ``receipts/`` as one digest per bucket (``receipt_bucket``):
    the digest of the bucket's lines ``name NUL signature``, sorted, joined by newlines.

    Kept with the run: a re-import compares them, and looks only at the buckets that differ,
    instead of loading every known receipt to find the one that changed. The names are taken
    in sorted order (a listing on disk reads them so), so each bucket's lines come sorted and
    are hashed as they come: memory holds a digest per bucket, not the lines.
    """
    items = signatures.sorted_items() if isinstance(signatures, SpillingMap) else sorted(signatures.items())
    digests: dict[str, Any] = {}
    for name, signature in items:
        bucket = receipt_bucket(name)
        line = f"{name}\0{signature}".encode("utf-8", "surrogateescape")
        digest = digests.get(bucket)
        if digest is None:
            digests[bucket] = hashlib.sha256(line)
        else:
            digest.update(b"\n" + line)
    return {bucket: digest.hexdigest() for bucket, digest in digests.items()}


@dataclasses.dataclass
class Scope:
    """The calls a re-import reads and checks again, when not all of them need it: those whose
    receipt changed (added, replaced or removed: found in the buckets whose digest changed),
    those the ledger's new lines name, the calls still open (the clock can make them stale),
    those with a confirmation file or a decision waiting for this host. The rest were checked
    before against a ledger that said nothing new of them, and nothing they depend on has
    changed."""

    calls: set[str]
    receipt_names: set[str]

    @classmethod
    def of(
        cls, run: Run, listing: Listing, buckets: dict[str, str], named_by_new_lines: Iterable[str], decided: dict
    ) -> Scope | None:
        before = run.receipt_buckets
        if not before:
            return None  # imported before buckets were kept: read whole once
        changed = {bucket for bucket in buckets.keys() | before.keys() if buckets.get(bucket) != before.get(bucket)}
        if listing.relisted is not None and not changed <= listing.relisted:
            return None  # the database changed since the listing's buckets were taken from it: all
        names, removed = _changed_in_buckets(run, listing.receipt_signatures, changed)
        calls = {_call_id_of(name) for name in names} | removed | set(named_by_new_lines) | set(decided)
        calls |= {_call_id_of(name) for name in listing.confirmation_names}
        stored = Call.objects.filter(run=run)
        calls.update(stored.filter(status__in=protocol.OPEN_STATUSES).values_list("call_id", flat=True))
        if len(calls) > max(SCOPED_READ_FLOOR, SCOPED_READ_AT_MOST * listing.receipt_count):
            return None
        calls = {call_id for call_id in calls if _may_name_a_call(call_id)}
        names |= listing.receipts_among(f"{call_id}.json" for call_id in calls)
        return cls(calls, names)

    def rechecked(self, call_id: str, subject: str) -> bool:
        """Whether a finding was looked for again: about a call in scope, a receipt file read,
        or any other file but a receipt (those are read whole every time)."""
        if call_id:
            return call_id in self.calls
        folder, _, name = subject.partition("/")
        return folder != "receipts" or name in self.receipt_names


def _changed_in_buckets(run: Run, signatures: Mapping[str, str], buckets: set[str]) -> tuple[set[str], set[str]]:
    """In the changed ``buckets``, which receipts changed: the names listed whose signature is
    not the one stored with their call (added, or put in place again), and the calls whose
    receipt was stored as there and is no longer listed (removed). A bucket of thousands of
    receipts whose one file changed is one receipt to read, not thousands."""
    listed = _listed_in_buckets(signatures, buckets)
    stored: dict[str, str | None] = {}  # the signature of each call's receipt as stored; None: none was there
    calls = Call.objects.filter(run=run)
    for bucket in sorted(filter(_may_name_a_call, buckets)):  # the bucket's range, by the (run, call_id) index
        rows = calls.filter(**_bucket_range(bucket)).values_list("call_id", "file_signature", "receipt_present")
        stored.update((call_id, signature if present else None) for call_id, signature, present in rows)
    # A signature "" (not a regular file) is never taken for unchanged: such a file is said again.
    names = {name for name, signature in listed.items() if not signature or stored.get(_call_id_of(name)) != signature}
    removed = {call_id for call_id, signature in stored.items() if signature is not None}
    removed -= {_call_id_of(name) for name in listed}
    return names, removed


def _listed_in_buckets(signatures: Mapping[str, str], buckets: set[str]) -> dict[str, str]:
    """The listed names whose call id falls in one of ``buckets``, and their signatures: on disk,
    a range of the listing for each bucket (the names that start with it, some of another
    bucket: a call id "a" is bucket "a" and its file "a.json" starts with "a."); else, or when
    names that are not UTF-8 changed (their bucket has no range), every name looked at."""
    if not (isinstance(signatures, SpillingMap) and signatures.on_disk) or "\ufffd" in buckets:
        return {name: signature for name, signature in signatures.items() if receipt_bucket(name) in buckets}
    return {
        name: signature
        for bucket in buckets
        for name, signature in signatures.items_from(bucket)
        if receipt_bucket(name) == bucket
    }


def _may_name_a_call(text: str) -> bool:
    """Whether ``text`` may be (or start) a call id: not empty (the bucket of a file named
    ".json") and UTF-8 (a name that is not never names a call, and no database takes it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(text)


def _bucket_range(bucket: str) -> dict[str, str]:
    """The call ids that start with ``bucket``, as a range the (run, call_id) index serves: a
    range of code points, which is one of bytes in UTF-8, so the column compares as bytes on
    every database (``ByteOrderCharField``: a language's collation put "e9..." after "e:")."""
    following = bucket[:-1] + chr(min(ord(bucket[-1]) + 1, 0x10FFFF))
    return {"call_id__gte": bucket, "call_id__lt": following}


@dataclasses.dataclass
class Known:
    """What the last import recorded of a run: enough to tell that nothing changed."""

    path: str
    fingerprint: str
    next_stale_at: dt.datetime | None
    archived: bool
    summarised: bool

    @classmethod
    def of(cls, run: Run) -> Known:
        return cls(run.path, run.fingerprint, run.next_stale_at, run.archived, run.summary is not None)

    def may_be_unchanged(self, path: Path, now: dt.datetime) -> bool:
        """Whether only the files' fingerprint can tell: the same directory, summarised, and no
        call or reservation due to turn stale."""
        if self.path != str(path) or not self.summarised:
            return False
        return self.next_stale_at is None or now < self.next_stale_at

    def unchanged(self, path: Path, now: dt.datetime, listing: Listing) -> bool:
        """Nothing to read: the one rule, for a root's pass and for the import under the lock."""
        return self.may_be_unchanged(path, now) and listing.fingerprint == self.fingerprint
