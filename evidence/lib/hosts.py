"""Hosts: the machines whose importers ship their runs to this database.

An agent host runs ``import_runs --watch`` pointed at the central database:
it registers under ``EVIDENCE_HOST_NAME``, beats its heart after every pass,
owns the runs it imports, and writes the people's decisions about them into
their directories (``evidence.ingest.delivery``). A host that watches and stops
reporting (or says it stopped) is *silent*: an inbox item, down on /metrics.
One rule for it, here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import secrets
import socket
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import (
    Count,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Sum,
)
from django.db.models.functions import Cast, Coalesce, Now

from evidence.models import Host, HumanDecision, Run, ShippedRun
from receipts import __version__, protocol


def this_host_name() -> str:
    return settings.EVIDENCE_HOST_NAME


class HostTakenError(Exception):
    """Another watching importer holds this host's name and reports: two must not share one."""

    def __init__(self, host: Host) -> None:
        self.host = host
        super().__init__(
            f"host {host.name!r} is already shipping (pid {host.pid}, runs root {host.runs_root}, "
            f"started {protocol.format_time(host.started_at)}): two importers must not share a name. "
            f"Give this one its own EVIDENCE_HOST_NAME, or stop the other first"
        )


class LeaseLostError(Exception):
    """This watch was silent past the limit and another importer took the host's name."""


def _silent_before() -> ExpressionWrapper:
    """The database's now less the silence limit: every host time is the database's clock, so a
    host whose own clock is off is judged by the same clock that stamped it."""
    return ExpressionWrapper(
        Now() - dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS), output_field=DateTimeField()
    )


def this_machine() -> str:
    """This machine: its host name and, on Linux, the id of this boot."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()} {boot}".strip()[:300]


def _is_gone(holder: Host) -> bool:
    """Whether the watch holding a host's name is known dead: it ran on this machine, and the
    machine has booted since or its pid is gone. On another machine only its silence frees the
    name (a pid here says nothing of a process there)."""
    here = this_machine()
    if holder.machine.split(" ")[0] != here.split(" ")[0] or holder.pid is None:
        return False
    if holder.machine != here:
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return holder.pid == os.getpid()  # only this very process could have left its own pid


def register(*, runs_root: Path, watching: bool) -> Host:
    """This process's host, as an importer that starts (``watching``: ``--watch``).

    A watch takes the host's lease: refused (``HostTakenError``, and the refusal recorded on the host)
    while another watch under the same name holds it and reports. A one-off import under the
    name of a host that ships changes nothing on its row."""
    root = str(Path(runs_root).absolute())
    with transaction.atomic():
        Host.objects.get_or_create(
            name=this_host_name(),
            defaults={"runs_root": root, "version": __version__, "started_at": Now(), "last_seen_at": Now()},
        )
        held = Host.objects.select_for_update().filter(
            name=this_host_name(), watching=True, stopped_at__isnull=True, last_seen_at__gte=_silent_before()
        )
        holder = held.first()
        if holder is not None and watching and _is_gone(holder):
            holder = None  # restarted after a crash on the same machine: its predecessor is dead
        if holder is not None:
            if not watching:
                return holder
            Host.objects.filter(pk=holder.pk).update(refused_at=Now(), refused_from=root)
            refused = HostTakenError(holder)
        else:
            lease = secrets.token_hex(16) if watching else ""
            Host.objects.filter(name=this_host_name()).update(
                runs_root=root, version=__version__, pid=os.getpid(), started_at=Now(), last_seen_at=Now(),
                stopped_at=None, watching=watching, lease=lease, machine=this_machine(),
            )  # fmt: skip
            return Host.objects.get(name=this_host_name())
    raise refused  # outside the transaction, so that the refusal is recorded


def current() -> Host:
    """This process's host, registered by the first import that needs it (a one-off import
    that never watches is never silent)."""
    host, created = Host.objects.get_or_create(
        name=this_host_name(),
        defaults={
            "runs_root": "",
            "version": __version__,
            "started_at": Now(),
            "last_seen_at": Now(),
            "watching": False,
        },
    )
    if created:
        host.refresh_from_db()  # the database's times, not the expressions that made them
    return host


def beat(host: Host, *, pass_seconds: float) -> None:
    """A pass is done: the heartbeat, on the database's clock. A watch whose lease another took
    (it was silent past the limit) is told so (``LeaseLostError``): it must stop, not ship beside it."""
    if not host.lease:
        Host.objects.filter(pk=host.pk).update(last_seen_at=Now(), last_pass_seconds=pass_seconds)
        return
    beaten = Host.objects.filter(pk=host.pk, lease=host.lease).update(
        last_seen_at=Now(), last_pass_seconds=pass_seconds, stopped_at=None
    )
    if not beaten:
        check_lease(host)


def alive(host: Host) -> None:
    """The watch is alive in the middle of a long pass (``delivery.BesideThePass``): its host is not
    silent while it works. ``LeaseLostError`` when another importer took the name."""
    if not Host.objects.filter(pk=host.pk, lease=host.lease).update(last_seen_at=Now()):
        check_lease(host)


def check_lease(host: Host) -> None:
    """``LeaseLostError`` when another importer holds the host this watch registered."""
    if host.lease and not Host.objects.filter(pk=host.pk, lease=host.lease).exists():
        raise LeaseLostError(f"another importer took host {host.name!r} while this one was silent; this one stops")


def record_error(host: Host, error: str) -> None:
    """A pass of this watch failed (the database went away, a connection ended): kept on the host
    for the Hosts page and /metrics. The watch tries again; a failure of this write is its own."""
    Host.objects.filter(pk=host.pk, lease=host.lease).update(last_error=error[:2000], last_error_at=Now())


def stopped(host: Host) -> None:
    """This watch stops: the host says so, unless another importer holds it now."""
    Host.objects.filter(pk=host.pk, lease=host.lease).update(stopped_at=Now())


def _silent(now: dt.datetime) -> Q:
    quiet_since = now - dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS)
    return (Q(stopped_at__isnull=False) | Q(last_seen_at__lt=quiet_since)) & Q(watching=True)


def silent(now: dt.datetime | None = None) -> QuerySet[Host]:
    """Hosts that ship continuously and have not finished a pass for
    ``EVIDENCE_HOST_SILENT_AFTER_SECONDS``, or said they stopped."""
    return Host.objects.filter(_silent(now or protocol.utc_now()))


def is_silent(host: Host, now: dt.datetime | None = None) -> bool:
    """``silent``'s rule for one host already read (no query)."""
    now = now or protocol.utc_now()
    quiet_since = now - dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS)
    return host.watching and (host.stopped_at is not None or host.last_seen_at < quiet_since)


def stuck_since(now: dt.datetime) -> dt.datetime:
    """A path that has not moved since this is stuck (``EVIDENCE_SHIP_STUCK_AFTER_SECONDS``)."""
    return now - dt.timedelta(seconds=settings.EVIDENCE_SHIP_STUCK_AFTER_SECONDS)


def runs_not_arriving(now: dt.datetime | None = None) -> QuerySet[ShippedRun]:
    """Shipped runs that do not arrive: the mirror short of their host's ledger with nothing of
    them arriving, or a run the shipper cannot send or the server refuses, for
    ``EVIDENCE_SHIP_STUCK_AFTER_SECONDS``. One rule, for the Hosts page, the inbox and /metrics."""
    since = stuck_since(now or protocol.utc_now())
    return ShippedRun.objects.filter(Q(behind_since__lte=since) | Q(problem_since__lte=since))


def _waiting_decisions(since: dt.datetime) -> QuerySet[HumanDecision]:
    return HumanDecision.objects.filter(delivered_at__isnull=True, undeliverable="", decided_at__lte=since)


def stalled(now: dt.datetime | None = None) -> QuerySet[Host]:
    """Hosts that report, but where a path between them and a person stalls: a run of theirs
    not arriving, their pushes refused, a decision about their runs not written, for
    ``EVIDENCE_SHIP_STUCK_AFTER_SECONDS``; or their clock off. A silent host is not one: its
    own item says that its decisions wait and its runs do not arrive."""
    now = now or protocol.utc_now()
    return Host.objects.filter(_stalls(now) & ~_silent(now))


def _stalls(now: dt.datetime) -> Q:
    since, skew = stuck_since(now), settings.EVIDENCE_HOST_CLOCK_SKEW_SECONDS
    stuck_runs = runs_not_arriving(now).filter(host=OuterRef("pk"))
    waiting = _waiting_decisions(since).filter(run__host=OuterRef("pk"))
    return (
        Q(Exists(stuck_runs))
        | Q(push_refused_since__lte=since)
        | Q(Exists(waiting))
        | Q(clock_offset_seconds__gt=skew)
        | Q(clock_offset_seconds__lt=-skew)
    )


def needing_a_person(now: dt.datetime | None = None) -> dict[str, int]:
    """How many hosts are silent, and how many stalled (one query)."""
    now = now or protocol.utc_now()
    silent_q = _silent(now)
    return Host.objects.aggregate(
        silent=Count("pk", filter=silent_q), stalled=Count("pk", filter=_stalls(now) & ~silent_q)
    )


@dataclasses.dataclass(frozen=True)
class Stall:
    """What stalls between a host and a person, and since when (``stalled``'s rule, for one
    host): nothing when every field is empty."""

    runs_not_arriving: int = 0
    behind_bytes: int = 0  # what the mirror lacks of those runs' ledgers
    a_run: str = ""  # one of them (the longest stuck), and why it does not arrive
    its_problem: str = ""
    runs_since: dt.datetime | None = None
    refused_since: dt.datetime | None = None  # its pushes refused since, none taken
    refusal: str = ""
    decisions_waiting: int = 0  # decisions about its runs waiting past the limit
    waiting_since: dt.datetime | None = None
    clock_offset: float | None = None  # its clock less the server's, when off

    @property
    def since(self) -> dt.datetime | None:
        return min(filter(None, (self.runs_since, self.refused_since, self.waiting_since)), default=None)

    @property
    def clock_ahead(self) -> bool:
        return (self.clock_offset or 0) > 0

    @property
    def clock_seconds(self) -> int:
        """How far off its clock is, whole seconds either way."""
        return round(abs(self.clock_offset or 0))

    def __bool__(self) -> bool:
        return bool(self.runs_not_arriving or self.refused_since or self.decisions_waiting
                    or self.clock_offset is not None)  # fmt: skip


def stalls(rows: list[Host], now: dt.datetime | None = None) -> dict[int, Stall]:
    """Each host's ``Stall``, by primary key (three queries for a page of hosts)."""
    now = now or protocol.utc_now()
    since = stuck_since(now)
    stuck = runs_not_arriving(now).filter(host__in=rows)
    # Summed as floats: what shippers say of their ledgers is bounded, but a sum of many could pass
    # SQLite's 64-bit integers (an error there, not an overflow).
    lacking_bytes = Cast(F("host_ledger_bytes") - F("mirror_ledger_bytes"), FloatField())
    behind = Coalesce(Sum(lacking_bytes, filter=Q(behind_since__isnull=False)), 0.0)
    counted = {
        host_pk: (count, lacking, oldest)
        for host_pk, count, lacking, oldest in stuck.values_list("host")
        .annotate(n=Count("id"), lacking=behind, oldest=Min(Coalesce("behind_since", "problem_since")))
        .order_by()
    }
    first: dict[int, tuple[str, str]] = {}
    for host_pk, run_id, problem in stuck.order_by(Coalesce("problem_since", "behind_since"), "id").values_list(
        "host", "run_id", "problem"
    ):
        first.setdefault(host_pk, (run_id, problem))
    waiting = {
        host_pk: (count, oldest)
        for host_pk, count, oldest in _waiting_decisions(since)
        .filter(run__host__in=rows)
        .values_list("run__host")
        .annotate(n=Count("id"), oldest=Min("decided_at"))
        .order_by()
    }
    found = {}
    for host in rows:
        count, lacking, oldest = counted.get(host.pk, (0, 0, None))
        a_run, its_problem = first.get(host.pk, ("", ""))
        refused = host.push_refused_since if host.push_refused_since and host.push_refused_since <= since else None
        decisions, waiting_since = waiting.get(host.pk, (0, None))
        offset = host.clock_offset_seconds if clock_is_off(host.clock_offset_seconds) else None
        found[host.pk] = Stall(count, max(0, int(lacking or 0)), a_run, its_problem, oldest, refused,
                               host.push_refusal if refused else "", decisions, waiting_since, offset)  # fmt: skip
    return found


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """One host as the Hosts page and the API show it."""

    host: Host
    state: str  # shipping, silent, stopped or "one-off" (imports now and then, never watches)
    awaiting_delivery: int  # decisions about its runs it has still to write
    oldest_undelivered_at: dt.datetime | None = None  # when the oldest of them was made
    failing_delivery: int = 0  # of them, those whose last try failed (a full disk): tried again each pass
    refused: int = 0  # decisions its run directories refused (never written)
    stall: Stall = Stall()  # what stalls between it and a person (``stalled``)

    @property
    def oldest_undelivered_seconds(self) -> float:
        """How long the oldest decision has waited for this host (0 when none waits)."""
        if self.oldest_undelivered_at is None:
            return 0.0
        return max(0.0, (protocol.utc_now() - self.oldest_undelivered_at).total_seconds())

    @property
    def name(self) -> str:
        return self.host.name


SHIPPING, SILENT, STOPPED, ONE_OFF = "shipping", "silent", "stopped", "one-off"


def state_of(host: Host, now: dt.datetime | None = None) -> str:
    if not host.watching:
        return ONE_OFF
    if host.stopped_at is not None:
        return STOPPED
    return SILENT if is_silent(host, now) else SHIPPING


def with_facts(rows: list[Host]) -> list[HostFacts]:
    """A page of hosts with their state and what they have still to deliver, how long the oldest
    has waited, how many fail to be written and how many were refused, and what stalls (four queries)."""
    now = protocol.utc_now()
    waiting = Q(delivered_at__isnull=True, undeliverable="")
    counted = {
        host: (pending, oldest, failing, refused)
        for host, pending, oldest, failing, refused in HumanDecision.objects.filter(run__host__in=rows)
        .values_list("run__host")
        .annotate(
            n_waiting=Count("id", filter=waiting),
            oldest_waiting=Min("decided_at", filter=waiting),
            n_failing=Count("id", filter=waiting & ~Q(delivery_error="")),
            n_refused=Count("id", filter=~Q(undeliverable="")),
        )
        .order_by()
    }
    stalled_by = stalls(rows, now)
    return [
        HostFacts(host, state_of(host, now), *counted.get(host.pk, (0, None, 0, 0)), stall=stalled_by[host.pk])
        for host in rows
    ]


class MoveRefusedError(Exception):
    """A host's runs cannot be handed over now (said in one line)."""


def move(*, old: str, new: str, reason: str, actor: str) -> int:
    """Hand every run of host ``old`` to host ``new`` (made when it does not exist, with ``old``'s
    runs root): its runs, and so the decisions still to write into them, are ``new``'s from now
    on; ``old`` is retired: its shipper's keys are revoked (a request with one would bring it
    back), and what it shipped moves to ``new``'s folder of the mirror. One audit entry per run.
    Refused while ``old`` ships (stop its shipper or its watch first: it would go on importing
    as ``old``), and for a name no host may take."""
    from evidence.models import AuditEntry, HostKey

    if not reason.strip():
        raise MoveRefusedError("a host is moved with a reason (--reason)")
    if not protocol.RUN_ID_RE.fullmatch(new) or new.startswith("."):
        raise MoveRefusedError(f"{new!r} is not a host name: 1-128 of A-Z a-z 0-9 . _ - (not starting with a dot)")
    if new == old:
        raise MoveRefusedError("the two names are the same")
    with transaction.atomic():
        source = Host.objects.select_for_update().filter(name=old).first()
        if source is None:
            raise MoveRefusedError(f"no host {old!r}")
        ships_with_a_key = HostKey.objects.filter(host=source).exists()
        if state_of(source) == SHIPPING:
            seen = protocol.format_time(source.last_seen_at)
            raise MoveRefusedError(
                f"host {old!r} is shipping (callproof ship from {source.runs_root}, last seen {seen}): stop its "
                f"shipper first, then move it, then start the shipper with a key of host {new!r} (manage.py host "
                "add NEW)"
                if ships_with_a_key
                else f"host {old!r} is shipping (pid {source.pid}, last seen {seen}): stop its import_runs --watch "
                "first, then move it, then start the watch as the new name"
            )
        target, _ = Host.objects.get_or_create(
            name=new,
            defaults={"runs_root": source.runs_root, "version": source.version, "started_at": Now(),
                      "last_seen_at": Now(), "watching": False},
        )  # fmt: skip
        runs = Run.objects.filter(host=source)
        now = protocol.utc_now()
        why = f"host {old} moved to {new}: {reason.strip()}"
        moved = 0
        while True:  # a thousand at a time: a batch moved leaves ``runs``
            batch = list(runs.order_by("pk").values_list("pk", flat=True)[:1000])
            if not batch:
                break
            AuditEntry.objects.bulk_create(
                AuditEntry(run_id=pk, action=AuditEntry.HOST_MOVED, actor=actor, at=now, reason=why) for pk in batch
            )
            moved += Run.objects.filter(pk__in=batch).update(host=target)
        _move_the_mirror(source, target)
        HostKey.objects.filter(host=source, revoked_at__isnull=True).update(revoked_at=Now())
        ShippedRun.objects.filter(host=source).exclude(run_id__in=ShippedRun.objects.filter(host=target).values(
            "run_id")).update(host=target)  # fmt: skip
        Host.objects.filter(pk=source.pk).update(watching=False, lease="")  # retired: it has nothing left
    return moved


def _move_the_mirror(source: Host, target: Host) -> None:
    """What ``source`` shipped, moved to ``target``'s folder of the mirror with its runs' paths:
    ``target``'s shipper goes on from what the server holds, and the mirror is imported as
    ``target``'s. A run ``target`` already ships stays where it is."""
    mirror = Path(settings.EVIDENCE_MIRROR_ROOT)
    # Its runs, and the files it was sending in chunks (mirror.parts_root(): its own folder there).
    for old_folder, new_folder in ((mirror / source.name, mirror / target.name),
                                   (mirror / ".parts" / source.name, mirror / ".parts" / target.name)):  # fmt: skip
        if not old_folder.is_dir():
            continue
        new_folder.mkdir(parents=True, exist_ok=True)
        for entry in sorted(os.listdir(old_folder)):
            if os.path.lexists(new_folder / entry):
                continue
            os.replace(old_folder / entry, new_folder / entry)
            Run.objects.filter(host=target, run_id=entry, path=str(old_folder / entry)).update(
                path=str(new_folder / entry)
            )


def clock_is_off(offset: float | None) -> bool:
    """Whether a host's clock differs from the server's by more than
    ``EVIDENCE_HOST_CLOCK_SKEW_SECONDS`` (its offset as its shipper's last request measured it)."""
    return offset is not None and abs(offset) > settings.EVIDENCE_HOST_CLOCK_SKEW_SECONDS


def checked_activity(*, host_id: int | None, run_id: str, host_time: dt.datetime | None) -> dt.datetime | None:
    """A run's last event on the server's clock. A run its host ships: never later than the
    server received its bytes (a host's clock ahead would put it in the future, and hold its
    retention back), and that time itself when the host's clock is off (one behind would age it
    early). A run its own watch imports: the host's time, the only clock there is."""
    if host_time is None or host_id is None:
        return host_time
    shipped = ShippedRun.objects.filter(host_id=host_id, run_id=run_id)
    received_at, offset = shipped.values_list("received_at", "host__clock_offset_seconds").first() or (None, None)
    if received_at is None:
        return host_time
    return received_at if clock_is_off(offset) or received_at < host_time else host_time


def owns(run: Run) -> bool:
    """Whether this process is on the host whose directory holds ``run`` (a run imported before
    hosts were recorded is this host's)."""
    return run.host is None or run.host.name == this_host_name()
