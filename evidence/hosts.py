"""Hosts: the machines whose importers ship their runs to this database.

An agent host runs ``import_runs --watch`` pointed at the central database:
it registers under ``EVIDENCE_HOST_NAME``, beats its heart after every pass,
owns the runs it imports, and writes the people's decisions about them into
their directories (``evidence.delivery``). A host that watches and stops
reporting (or says it stopped) is *silent*: an inbox item, down on /metrics.
One rule for it, here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from evidence.models import Host, HumanDecision, Run
from receipts import __version__, protocol


def this_host_name() -> str:
    return settings.EVIDENCE_HOST_NAME


def register(*, runs_root: Path, watching: bool, now: dt.datetime | None = None) -> Host:
    """This process's host, as an importer that starts (``watching``: ``--watch``)."""
    now = now or protocol.utc_now()
    host, _ = Host.objects.update_or_create(
        name=this_host_name(),
        defaults={
            "runs_root": str(Path(runs_root).absolute()), "version": __version__, "pid": os.getpid(),
            "started_at": now, "last_seen_at": now, "stopped_at": None, "watching": watching,
        },
    )  # fmt: skip
    return host


def current() -> Host:
    """This process's host, registered by the first import that needs it (a one-off import
    that never watches is never silent)."""
    now = protocol.utc_now()
    host, _ = Host.objects.get_or_create(
        name=this_host_name(),
        defaults={"runs_root": "", "version": __version__, "started_at": now, "last_seen_at": now, "watching": False},
    )
    return host


def beat(host: Host, *, pass_seconds: float, now: dt.datetime | None = None) -> None:
    """A pass is done: the heartbeat."""
    now = now or protocol.utc_now()
    Host.objects.filter(pk=host.pk).update(last_seen_at=now, last_pass_seconds=pass_seconds, stopped_at=None)


def stopped(host: Host, now: dt.datetime | None = None) -> None:
    Host.objects.filter(pk=host.pk).update(stopped_at=now or protocol.utc_now())


def silent(now: dt.datetime | None = None) -> QuerySet[Host]:
    """Hosts that ship continuously and have not finished a pass for
    ``EVIDENCE_HOST_SILENT_AFTER_SECONDS``, or said they stopped."""
    now = now or protocol.utc_now()
    quiet_since = now - dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS)
    return Host.objects.filter(Q(stopped_at__isnull=False) | Q(last_seen_at__lt=quiet_since), watching=True)


def is_silent(host: Host, now: dt.datetime | None = None) -> bool:
    """``silent``'s rule for one host already read (no query)."""
    now = now or protocol.utc_now()
    quiet_since = now - dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS)
    return host.watching and (host.stopped_at is not None or host.last_seen_at < quiet_since)


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """One host as the Hosts page and the API show it."""

    host: Host
    state: str  # shipping, silent, stopped or "one-off" (imports now and then, never watches)
    awaiting_delivery: int  # decisions about its runs it has still to write

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
    """A page of hosts with their state and what they have still to deliver (one query)."""
    now = protocol.utc_now()
    pending = dict(
        HumanDecision.objects.filter(run__host__in=rows, delivered_at__isnull=True, undeliverable="")
        .values_list("run__host")
        .annotate(n=Count("id"))
        .order_by()
    )
    return [HostFacts(host, state_of(host, now), pending.get(host.pk, 0)) for host in rows]


def owns(run: Run) -> bool:
    """Whether this process is on the host whose directory holds ``run`` (a run imported before
    hosts were recorded is this host's)."""
    return run.host is None or run.host.name == this_host_name()
