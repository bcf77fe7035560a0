"""The other end of ``callproof ship``: agent hosts send what their runs wrote over HTTPS, with a
key of their own, and fetch the people's decisions to write back.

A host needs no database credentials and no Django: its shipper (``receipts.ship``, standard
library) holds one key, made by an admin with ``manage.py host add NAME`` and kept here only as
its SHA-256. A request with the key is that host's, whatever it says; it reaches only that
host's runs. What a host ships is kept as it was shipped, in the host's folder of the mirror
(``EVIDENCE_MIRROR_ROOT/<host>/<run_id>/``), which ``manage.py import_mirrors`` imports with the
importer every other run goes through. Every time is the server's.

Decisions travel back as instructions: the shipper asks for those of its host's runs, writes
each through the writer (``runtime.confirm_call``, under the call's lock, which re-checks the
receipt the person saw) and acknowledges each by id: delivered, refused (with why) or failed
(tried again). Writing one again is harmless: the confirmation is the same file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from evidence.ingest import delivery, storing
from evidence.ingest.mirror import MAX_ITEMS, ShipError, mirror_root
from evidence.lib import hosts
from evidence.models import Finding, Host, HostKey, HumanDecision, Run
from receipts import __version__, protocol
from receipts.findings import FindingRecord, Sentence

KEY_PREFIX = "cph_"
__all__ = ["ShipError", "mirror_root"]  # the views' and the tests' names for them


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(name: str) -> str:
    """A new key for host ``name`` (the host is made when it does not exist): shown once."""
    if not protocol.valid_run_id(name):
        raise ValueError(f"{name!r} is not a host name: 1-128 of A-Z a-z 0-9 . _ - (not starting with a dot)")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        host, _ = Host.objects.get_or_create(
            name=name,
            defaults={"runs_root": "", "version": "", "started_at": Now(), "last_seen_at": Now(), "watching": False},
        )
        HostKey.objects.create(host=host, digest=digest_of(key), prefix=key[:12], created_at=Now())
    return key


def revoke(name: str) -> int:
    """Revoke every key of host ``name``: its shipper is refused from the next request."""
    return HostKey.objects.filter(host__name=name, revoked_at__isnull=True).update(revoked_at=Now())


def authenticate(header: str) -> Host:
    """The host whose key the ``Authorization: Bearer`` header carries (401 otherwise)."""
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.startswith(KEY_PREFIX) or len(key) > 200:
        raise ShipError(401, "a host key is needed: Authorization: Bearer cph_... (manage.py host add NAME)")
    found = HostKey.objects.select_related("host").filter(digest=digest_of(key.strip())).first()
    if found is None or found.revoked_at is not None:
        raise ShipError(401, "this host key is unknown or revoked")
    HostKey.objects.filter(pk=found.pk).update(last_used_at=Now())
    return found.host


def clock_offset(said: str, now: dt.datetime) -> float | None:
    """The host's clock less the server's, from the time its shipper stamped on a request just
    before sending it (``X-Callproof-Time``): None when it said none, or nothing readable."""
    if not said or len(said) > 40:
        return None
    try:
        return round((protocol.parse_time(said) - now).total_seconds(), 3)
    except (ValueError, OverflowError):
        return None


def check_in(host: Host, *, instance: str, root: str, version: str, clock: str = "") -> Host:
    """The host's shipper reports, on the server's clock. One shipper per key at a time: another
    instance is refused (409, and shown on the Hosts page) while the holder reports. ``clock``:
    the host's time as its shipper sent the request (a small one: a big body's upload would
    count as clock), kept as the host's offset from the server's."""
    instance, root, version = instance[:64], root[:1000], version[:32]
    offset = clock_offset(clock, protocol.utc_now())
    if "\x00" in instance + root + version:
        raise ShipError(400, "a U+0000 (NUL) character is not allowed in the X-Callproof headers")
    if not instance:
        raise ShipError(400, "the shipper names its instance (X-Callproof-Shipper)")
    with transaction.atomic():
        held = Host.objects.select_for_update().get(pk=host.pk)
        holder_reports = held.watching and held.stopped_at is None and not hosts.is_silent(held)
        if held.lease and held.lease != instance and holder_reports:
            Host.objects.filter(pk=host.pk).update(refused_at=Now(), refused_from=root)
            said = f"another shipper with host {host.name}'s key is shipping (runs root {held.runs_root})"
            said += ": two must not share a key"
            # "lease": what the shipper reads to stop (not the words, which a run_id can hold too).
            refused: ShipError | None = ShipError(409, said, {"lease": "taken"})
        else:
            refused = None
            Host.objects.filter(pk=host.pk).update(
                lease=instance, runs_root=root, version=version or __version__, last_seen_at=Now(), watching=True,
                stopped_at=None, **({"started_at": Now()} if held.lease != instance else {}),
                **({"clock_offset_seconds": offset} if offset is not None else {}),
            )  # fmt: skip
    if refused is not None:
        raise refused  # outside the transaction, so that the refusal is recorded
    if offset is not None:
        judge_clock(host, offset, protocol.utc_now())
    return Host.objects.get(pk=host.pk)


def judge_clock(host: Host, offset: float, now: dt.datetime) -> None:
    """A host whose clock is off by more than ``EVIDENCE_HOST_CLOCK_SKEW_SECONDS`` has its
    ``host_clock_off`` finding open (on the host, no run), closed once its clock is right."""
    root = f"host {host.name}"
    seen: set = set()
    if hosts.clock_is_off(offset):
        detail = Sentence("host_clock_off.offset", host=host.name, offset=f"{offset:+.0f}",
                          skew=str(settings.EVIDENCE_HOST_CLOCK_SKEW_SECONDS))  # fmt: skip
        seen = storing.store_findings(None, [FindingRecord("host_clock_off", host.name, detail)], now, root=root)
    storing.close_findings_not_seen(Finding.objects.filter(run__isnull=True, root=root), seen, now)


def stopped(host: Host, *, instance: str) -> None:
    Host.objects.filter(pk=host.pk, lease=instance).update(stopped_at=Now())


# --- instructions ------------------------------------------------------------


def instructions(host: Host) -> list[dict[str, Any]]:
    """What this host has still to do in its runs, at most ``MAX_ITEMS`` at a time (what one
    acknowledgement takes): the people's decisions to write, oldest first, then the runs
    archived from the mirror whose own copy it may remove (never one under a legal hold: the
    host asks again, just before it removes it, ``confirm_removal``). The rest come once these
    are acknowledged."""
    decisions = _decisions(host)
    return decisions + (_removals(host)[: MAX_ITEMS - len(decisions)] if len(decisions) < MAX_ITEMS else [])


def _removals(host: Host) -> list[dict[str, Any]]:
    # Under a legal hold a removal is not asked for, unless it was confirmed before the hold came:
    # the host may have removed its copy since, and its acknowledgement must get through.
    due = Q(legal_hold=False) | Q(host_copy_removal_confirmed_at__isnull=False)
    archived = Run.objects.filter(due, host=host, archived=True, host_copy_removed_at__isnull=True,
                                  host_copy_kept="").exclude(steer_sha256="")  # fmt: skip
    return [
        {"id": f"remove-{run.pk}", "kind": "remove", "run_id": run.run_id, "steer_sha256": run.steer_sha256}
        for run in archived.only("pk", "run_id", "steer_sha256", "path").order_by("pk")[:MAX_ITEMS]
        if Path(run.path).is_relative_to(Path(settings.EVIDENCE_MIRROR_ROOT))  # archived from the mirror
    ]


_NUMBER = re.compile(r"[0-9]{1,18}")


def _number_of(instruction_id: Any, prefix: str) -> int | None:
    """The row an instruction's id names (``decision-12``, ``remove-7``), or None: digits 0-9
    only (``str.isdigit`` takes "²", which ``int`` refuses)."""
    if not isinstance(instruction_id, str) or not instruction_id.startswith(prefix):
        return None
    number = instruction_id.removeprefix(prefix)
    return int(number) if _NUMBER.fullmatch(number) else None


def confirm_removal(host: Host, document: Any) -> dict[str, Any]:
    """Asked by the host immediately before it removes its own copy of an archived run (the
    directory already renamed out of the readers' way): still to remove, under no legal hold,
    and the same run (its steer.json's SHA-256)? A hold set since the instruction was fetched
    wins: the host puts its copy back."""
    if not isinstance(document, dict):
        raise ShipError(400, "a removal to confirm is {id, steer_sha256}")
    number = _number_of(document.get("id"), "remove-")
    if number is None:
        raise ShipError(400, "id is remove-N, as the instruction said")
    with transaction.atomic():
        # The run's row locked, as a legal hold locks it: the hold is set before (kept) or after
        # (the removal was decided, and the archive holds the run).
        run = Run.objects.select_for_update().filter(pk=number, host=host, archived=True,
                                                     host_copy_removed_at__isnull=True).first()  # fmt: skip
        if run is None:
            return {"remove": False, "why": "no removal of this run is asked of this host now"}
        if document.get("steer_sha256") != run.steer_sha256:
            return {"remove": False, "why": f"the directory holds another run than {run.run_id} archived"}
        if run.host_copy_removal_confirmed_at is not None:
            return {"remove": True, "why": ""}  # decided before: a shipper killed after it asks again
        if run.legal_hold:
            since = protocol.format_time(run.legal_hold_since) if run.legal_hold_since else "now"
            why = f"run {run.run_id} is under a legal hold since {since}: the host keeps its copy"
            return {"remove": False, "why": why}
        if run.host_copy_kept:
            return {"remove": False, "why": f"the host keeps run {run.run_id}: {run.host_copy_kept}"}
        Run.objects.filter(pk=run.pk).update(host_copy_removal_confirmed_at=Now())
    return {"remove": True, "why": ""}


def _removal_acknowledged(host: Host, ack: dict[str, Any], now: Any) -> int:
    from evidence.models import AuditEntry

    number = _number_of(ack["id"], "remove-")
    if number is None:
        return 0
    detail = str(ack.get("detail", ""))[:2000]
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=number, host=host, archived=True,
                                                     host_copy_removed_at__isnull=True).first()  # fmt: skip
        if run is None:
            return 0
        if ack["outcome"] == delivery.DELIVERED:
            Run.objects.filter(pk=run.pk).update(host_copy_removed_at=Now())
            AuditEntry.objects.create(
                run=run, action=AuditEntry.HOST_COPY_REMOVED, actor=f"host {host.name}", at=now,
                reason=f"archived as {run.archive_path}; the host's own copy removed",
            )  # fmt: skip
        elif ack["outcome"] == delivery.REFUSED:
            Run.objects.filter(pk=run.pk).update(host_copy_kept=detail or "the host kept it")
    return 1


def _decisions(host: Host) -> list[dict[str, Any]]:
    return [
        {
            "id": f"decision-{decision.pk}",
            "kind": "decision",
            "run_id": decision.run.run_id,
            "call_id": decision.call_id,
            "resolution": decision.resolution,
            "reason": decision.reason,
            "actor": decision.actor,
            "receipt_sha256": decision.receipt_sha256,
            "confirmed_at": protocol.format_time(decision.decided_at),
        }
        for decision in delivery.pending_for(host, MAX_ITEMS)
    ]


def acknowledge(host: Host, acks: Any) -> dict[str, int]:
    """What the host did with each instruction: ``delivered``, ``refused`` (never will be, with
    why) or ``failed`` (tried again). An instruction of another host's is not this one's to say."""
    if not isinstance(acks, list) or len(acks) > MAX_ITEMS:
        raise ShipError(400, f"acks is a list of at most {MAX_ITEMS}")
    counted = {delivery.DELIVERED: 0, delivery.REFUSED: 0, delivery.FAILED: 0}
    now = protocol.utc_now()
    for ack in acks:
        outcome = ack.get("outcome") if isinstance(ack, dict) else None
        if (
            not isinstance(ack, dict)
            or not isinstance(ack.get("id"), str)
            or not isinstance(outcome, str)
            or (outcome not in counted)
        ):
            raise ShipError(400, "each ack is {id, outcome: delivered|refused|failed, detail}")
        if ack["id"].startswith("remove-"):
            counted[ack["outcome"]] += _removal_acknowledged(host, ack, now)
            continue
        number = _number_of(ack["id"], "decision-")
        decision = (
            None
            if number is None
            else HumanDecision.objects.select_related("run").filter(pk=number, run__host=host).first()
        )
        if decision is None or not decision.pending:
            continue  # another host's, unknown, or already said: nothing changes
        detail = str(ack.get("detail", ""))[:2000]
        if ack["outcome"] == delivery.DELIVERED:
            HumanDecision.objects.filter(pk=decision.pk, delivered_at__isnull=True, undeliverable="").update(
                delivered_at=Now(), delivered_by=host.name, delivery_error=""
            )
        elif ack["outcome"] == delivery.REFUSED:
            delivery.refuse(decision, detail or "the run directory refused it", now)
        else:
            HumanDecision.objects.filter(pk=decision.pk).update(delivery_error=detail or "failed")
        counted[ack["outcome"]] += 1
    return counted
