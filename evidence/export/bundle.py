"""Redacted evidence of one run: ``evidence.json`` and a self-contained ``index.html``.

``evidence.json`` holds sections (run, calls, submissions, events, findings,
confirmations) and a manifest: the SHA-256 of each section's canonical JSON,
and of the whole (the format, the section digests and the policy). Sections are
streamed row by row from the database and hashed as they are written, so a run
of any size is exported in flat memory. ``verify.verify_export`` checks it all
again without a database.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from django.utils import translation

from evidence.export.redaction import Policy, clear, fields
from evidence.models import AuditEntry, Call, Confirmation, Event, Finding, Run, Submission
from evidence.review import selectors
from receipts import protocol
from receipts.protocol import EVENT_FACT_FIELDS, redacted
from receipts.reader import evidence_page
from receipts.reader.evidence_page import FORMAT, PAGE_ROWS, SECTIONS
from receipts.reader.verify import whole_digest

log = logging.getLogger("callproof.export")

CONFLICT_REASONS = {
    "request_digest_differs",
    "digest_schema_version_differs",
    "task_file_differs",
    "task_missing",
    "task_digest_mismatch",
    "record_unreadable",
    "record_invalid",
}
PROGRESS_EVERY = 5000  # rows between two progress reports: a 100k-event run reports 20 times
# Told (rows written, rows in all) as the export goes: the worker shows it on the run page.
Progress = Callable[[int, int], None]


@dataclasses.dataclass
class ExportResult:
    directory: Path
    manifest: dict[str, Any]
    counts: dict[str, int]


def export_run(
    *,
    run: Run,
    out: Path,
    policy: Policy,
    actor: str = "export_evidence",
    user=None,
    progress: Progress | None = None,
    language: str | None = None,
) -> ExportResult:
    """Write ``out/evidence.json`` and ``out/index.html`` for ``run``, redacted under ``policy``;
    ``progress`` is told how far it is every ``PROGRESS_EVERY`` rows, and once at the end.

    The page is in ``language`` (a Django language code), by default the active one.
    Every export is audited (who, when), beside holds and retention, and logged.
    """
    language = language or translation.get_language()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digests: dict[str, str] = {}
    counts: dict[str, int] = {}
    # What the page shows, exactly as evidence.json gives it back: the verifier renders the page
    # again from evidence.json and compares the bytes (evidence_page).
    shown: dict[str, Any] = {name: [] for name in evidence_page.LISTED}
    sources = _sections(run, policy)
    tally = _Tally(progress, _row_total(run) if progress else 0)
    with (out / "evidence.json").open("wb") as stream:
        stream.write(b'{"format":' + json.dumps(FORMAT).encode())
        for name in SECTIONS:
            stream.write(f',"{name}":'.encode())
            value = sources[name]
            if isinstance(value, dict):
                data = protocol.canonical_json(value)
                stream.write(data)
                digests[name], counts[name] = protocol.sha256_hex(data), 1
                shown[name] = json.loads(data)
            else:
                digests[name], counts[name] = _write_list(stream, tally.counted(value), shown.get(name))
        manifest: dict[str, Any] = {"sections": digests, "policy": policy.describe()}
        manifest["whole"] = whole_digest(digests, manifest["policy"])
        manifest["page"] = {"format": evidence_page.PAGE_FORMAT, "language": evidence_page.page_language(language)}
        # The page shows the manifest, and the manifest then names the page's own digest.
        page = evidence_page.render(
            run=shown["run"], rows={name: shown[name] for name in evidence_page.LISTED}, counts=counts,
            manifest=json.loads(protocol.canonical_json(manifest)), language=manifest["page"]["language"],
        )  # fmt: skip
        (out / "index.html").write_bytes(page)
        manifest["page_sha256"] = protocol.sha256_hex(page)
        stream.write(b',"manifest":' + protocol.canonical_json(manifest) + b"}\n")
    tally.report()
    AuditEntry.objects.create(
        run=run, action=AuditEntry.EVIDENCE_EXPORTED, actor=actor, user=user, at=protocol.utc_now()
    )
    log.info("evidence exported", extra={"event": "evidence_exported", "run_id": run.run_id, "actor": actor})
    return ExportResult(out, manifest, counts)


class _Tally:
    """Counts the rows that go by, and tells ``progress`` now and then."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def counted(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            yield item
            self.done += 1
            if self.progress and self.done % PROGRESS_EVERY == 0:
                self.report()

    def report(self) -> None:
        if self.progress:
            # The rows may have grown since they were counted (a live run): never past the whole.
            self.total = max(self.total, self.done)
            self.progress(self.done, self.total)


def _row_total(run: Run) -> int:
    """The rows of every list section, counted before they are written."""
    return (
        _calls(run).count()
        + Submission.objects.filter(run=run).count()
        + Event.objects.filter(run=run).count()
        + _open_findings(run).count()
        + Confirmation.objects.filter(run=run).count()
    )


def _calls(run: Run):
    return Call.objects.filter(run=run).order_by("call_id")


def _open_findings(run: Run):
    return Finding.objects.filter(run=run, closed_at__isnull=True).order_by("code", "subject")


def _sections(run: Run, policy: Policy) -> dict[str, Any]:
    """Each section's value: the run's record, and lazy row streams for the lists."""
    events = Event.objects.filter(run=run).order_by("seq")
    return {
        "run": _run_record(run, policy),
        "calls": (_call_record(call, policy) for call in _calls(run).iterator(2000)),
        "submissions": _submission_records(run, policy),
        "events": (_event_record(event, policy) for event in events.iterator(5000)),
        "findings": (_finding_record(finding, policy) for finding in _open_findings(run).iterator(2000)),
        "confirmations": (
            _confirmation_record(confirmation, policy)
            for confirmation in Confirmation.objects.filter(run=run).order_by("call_id").iterator(2000)
        ),
    }


def _write_list(stream: BinaryIO, items: Iterable[Any], first: list[Any] | None = None) -> tuple[str, int]:
    """Stream a list as canonical JSON, hashing exactly the bytes written; its first
    ``PAGE_ROWS`` items, read back, go to ``first`` (what the page shows)."""
    digest = hashlib.sha256(b"[")
    stream.write(b"[")
    count = 0
    for item in items:
        item_data = protocol.canonical_json(item)
        if first is not None and count < PAGE_ROWS:
            first.append(json.loads(item_data))
        data = (b"," if count else b"") + item_data
        digest.update(data)
        stream.write(data)
        count += 1
    digest.update(b"]")
    stream.write(b"]")
    return digest.hexdigest(), count


def _time(moment: Any) -> str | None:
    return protocol.format_time(moment) if moment is not None else None


def _run_record(run: Run, policy: Policy) -> dict[str, Any]:
    summary = selectors.run_summaries(runs=[run])[run.pk]
    return {
        "run_id": clear(run.run_id, policy),
        "state": clear(run.state, policy),
        "attempts": clear(run.attempts, policy),
        "contract_sha256": run.contract_sha256,
        "events": run.event_count,
        "first_event_at": _time(run.first_event_at),
        "last_event_at": _time(run.last_event_at),
        "calls_by_status": clear(summary.calls_by_status, policy),
        "verdict": summary.verdict,
        "open_findings": summary.open_findings,
    }


def _call_record(call: Call, policy: Policy) -> dict[str, Any]:
    allowed = [name for name in (call.args or {}) if policy.allows(call.tool, name)]
    return {
        "call_id": clear(call.call_id, policy),
        "tool": clear(call.tool, policy),
        "tool_version": clear(call.tool_version, policy),
        "identity": clear(call.identity, policy),
        "attempt": clear(call.attempt, policy),
        "status": clear(call.status, policy),
        "shown_status": clear(call.shown_status, policy),
        "input_sha256": clear(call.input_sha256, policy),
        "output_sha256": clear(call.output_sha256, policy),
        "identity_verified": call.verification == protocol.VERIFIED,
        "verification": call.verification,
        "decision": call.decision,
        "args": fields(call.args, allowed, policy) if call.args is not None else None,
        "result": redacted(call.result) if call.result is not None else None,
        "error": redacted(call.error) if call.error is not None else None,
        "created_at": _time(call.created_at),
        "updated_at": _time(call.updated_at),
    }


def _submission_records(run: Run, policy: Policy) -> Iterator[dict[str, Any]]:
    for submission in Submission.objects.filter(run=run).order_by("client_submission_id").iterator(1000):
        history = Event.objects.filter(
            run=run, type="submission", client_submission_id=submission.client_submission_id
        ).order_by("seq")
        yield {
            "client_submission_id": clear(submission.client_submission_id, policy),
            "state": clear(submission.state, policy),
            "task_id": clear(submission.task_id, policy),
            "request_digest": clear(submission.request_digest, policy),
            "request": redacted(submission.request),
            "task_sha256": clear(submission.task_sha256, policy),
            "history": [
                {
                    "seq": event.seq,
                    "ts": _time(event.ts),
                    "disposition": event.disposition,
                    "action_taken": clear(event.payload.get("action_taken"), policy),
                    "request_digest": clear(event.request_digest, policy),
                    "reason": _reason(event.payload.get("reason")),
                }
                for event in history
            ],
        }


def _reason(reason: Any) -> Any:
    """A known conflict reason in clear, anything else (text, or an object a ledger line gave
    it) redacted."""
    return reason if reason is None or (isinstance(reason, str) and reason in CONFLICT_REASONS) else redacted(reason)


def _event_record(event: Event, policy: Policy) -> dict[str, Any]:
    payload = event.payload if isinstance(event.payload, dict) else {}
    shown = fields(payload, EVENT_FACT_FIELDS, policy)
    if "reason" in payload:
        shown["reason"] = _reason(payload["reason"])
    if "client_submission_id" in payload:
        shown["client_submission_id"] = clear(payload["client_submission_id"], policy)
    return {"seq": event.seq, "line_sha256": event.line_sha256, "payload": shown}


def _finding_record(finding: Finding, policy: Policy) -> dict[str, Any]:
    return {
        "code": finding.code,
        "severity": finding.severity,
        "subject": clear(finding.subject, policy),
        "detail": redacted(finding.detail),
        "call_id": clear(finding.call_id, policy),
        "stored_value": _digest_or_redacted(finding.stored_value),
        "recomputed_value": _digest_or_redacted(finding.recomputed_value),
        "first_seen": _time(finding.first_seen),
    }


def _digest_or_redacted(value: str) -> Any:
    return value if not value or protocol.HEX64_RE.fullmatch(value) else redacted(value)


def _confirmation_record(confirmation: Confirmation, policy: Policy) -> dict[str, Any]:
    return {
        "call_id": clear(confirmation.call_id, policy),
        "resolution": clear(confirmation.resolution, policy),
        "valid": confirmation.valid,
        "actor": redacted(confirmation.actor),
        "reason": redacted(confirmation.reason),
        "confirmed_at": _time(confirmation.confirmed_at),
        "receipt_sha256": _digest_or_redacted(confirmation.receipt_sha256),
        "confirmation_id": _digest_or_redacted(confirmation.confirmation_id),
    }
