"""Settling a call in doubt: a person's decision, written back for the runtime, all or nothing.

``settle_call`` is the one way the dashboard writes. It checks what the form
cannot (the call is still in doubt, the receipt is still what the person saw,
nobody decided first), then, in one database transaction that holds the call's
row: the audit row is inserted (its unique constraint lets exactly one of two
people win) and the rows the decision changes are updated. On the run's host
the writer writes the confirmation file and its ledger event in the same
transaction: if the run directory cannot be written, it is rolled back and
nothing is recorded anywhere. Elsewhere the decision waits in the database for
the run's host to write it (``evidence.delivery``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from http import HTTPStatus
from pathlib import Path

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from evidence import claims, decision_text, hosts, i18n, importer
from evidence.models import Call, HumanDecision, Run
from receipts import protocol, runtime
from receipts.durable import UnsafePath, not_a_symlink, read_json_file

log = logging.getLogger("callproof.settle")


class SettleError(Exception):
    """Why nothing was recorded, in a person's words (the reader's language, the values it
    quotes marked as data), with the HTTP status that says it."""

    def __init__(
        self,
        status: HTTPStatus,
        message: str | SafeString,
        *,
        existing: HumanDecision | None = None,
        field: str | None = None,
        problems: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.existing = existing
        self.field = field  # the form's field the message is about, to be shown beside it
        # Every field that does not hold, each with its message: a person fixes them all in one go.
        self.problems = problems if problems is not None else ({field: str(message)} if field else {})


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
            raise SettleError(HTTPStatus.CONFLICT, _already_decided(existing), existing=existing)
        if not may_be_settled(call):
            if not call.receipt_present:
                message = _(
                    "This call has no receipt: a decision has nothing to hold to. Its findings say what is known."
                )
            else:
                message = format_html(
                    _("This call is not in doubt: {reason}."), reason=decision_text.reason_shown(call.decision_reason)
                )
            raise SettleError(HTTPStatus.CONFLICT, message)
        if receipt_sha256 != call.file_sha256:
            # The decision is about the receipt the dashboard imported and showed, not whatever
            # digest a form carries: a digest of the bytes on disk now would pass the writer's check.
            raise SettleError(HTTPStatus.CONFLICT, _receipt_changed(run, call))
        problems = field_problems(
            call, resolution=resolution, reason=reason, typed_call_id=typed_call_id, confirm_queryable=confirm_queryable
        )
        if problems:
            field, message = next(iter(problems.items()))
            raise SettleError(HTTPStatus.BAD_REQUEST, message, field=field, problems=problems)
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
            raise SettleError(HTTPStatus.CONFLICT, _already_decided(existing), existing=existing) from None
        if hosts.owns(run):
            # This process is on the run's host: the decision goes into the run directory now.
            document = _write_back(run, call, decision)
            importer.record_confirmation(run=run, call=call, document=document, now=now)
            decision.delivered_at, decision.delivered_by = now, hosts.this_host_name()
            decision.save(update_fields=["delivered_at", "delivered_by"])
        else:
            # The run's host writes it (evidence.delivery); the rows follow the decision meanwhile.
            importer.record_decision(run=run, call=call, resolution=resolution, now=now)
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
            raise SettleError(HTTPStatus.CONFLICT, _receipt_changed(run, call)) from None
        if refused.existing is not None:
            other = refused.existing
            message = format_html(
                _("The run directory already holds another decision: {actor} settled this call as {resolution} at "
                  "{time} ({reason})."),
                # Bare text: the English pages and tests read this sentence whole.
                actor=other.get("actor"),
                resolution=i18n.word(other.get("resolution")),
                time=i18n.shown_time(other.get("confirmed_at")),
                reason=other.get("reason"),
            )  # fmt: skip
            raise SettleError(HTTPStatus.CONFLICT, message) from None
        message = format_html(_("Nothing was recorded: {problem}."), problem=_data(refused))
        raise SettleError(HTTPStatus.CONFLICT, message) from None
    except OSError as error:
        message = format_html(
            _("The run directory cannot be written ({problem}): nothing was recorded."),
            problem=_data(error.strerror or error),
        )
        raise SettleError(HTTPStatus.SERVICE_UNAVAILABLE, message) from None
    except UnsafePath as unsafe:
        message = format_html(
            _("The run directory has a symlink or an odd file where the writer records ({problem}): it is never "
              "written through, and nothing was recorded. The run's findings say what is there."),
            problem=_data(unsafe),
        )  # fmt: skip
        raise SettleError(HTTPStatus.CONFLICT, message) from None
    except ValueError as error:  # the writer cannot act here: a signed run without its key, a broken steer.json
        message = format_html(
            _("The writer cannot record a decision in this run ({problem}): nothing was recorded."),
            problem=_data(error),
        )
        raise SettleError(HTTPStatus.SERVICE_UNAVAILABLE, message) from None
    return document


def field_problems(
    call: Call, *, resolution: str, reason: str, typed_call_id: str, confirm_queryable: bool
) -> dict[str, str]:
    """Every field of a settle that does not hold, at once, in the form's order: the field's name
    and what to do. Nothing when all hold (the state of the call is checked elsewhere)."""
    problems = {}
    if resolution not in protocol.RESOLUTIONS:
        problems["resolution"] = _("Choose whether the call happened (committed) or not (rejected).")
    if not reason.strip():
        problems["reason"] = _("Give the reason for your decision: the runtime's operator reads it.")
    if typed_call_id.strip().lower() != call.call_id[:12]:
        problems["confirm_call_id"] = _("Type the first 12 characters of this call's call_id to confirm.")
    if needs_second_tick(call) and not confirm_queryable:
        problems["confirm_queryable"] = _(
            "The runtime can check this call with its target by itself. Tick the box to decide anyway."
        )
    return problems


def _data(value: object) -> SafeString:
    """A value a message quotes (a name, a reason, an error): data, never translated."""
    return format_html('<span translate="no">{}</span>', value)


def _already_decided(existing: HumanDecision) -> SafeString:
    # The name stays bare text: it opens the sentence the English pages and tests read whole.
    return format_html(
        _("{actor} already settled this call as {resolution} at {time}: “{reason}”. A decision is not changed."),
        actor=existing.actor,
        resolution=i18n.word(existing.resolution),
        time=i18n.shown_time(existing.decided_at),
        reason=_data(existing.reason),
    )


def _receipt_changed(run: Run, call: Call) -> SafeString:
    """What the receipt says now, beside what the page showed (when this process can read it)."""
    try:
        receipt = read_json_file(Path(run.path) / "receipts" / f"{call.call_id}.json", Path(run.path))
    except (OSError, ValueError):
        receipt = None
    if not isinstance(receipt, dict):
        now_says = _("it can no longer be read as a receipt")
    else:
        now_says = format_html(
            _("it now says {status}, updated at {time}"),
            status=i18n.word(str(receipt.get("status"))),
            time=i18n.shown_time(receipt.get("updated_at")),
        )
    return format_html(
        _("The receipt changed since this page showed it ({status}): {now}. The runtime moved on; nothing was "
          "recorded. Look again before deciding."),
        status=i18n.word(call.status),
        now=now_says,
    )  # fmt: skip
