"""Which runs does a runs root's pass check, and what does it leave on them?

``Watch`` carries from one watch pass to the next the runs found to be this host's: a pass
checks the hot set, the cold runs due and new directories (``Watch.to_check``). After every
pass, ``stamp_checked`` stamps the runs it checked as checked (and changed, when their files
were), and each is found abandoned, or no longer, by ``models.is_abandoned``: the
``run_abandoned`` finding.

A hot run is told unchanged at a glance (``Watch.unchanged_at_a_glance``): a few ``lstat``
calls, not one per file, once a full fingerprint has matched. When the glance moved, the run
is listed again by names and inodes (``Watch.listed_again``): only the files of the parts
that changed are stat-ed, so a run of a million receipts that writes one pays for the
listing of its names, not for a million ``stat`` calls. The full fingerprint is taken again
at least every cold sweep (an edit in place inside a folder shows only there).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from evidence import models
from evidence.ingest.rereading import Known, Listing
from evidence.ingest.storing import store_findings
from evidence.lib import stats
from evidence.models import Host, Run
from receipts import protocol
from receipts.findings import ACTIVITY as ACTIVITY_SCOPE
from receipts.findings import FindingRecord, Sentence
from receipts.reader import RunParts, run_glance

log = logging.getLogger("callproof.importer")

# How old the newest time of a glance must be when it is taken for it to stand for the files
# later: a rename in the same tick of the file system's clock leaves a folder's times as they
# were. Linux's ticks are milliseconds; some file systems keep whole seconds (ext3) or two
# (FAT), and the clocks of a client and a server differ a little.
GLANCE_SETTLE = dt.timedelta(seconds=2)


@dataclasses.dataclass(frozen=True)
class Proved:
    """A run's glance, taken just before a full fingerprint that matched what the database
    holds (``fingerprint``), at ``at``."""

    glance: str
    fingerprint: str
    at: dt.datetime


@dataclasses.dataclass(frozen=True)
class Kept:
    """A run's fingerprint by parts (``Listing.parts``), its fingerprint, and when the last
    listing that stat-ed every file was taken: what ``Listing.again`` lists the run against."""

    parts: RunParts
    fingerprint: str
    whole_at: dt.datetime


@dataclasses.dataclass
class Watch:
    """What a watch carries from one pass to the next (``root_import``'s ``watch``).

    ``mine``: the listed names already found in the database as this host's runs at these
    paths. A pass looks up only the names it has not found so (a new directory, a copy another
    host owns): looking 20,000 names up every pass would cost more than the hot runs. Forgotten
    every ``cold_sweep``, so that a run deleted from the database is found again.

    ``proved``: by run_id, the glance that stands for the run's last matching fingerprint
    (``keep``); ``kept``: by run_id, the run's last fingerprint by parts; ``told_by``: how this
    pass told each run it checked unchanged or not, "glance", "relisting" or "fingerprint" (for
    the tests and the benchmark); ``checked``: the run directories this pass chose (what a
    waker follows until the next pass).
    """

    cold_sweep: dt.timedelta
    mine: set[str] = dataclasses.field(default_factory=set)
    found_at: dt.datetime | None = None
    settle: dt.timedelta = GLANCE_SETTLE
    proved: dict[str, Proved] = dataclasses.field(default_factory=dict)
    kept: dict[str, Kept] = dataclasses.field(default_factory=dict)
    told_by: dict[str, str] = dataclasses.field(default_factory=dict)
    checked: list[Path] = dataclasses.field(default_factory=list)
    # The abandoned runs' ledgers as the last pass saw them (size, mtime): one that moved since
    # is checked at once, not at the cold sweep (it writes again: a call in doubt may be there).
    abandoned: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    base: Path | None = None  # the folder the runs were listed in

    @classmethod
    def from_settings(cls) -> Watch:
        return cls(cold_sweep=dt.timedelta(seconds=settings.EVIDENCE_COLD_SWEEP_SECONDS))

    def to_check(self, base: Path, names: list[str], host: Host, now: dt.datetime) -> set[str]:
        """The runs listed under ``base`` that this pass checks: the hot set, the cold runs due,
        and every name not found as this host's run at this path. No other run is touched."""
        if self.found_at is None or now - self.found_at >= self.cold_sweep:
            self.mine, self.found_at = set(), now
        self.base = base
        listed = set(names)
        runs = Run.objects.filter(Q(host=host) | Q(host__isnull=True))
        new = sorted(listed - self.mine)
        for start in range(0, len(new), 500):
            rows = runs.filter(run_id__in=new[start : start + 500]).values_list("run_id", "path")
            self.mine.update(run_id for run_id, path in rows if path == os.path.join(base, run_id))
        self.mine &= listed
        # Two queries, not one with both: SQLite walks the indexes of an OR's branches only when
        # each branch is a range of its own, and unordered, or it reads the run_id index whole.
        due = {*runs.hot(now).order_by().values_list("run_id", flat=True)}
        due.update(runs.cold_due(now, self.cold_sweep).order_by().values_list("run_id", flat=True))
        chosen = (listed - self.mine) | (due & listed) | self._writing_again(base, listed, runs)
        # What a run not chosen was proved unchanged by is old when it is chosen again.
        self.proved = {run_id: proved for run_id, proved in self.proved.items() if run_id in chosen}
        self.kept = {run_id: kept for run_id, kept in self.kept.items() if run_id in chosen}
        self.told_by = {}
        self.checked = [base / name for name in sorted(chosen)]
        return chosen

    def _writing_again(self, base: Path, listed: set[str], runs: models.RunQuerySet) -> set[str]:
        """The abandoned runs (not finished, no event for a day: out of the hot set) whose ledger
        moved: one ``lstat`` each, as the root's listing costs. A run this watch has not seen yet
        moved when its ledger is not where the last import stopped reading."""
        seen: dict[str, tuple[int, int]] = {}
        moved = set()
        abandoned = runs.filter(finished__in=[False], abandoned_at__isnull=False, archived=False)
        for run_id, read_to in abandoned.order_by().values_list("run_id", "ledger_offset"):
            if run_id not in listed:
                continue
            try:
                facts = os.lstat(base / run_id / protocol.LEDGER_NAME)
                mark = (facts.st_size, facts.st_mtime_ns)
            except OSError:
                mark = (0, 0)
            before = self.abandoned.get(run_id)
            if (before is None and mark[0] != read_to) or (before is not None and before != mark):
                moved.add(run_id)
            seen[run_id] = mark
        # A watch of several roots (import_mirrors: a host's folder each) keeps the others' too.
        self.abandoned = {run_id: mark for run_id, mark in self.abandoned.items() if run_id not in listed} | seen
        return moved

    @property
    def following(self) -> list[Path]:
        """What a waker follows until the next pass: the runs it checked, and the abandoned ones
        (a write to one wakes the watch, which finds its ledger moved)."""
        abandoned = [self.base / run_id for run_id in sorted(self.abandoned)] if self.base else []
        return [*self.checked, *(path for path in abandoned if path not in self.checked)]

    def unchanged_at_a_glance(self, path: Path, known: Known, now: dt.datetime) -> bool:
        """Whether the run at ``path`` is unchanged without a ``stat`` of each of its files: what
        ``Known.may_be_unchanged`` asks, a glance kept (``keep``) for the fingerprint the database
        holds and taken within the cold sweep, and the run's glance now the same."""
        if not known.may_be_unchanged(path, now):
            return False
        proved = self.proved.get(path.name)
        if proved is None or proved.fingerprint != known.fingerprint or now - proved.at >= self.cold_sweep:
            return False
        if run_glance(path).digest != proved.glance:
            return False
        self.told_by[path.name] = "glance"
        return True

    def listed_again(self, path: Path, known: Known, now: dt.datetime) -> Listing | None:
        """The run at ``path`` listed again by names and inodes (``Listing.again``), against its
        parts kept for the fingerprint the database holds, with the receipts' buckets stored
        beside it; ``None`` when nothing is kept for it, or what is kept is for another
        fingerprint (another importer's since) or older than the cold sweep."""
        kept = self.kept.get(path.name)
        if kept is None or kept.fingerprint != known.fingerprint or now - kept.whole_at >= self.cold_sweep:
            return None
        stored = Run.objects.filter(run_id=path.name).values_list("fingerprint", "receipt_buckets").first()
        if stored is None or stored[0] != kept.fingerprint or (kept.parts.count("receipts") and not stored[1]):
            return None  # changed since the pass read it, or imported before buckets were kept
        self.told_by[path.name] = "relisting"
        return Listing.again(path, kept.parts, stored[1])

    def keep(self, path: Path, listing: Listing, now: dt.datetime) -> None:
        """After ``listing`` (taken with its glance) matched the database or was imported: its
        parts are kept to list the run again, and its glance stands for its fingerprint when the
        files were older than ``settle`` at the glance. A glance of files written just before
        says nothing of a write in the same tick: the next pass lists the run again, and keeps
        its glance then. What a listing taken ``again`` rests on is as old as the last whole one."""
        if listing.whole:
            self.told_by[path.name] = "fingerprint"
            whole_at = now
        elif path.name in self.kept:
            whole_at = self.kept[path.name].whole_at
        else:
            return  # nothing stands for it: a whole listing next
        if listing.parts is not None:
            self.kept[path.name] = Kept(listing.parts, listing.fingerprint, whole_at)
        glance = listing.glance
        if glance is None or glance.newest_ns > glance.taken_ns - self.settle // dt.timedelta(microseconds=1) * 1000:
            self.proved.pop(path.name, None)
            return
        self.proved[path.name] = Proved(glance.digest, listing.fingerprint, whole_at)


# What ``models.is_abandoned`` reads of a run, and the stamp it leaves.
ACTIVITY = ("id", "state", "activity_at", "last_event_at", "changed_at", "abandoned_at")


def stamp_checked(
    imported: list[str],
    failed: set[str],
    unchanged: list[str],
    known: dict[str, Known],
    activity: dict,
    now: dt.datetime,
) -> None:
    """After a pass: the runs it checked (``imported``, of which ``failed`` failed, and
    ``unchanged``) are stamped checked, those whose files changed (or whose import failed, to be
    read again while hot) changed, and each is judged abandoned or not: an unchanged run from
    what the pass read of it already, an imported one from its rows now."""
    judged = [activity[run_id] for run_id in unchanged]
    changed = []
    for start in range(0, len(imported), 500):
        rows = Run.objects.filter(run_id__in=imported[start : start + 500]).values_list(
            "run_id", "fingerprint", *ACTIVITY
        )
        for run_id, fingerprint, pk, state, activity_at, last_event_at, changed_at, abandoned_at in rows:
            recorded = known.get(run_id)
            if run_id in failed or recorded is None or recorded.fingerprint != fingerprint:
                changed.append(run_id)
                changed_at = now
            judged.append((pk, state, activity_at, last_event_at, changed_at, abandoned_at))
    checked = imported + unchanged
    for start in range(0, len(checked), 500):
        Run.objects.filter(run_id__in=checked[start : start + 500]).update(checked_at=now)
    for start in range(0, len(changed), 500):
        Run.objects.filter(run_id__in=changed[start : start + 500]).update(changed_at=now)
    _judge_abandoned(judged, now)


ABANDONED_SUBJECT = "activity"


def _judge_abandoned(rows: list[tuple], now: dt.datetime) -> None:
    """Open the run_abandoned finding of each run that ``models.is_abandoned`` says is (it then
    leaves the hot set), and close it for each that wrote again or finished. ``rows``: each
    run's ``ACTIVITY``."""
    after = dt.timedelta(seconds=settings.EVIDENCE_ABANDONED_AFTER_SECONDS)
    for pk, state, activity_at, last_event_at, changed_at, abandoned_at in rows:
        # The last event on the server's clock (a shipped run's host's clock may be off).
        last_event_at = activity_at or last_event_at
        abandoned = models.is_abandoned(state, last_event_at or changed_at, now, after)
        if abandoned == (abandoned_at is not None):
            continue
        run = Run.objects.get(pk=pk)
        with transaction.atomic():
            if abandoned:
                since = protocol.human_time(last_event_at or changed_at)
                detail = Sentence(
                    "run_abandoned.silent",
                    state=repr(state or "none"),
                    since=since,
                    command="`python -m receipts state`",
                )
                store_findings(
                    run, [FindingRecord("run_abandoned", ABANDONED_SUBJECT, detail, scope=ACTIVITY_SCOPE)], now
                )
            else:
                run.findings.filter(code="run_abandoned", closed_at__isnull=True).update(closed_at=now)
            Run.objects.filter(pk=pk).update(abandoned_at=now if abandoned else None)
            stats.refresh_run_summary(run)
        event = "run_abandoned" if abandoned else "run_resumed"
        log.info(event.replace("_", " "), extra={"event": event, "run_id": run.run_id})
