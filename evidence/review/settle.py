"""Settling a call in doubt: a person's decision, written back for the runtime, all or nothing.

``settle_call`` is the one way the dashboard writes. It checks what the form
cannot (the call is still in doubt, the receipt is still what the person saw,
nobody decided first), then, in one database transaction that holds the call's
row: the audit row is inserted (its unique constraint lets exactly one of two
people win) and the rows the decision changes are updated. On the run's host
the writer writes the confirmation file and its ledger event in the same
transaction: if the run directory cannot be written, it is rolled back and
nothing is recorded anywhere. Elsewhere the decision waits in the database for
the run's host to write it (``evidence.ingest.delivery``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from evidence.lib import hosts, stats
from evidence.models import Call, Confirmation, HumanDecision, Run
from evidence.review import claims
from receipts import doubt, protocol, runtime
from receipts.confined import UnsafePath, not_a_symlink, read_json_file
from receipts.durable import json_file
from receipts.recovery import decide

log = logging.getLogger("callproof.settle")


# Why a settle recorded nothing (``SettleError.code``); the page words each (evidence/web/settle_words.py).
ALREADY_DECIDED = "already_decided"  # values: actor, resolution, time, reason of the decision on record
NO_RECEIPT = "no_receipt"
NOT_IN_DOUBT = "not_in_doubt"  # values: reason (the call's recovery decision, in the writer's English)
RECEIPT_CHANGED = "receipt_changed"  # values: status (what the page showed), now_status and now_updated_at
ANOTHER_DECISION_THERE = "another_decision_there"  # values: actor, resolution, time, reason (the file's)
WRITER_REFUSED = "writer_refused"  # values: problem (the writer's refusal)
CANNOT_WRITE = "cannot_write"  # values: problem (the system's error)
UNSAFE_PATH = "unsafe_path"  # values: problem (what the writer found)
WRITER_CANNOT = "writer_cannot"  # values: problem (a signed run without its key, a broken steer.json)
# Why a withdrawal (``evidence.ingest.withdrawal``) took nothing back.
NOT_DECIDED = "not_decided"  # no decision made on the dashboard is on record for the call
ALREADY_DELIVERED = "already_delivered"  # values: host, time (written into the run: the runtime follows it)
NOT_WITHDRAWABLE = "not_withdrawable"  # values: why (the run directory refused it: it is on record as refused)
FIELDS = "fields"  # problems: each field and what is wrong with it (one of the four below)
CHOOSE_RESOLUTION, GIVE_REASON = "choose_resolution", "give_reason"
TYPE_CALL_ID, TICK_QUERYABLE = "type_call_id", "tick_queryable"
# The answer the target's evidence contradicts: a second, explicit confirmation.
TICK_AGAINST_EVIDENCE = "tick_against_evidence"


class SettleError(Exception):
    """Why nothing was recorded, as data: a code, the values it quotes (as the records hold
    them), the HTTP status that says it, and for ``FIELDS`` each field's problem."""

    def __init__(
        self,
        status: HTTPStatus,
        code: str,
        values: Mapping[str, object] | None = None,
        *,
        existing: HumanDecision | None = None,
        problems: dict[str, str] | None = None,
    ) -> None:
        self.status, self.code, self.values = status, code, dict(values or {})
        self.existing = existing
        # Every field that does not hold, each with its problem: a person fixes them all in one go.
        self.problems = problems or {}
        super().__init__(f"{code}: {self.problems or self.values}")


@dataclasses.dataclass(frozen=True)
class Settlement:
    decision: HumanDecision
    created: bool  # False: the same decision was already on record (a double click, a retry)


def may_be_settled(call: Call) -> bool:
    """In doubt (``Call.in_doubt``), with a receipt for the decision to hold to: a call the
    ledger names without one is in doubt too, but nothing here can say which bytes were seen."""
    return call.in_doubt and call.receipt_present


def needs_second_tick(call: Call) -> bool:
    """The runtime can ask the target itself (its decision is ``query``): a person confirms
    anyway only when they say so."""
    return call.decision == "query"


def target_verdict(run: Run, call: Call) -> str | None:
    """What the call's target shows now (``doubt.PRESENT``, ``ABSENT``, ``UNCLEAR``), read from the
    run directory where this process is on the run's host; ``None`` when nothing can look."""
    if not hosts.owns(run) or Path(run.path).is_symlink():
        # A run directory swapped for a symlink is not the run (the reader does not follow it):
        # what lies where it points is no evidence, and the write-back refuses it in its own words.
        return None
    evidence = doubt.evidence_for(Path(run.path), call.tool, call.args, call.call_id)
    return evidence.verdict if evidence is not None else None


def against_evidence(resolution: str, verdict: str | None) -> bool:
    """The answer the target's evidence contradicts: "did not happen" where it shows the effect,
    "happened" where it shows none."""
    return (verdict, resolution) in ((doubt.PRESENT, "rejected"), (doubt.ABSENT, "committed"))


def settle_call(
    *,
    run: Run,
    call: Call,
    user: User,
    resolution: str,
    reason: str,
    typed_call_id: str,
    receipt_sha256: str,
    confirm_queryable: bool = False,
    confirm_against_evidence: bool = False,
    client_address: str | None = None,
    now: dt.datetime | None = None,
) -> Settlement:
    """Record ``user``'s decision that ``call`` happened (``committed``) or did not (``rejected``).

    A decision already on record is said first, before anything about the form: a form posted
    again from an old page (Back, then reload) learns the call was settled, not what it lacked."""
    now = now or protocol.utc_now()
    wanted = protocol.confirmation_id(call.call_id, resolution, receipt_sha256)
    with transaction.atomic():
        # The row lock (PostgreSQL) or the immediate transaction (SQLite) makes people queue here.
        call = Call.objects.select_for_update().get(pk=call.pk)
        existing = HumanDecision.objects.filter(run=run, call_id=call.call_id).first()
        if existing is not None:
            if existing.confirmation_id == wanted:
                return Settlement(existing, False)
            raise SettleError(HTTPStatus.CONFLICT, ALREADY_DECIDED, _decided(existing), existing=existing)
        if not may_be_settled(call):
            if not call.receipt_present:
                raise SettleError(HTTPStatus.CONFLICT, NO_RECEIPT)
            raise SettleError(HTTPStatus.CONFLICT, NOT_IN_DOUBT, {"reason": call.decision_reason})
        if receipt_sha256 != call.file_sha256:
            # The decision is about the receipt the dashboard imported and showed, not whatever
            # digest a form carries: a digest of the bytes on disk now would pass the writer's check.
            raise SettleError(HTTPStatus.CONFLICT, RECEIPT_CHANGED, _receipt_now(run, call))
        problems = field_problems(
            call,
            resolution=resolution,
            reason=reason,
            typed_call_id=typed_call_id,
            confirm_queryable=confirm_queryable,
            # Read at the post, on the server: what the target shows now, whatever the page showed.
            verdict=target_verdict(run, call),
            confirm_against_evidence=confirm_against_evidence,
        )
        if problems:
            raise SettleError(HTTPStatus.BAD_REQUEST, FIELDS, problems=problems)
        try:
            with transaction.atomic():
                decision = HumanDecision.objects.create(
                    run=run,
                    call_id=call.call_id,
                    resolution=resolution,
                    reason=reason.strip(),
                    user=user,
                    actor=user.get_username(),
                    decided_at=now,
                    receipt_sha256=receipt_sha256,
                    confirmation_id=wanted,
                    client_address=client_address,
                )
        except IntegrityError:
            existing = HumanDecision.objects.get(run=run, call_id=call.call_id)
            raise SettleError(HTTPStatus.CONFLICT, ALREADY_DECIDED, _decided(existing), existing=existing) from None
        if hosts.owns(run):
            # This process is on the run's host: the decision goes into the run directory now.
            document = _write_back(run, call, decision)
            record_confirmation(run=run, call=call, document=document, now=now)
            decision.delivered_at, decision.delivered_by = now, hosts.this_host_name()
            decision.save(update_fields=["delivered_at", "delivered_by"])
        else:
            # The run's host writes it (evidence.ingest.delivery); the rows follow the decision meanwhile.
            record_decision(run=run, call=call, resolution=resolution, now=now)
        # Settled, it leaves the inbox: whoever said "I'm on it" is done.
        claims.acted(run=run, kinds=claims.CALL_KINDS, subject=call.call_id, user=user, how="settled", now=now)
    log.info(
        "call settled",
        extra={"event": "call_settled", "run_id": run.run_id, "call_id": call.call_id,
               "resolution": decision.resolution, "actor": decision.actor},
    )  # fmt: skip
    return Settlement(decision, True)


def _write_back(run: Run, call: Call, decision: HumanDecision) -> dict:
    """The writer's confirmation file and ledger event; any refusal rolls the decision back."""
    try:
        document, _written = runtime.confirm_call(
            not_a_symlink(Path(run.path)),  # before the writer makes anything in it
            call.call_id,
            resolution=decision.resolution,
            reason=decision.reason,
            actor=decision.actor,
            receipt_sha256=decision.receipt_sha256,
            confirmed_at=protocol.format_time(decision.decided_at),
        )
    except runtime.ConfirmationRefused as refused:
        if refused.current_receipt_sha256:
            raise SettleError(HTTPStatus.CONFLICT, RECEIPT_CHANGED, _receipt_now(run, call)) from None
        if refused.existing is not None:
            other = refused.existing
            values = {name: other.get(name) for name in ("actor", "resolution", "reason")}
            raise SettleError(
                HTTPStatus.CONFLICT, ANOTHER_DECISION_THERE, values | {"time": other.get("confirmed_at")}
            ) from None
        raise SettleError(HTTPStatus.CONFLICT, WRITER_REFUSED, {"problem": str(refused)}) from None
    except OSError as error:
        raise SettleError(
            HTTPStatus.SERVICE_UNAVAILABLE, CANNOT_WRITE, {"problem": str(error.strerror or error)}
        ) from None
    except UnsafePath as unsafe:
        raise SettleError(HTTPStatus.CONFLICT, UNSAFE_PATH, {"problem": str(unsafe)}) from None
    except ValueError as error:  # the writer cannot act here: a signed run without its key, a broken steer.json
        raise SettleError(HTTPStatus.SERVICE_UNAVAILABLE, WRITER_CANNOT, {"problem": str(error)}) from None
    return document


def field_problems(
    call: Call,
    *,
    resolution: str,
    reason: str,
    typed_call_id: str,
    confirm_queryable: bool,
    verdict: str | None = None,
    confirm_against_evidence: bool = False,
) -> dict[str, str]:
    """Every field of a settle that does not hold, at once, in the form's order: the field's name
    and its problem. Nothing when all hold (the state of the call is checked elsewhere).

    ``verdict``: what the target shows (``target_verdict``); an answer it contradicts needs
    ``confirm_against_evidence``, the second confirmation."""
    problems = {}
    if resolution not in protocol.RESOLUTIONS:
        problems["resolution"] = CHOOSE_RESOLUTION
    if not reason.strip():
        problems["reason"] = GIVE_REASON
    if typed_call_id.strip().lower() != call.call_id[:12]:
        problems["confirm_call_id"] = TYPE_CALL_ID
    if needs_second_tick(call) and not confirm_queryable:
        problems["confirm_queryable"] = TICK_QUERYABLE
    if against_evidence(resolution, verdict) and not confirm_against_evidence:
        problems["confirm_against_evidence"] = TICK_AGAINST_EVIDENCE
    return problems


def _decided(existing: HumanDecision) -> dict[str, object]:
    return {"actor": existing.actor, "resolution": existing.resolution, "time": existing.decided_at,
            "reason": existing.reason}  # fmt: skip


def _receipt_now(run: Run, call: Call) -> dict[str, object]:
    """What the receipt says now (when this process can read it), beside what the page showed."""
    try:
        receipt = read_json_file(Path(run.path) / "receipts" / f"{call.call_id}.json", Path(run.path))
    except (OSError, ValueError):
        receipt = None
    if not isinstance(receipt, dict):
        return {"status": call.status, "now_status": None, "now_updated_at": None}
    return {
        "status": call.status,
        "now_status": str(receipt.get("status")),
        "now_updated_at": receipt.get("updated_at"),
    }


def record_decision(*, run: Run, call: Call, resolution: str, now: dt.datetime) -> None:
    """A person's decision in the rows at once, as an import would follow it: the call's
    recovery decision and its stale_call finding, and the run's counts."""
    decision = decide(
        status=call.status,
        error_kind=call.error_kind or None,
        queryable=call.queryable,
        confirmation=resolution,
        verification=call.verification,
    )
    Call.objects.filter(pk=call.pk).update(decision=decision.decision, decision_reason=decision.reason)
    run.findings.filter(call_id=call.call_id, code="stale_call", closed_at__isnull=True).update(closed_at=now)
    stats.refresh_run_summary(run)


def record_confirmation(*, run: Run, call: Call, document: dict[str, Any], now: dt.datetime) -> None:
    """Bring a confirmation the dashboard just wrote into the rows at once, as an import would.

    The confirmation row, the call's decision and its stale_call finding change
    now; the next import reads the same files and reaches the same rows.
    """
    Confirmation.objects.update_or_create(
        run=run,
        call_id=call.call_id,
        defaults={
            "file_sha256": protocol.sha256_hex(json_file(document)),
            "resolution": document["resolution"],
            "reason": document["reason"],
            "actor": document["actor"],
            "confirmed_at": protocol.parse_time(document["confirmed_at"]),
            "receipt_sha256": document["receipt_sha256"],
            "confirmation_id": document["confirmation_id"],
            "valid": True,
            "problem": "",
        },
    )
    record_decision(run=run, call=call, resolution=document["resolution"], now=now)
    # Its files changed: the run is hot, and the next pass of its host reads the confirmation back.
    Run.objects.filter(pk=run.pk).update(changed_at=now)
