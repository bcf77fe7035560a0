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

import base64
import binascii
import dataclasses
import hashlib
import os
import re
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from evidence.ingest import delivery
from evidence.lib import hosts
from evidence.models import Host, HostKey, HumanDecision, Run
from receipts import __version__, durable, protocol
from receipts.reader import MAX_JSON_BYTES

KEY_PREFIX = "cph_"
# What one push may carry, decoded: the shipper sends files in chunks of at most this.
MAX_CHUNK_BYTES = 512 * 1024
MAX_ITEMS = 200
# A file of a run: steer.json and state.json, or one file directly in one of the run's folders.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,250}")
LEDGER = protocol.LEDGER_NAME


@dataclasses.dataclass
class ShipError(Exception):
    """A request refused: its HTTP status, and a sentence for the shipper's log."""

    status: int
    message: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


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


def check_in(host: Host, *, instance: str, root: str, version: str) -> Host:
    """The host's shipper reports, on the server's clock. One shipper per key at a time: another
    instance is refused (409, and shown on the Hosts page) while the holder reports."""
    instance, root, version = instance[:64], root[:1000], version[:32]
    if "\x00" in instance + root + version:
        raise ShipError(400, "a U+0000 (NUL) character is not allowed in the X-Callproof headers")
    if not instance:
        raise ShipError(400, "the shipper names its instance (X-Callproof-Shipper)")
    with transaction.atomic():
        held = Host.objects.select_for_update().get(pk=host.pk)
        holder_reports = held.watching and held.stopped_at is None and not hosts.is_silent(held)
        if held.lease and held.lease != instance and holder_reports:
            Host.objects.filter(pk=host.pk).update(refused_at=Now(), refused_from=root)
            refused = ShipError(409, f"another shipper with host {host.name}'s key is shipping (runs root "
                                     f"{held.runs_root}): two must not share a key")  # fmt: skip
        else:
            Host.objects.filter(pk=host.pk).update(
                lease=instance, runs_root=root, version=version or __version__, last_seen_at=Now(), watching=True,
                stopped_at=None, **({"started_at": Now()} if held.lease != instance else {}),
            )  # fmt: skip
            return Host.objects.get(pk=host.pk)
    raise refused


def stopped(host: Host, *, instance: str) -> None:
    Host.objects.filter(pk=host.pk, lease=instance).update(stopped_at=Now())


def mirror_root(host: Host) -> Path:
    return Path(settings.EVIDENCE_MIRROR_ROOT) / host.name


def _parts_dir(host: Host, run_id: str) -> Path:
    # Beside the hosts' folders, never inside a runs root the importer reads.
    return Path(settings.EVIDENCE_MIRROR_ROOT) / ".parts" / host.name / run_id


def push(host: Host, document: Any) -> dict[str, Any]:
    """Store what the host shipped of one run in its mirror: ledger bytes appended at the mirror's
    own length, and files (whole, or chunk by chunk), each checked against its SHA-256."""
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise ShipError(400, "a push is {run_id, items: [...]}")
    run_id = document.get("run_id")
    if not isinstance(run_id, str) or not protocol.valid_run_id(run_id):
        raise ShipError(400, "run_id is not a valid run_id")
    items = document["items"]
    if len(items) > MAX_ITEMS:
        raise ShipError(400, f"at most {MAX_ITEMS} items a push")
    owner = Run.objects.filter(run_id=run_id).exclude(host=host).values_list("host__name", flat=True).first()
    if owner is not None:
        raise ShipError(409, f"run_id {run_id} is already host {owner}'s run: this copy is not imported",
                        {"owned_by": owner})  # fmt: skip
    run_dir = mirror_root(host) / run_id
    for folder in protocol.RUN_FOLDERS:
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    for item in items:
        _store(host, run_id, run_dir, item)
    return {"ledger_size": _size(run_dir / LEDGER)}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _decoded(item: dict[str, Any]) -> bytes:
    try:
        data = base64.b64decode(item.get("data", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ShipError(400, "data is not base64") from None
    if len(data) > MAX_CHUNK_BYTES:
        raise ShipError(400, f"a chunk is at most {MAX_CHUNK_BYTES} bytes")
    return data


def _store(host: Host, run_id: str, run_dir: Path, item: Any) -> None:
    if not isinstance(item, dict):
        raise ShipError(400, "each item is an object")
    offset, declared = item.get("offset"), item.get("sha256")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ShipError(400, "offset is a whole number")
    if not isinstance(declared, str) or not protocol.HEX64_RE.fullmatch(declared):
        raise ShipError(400, "sha256 is 64 lowercase hex digits")
    data = _decoded(item)
    if item.get("kind") == "ledger":
        ledger = run_dir / LEDGER
        if hashlib.sha256(data).hexdigest() != declared:
            raise ShipError(400, "the ledger bytes do not match their sha256")
        if offset != _size(ledger):
            raise ShipError(409, "the ledger is shipped from where the mirror ends", {"ledger_size": _size(ledger)})
        fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    if item.get("kind") != "file":
        raise ShipError(400, "kind is ledger or file")
    relative, size = item.get("path"), item.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_JSON_BYTES:
        raise ShipError(400, f"size is a whole number up to {MAX_JSON_BYTES}")
    target = run_dir / _safe_path(relative)
    if offset == 0 and len(data) == size:
        if hashlib.sha256(data).hexdigest() != declared:
            raise ShipError(400, f"{relative} does not match its sha256")
        durable.write_durable(target, data, root=run_dir)
        return
    part = _parts_dir(host, run_id) / (hashlib.sha256(str(relative).encode()).hexdigest() + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    if offset != (_size(part) if offset else 0):
        raise ShipError(409, f"{relative} is shipped from byte {_size(part)}", {"part_size": _size(part)})
    with open(part, "wb" if offset == 0 else "ab") as stream:
        stream.write(data)
    if offset + len(data) < size:
        return
    with open(part, "rb") as stream:
        whole = stream.read()
    part.unlink()
    if len(whole) != size or hashlib.sha256(whole).hexdigest() != declared:
        raise ShipError(400, f"{relative} does not match its size and sha256")
    durable.write_durable(target, whole, root=run_dir)


def _safe_path(relative: Any) -> str:
    """A run file's path as the shipper names it: steer.json, state.json, or FOLDER/NAME."""
    if relative in ("steer.json", "state.json"):
        return relative
    if isinstance(relative, str) and relative.count("/") == 1:
        folder, name = relative.split("/")
        if folder in protocol.RUN_FOLDERS and _NAME.fullmatch(name) and ".." not in name:
            return relative
    raise ShipError(400, "path is steer.json, state.json or FOLDER/NAME in one of the run's folders")


# --- instructions ------------------------------------------------------------


def instructions(host: Host) -> list[dict[str, Any]]:
    """What this host has still to do in its runs: the people's decisions to write, oldest first,
    then the runs archived from the mirror whose own copy it may remove (never one under a
    legal hold, re-checked when it says it removed it)."""
    return _decisions(host) + _removals(host)


def _removals(host: Host) -> list[dict[str, Any]]:
    archived = Run.objects.filter(host=host, archived=True, legal_hold=False, host_copy_removed_at__isnull=True,
                                  host_copy_kept="").exclude(steer_sha256="")  # fmt: skip
    return [
        {"id": f"remove-{run.pk}", "kind": "remove", "run_id": run.run_id, "steer_sha256": run.steer_sha256}
        for run in archived.only("pk", "run_id", "steer_sha256", "path").order_by("pk")[:MAX_ITEMS]
        if Path(run.path).is_relative_to(Path(settings.EVIDENCE_MIRROR_ROOT))  # archived from the mirror
    ]


def _removal_acknowledged(host: Host, ack: dict[str, Any], now: Any) -> int:
    from evidence.models import AuditEntry

    number = ack["id"].removeprefix("remove-")
    if not number.isdigit() or len(number) > 18:
        return 0
    detail = str(ack.get("detail", ""))[:2000]
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=int(number), host=host, archived=True,
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
        for decision in delivery.pending_for(host)
    ]


def acknowledge(host: Host, acks: Any) -> dict[str, int]:
    """What the host did with each instruction: ``delivered``, ``refused`` (never will be, with
    why) or ``failed`` (tried again). An instruction of another host's is not this one's to say."""
    if not isinstance(acks, list) or len(acks) > MAX_ITEMS:
        raise ShipError(400, f"acks is a list of at most {MAX_ITEMS}")
    counted = {delivery.DELIVERED: 0, delivery.REFUSED: 0, delivery.FAILED: 0}
    now = protocol.utc_now()
    for ack in acks:
        if not isinstance(ack, dict) or not isinstance(ack.get("id"), str) or ack.get("outcome") not in counted:
            raise ShipError(400, "each ack is {id, outcome: delivered|refused|failed, detail}")
        if ack["id"].startswith("remove-"):
            counted[ack["outcome"]] += _removal_acknowledged(host, ack, now)
            continue
        number = ack["id"].removeprefix("decision-")
        decision = (
            HumanDecision.objects.select_related("run").filter(pk=int(number), run__host=host).first()
            if number.isdigit() and len(number) < 19
            else None
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
