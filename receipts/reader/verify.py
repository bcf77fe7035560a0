"""Checking exported evidence with no database: the manifest, the page, and the original run.

Standard library and the protocol only, so ``verify_evidence`` runs from a
clone of the project with no migrations and no database.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.reader import evidence_page, read_run
from receipts.reader.evidence_page import FORMAT, SECTIONS


def whole_digest(section_digests: Any, policy: Any) -> str:
    """The digest of the whole export: its format, every section's digest, and the policy."""
    whole = {"format": FORMAT, "sections": section_digests, "policy": policy}
    return protocol.sha256_hex(protocol.canonical_json(whole))


def verify_export(directory: Path, against: Path | None = None) -> list[str]:
    """Every difference found, in words; an empty list means the export is intact."""
    directory = Path(directory)
    try:
        document = protocol.load_json_strict((directory / "evidence.json").read_bytes())
    except (OSError, ValueError) as error:
        return [f"evidence.json cannot be read: {error}"]
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return [f"evidence.json is not {FORMAT}"]
    manifest = document.get("manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sections"), dict):
        return ["evidence.json has no manifest"]
    problems = []
    digests = {}
    for name in SECTIONS:
        digests[name] = protocol.sha256_hex(protocol.canonical_json(document.get(name)))
        if manifest["sections"].get(name) != digests[name]:
            problems.append(
                f"section {name}: its digest is {digests[name]}, the manifest says {manifest['sections'].get(name)}"
            )
    whole = whole_digest(manifest["sections"], manifest.get("policy"))
    if manifest.get("whole") != whole:
        problems.append(f"the whole: its digest is {whole}, the manifest says {manifest.get('whole')}")
    problems += _check_page(directory, document, manifest)
    if against is not None:
        problems += _check_against(document, Path(against))
    return problems


def _check_page(directory: Path, document: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """The page is what an outsider reads: it must be the page evidence.json renders, byte for
    byte, in the language the manifest names (``evidence_page``)."""
    try:
        data = (directory / "index.html").read_bytes()
    except OSError as error:
        return [f"index.html cannot be read: {error}"]
    problems = []
    if manifest.get("page_sha256") != protocol.sha256_hex(data):
        problems.append(
            f"index.html: its digest is {protocol.sha256_hex(data)}, the manifest says {manifest.get('page_sha256')}"
        )
    page = evidence_page.mapping(manifest.get("page"))
    if page.get("format") not in evidence_page.PAGE_FORMATS or page.get("language") not in evidence_page.LANGUAGES:
        problems.append(
            f"index.html: the manifest names page format {_short(page.get('format'))} in "
            f"{_short(page.get('language'))}; this verifier renders {' or '.join(evidence_page.PAGE_FORMATS)} in "
            f"{' or '.join(evidence_page.LANGUAGES)}, so what the page says cannot be checked"
        )
        return problems
    expected = evidence_page.render_from(document, page["language"], page["format"])
    if data != expected:
        problems.append("index.html does not say what evidence.json says: " + _first_difference(data, expected))
    return problems


def _first_difference(shown: bytes, expected: bytes) -> str:
    """Where the page first departs from the one evidence.json renders, as a line of each."""
    shown_lines = shown.decode("utf-8", "replace").splitlines()
    expected_lines = expected.decode("utf-8").splitlines()
    for number, (seen, wanted) in enumerate(zip(shown_lines, expected_lines, strict=False), start=1):
        if seen != wanted:
            return f"line {number} is {_short(seen, 200)}, evidence.json gives {_short(wanted, 200)}"
    if len(shown_lines) != len(expected_lines):
        return f"the page has {len(shown_lines)} lines, evidence.json gives {len(expected_lines)}"
    return "the pages differ in their line endings or bytes"


# Fields the dashboard derives (verdicts, decisions, counts, findings) are not in the run
# directory: they are checked by the manifest, not against the original.
CALL_FIELDS = ("tool", "tool_version", "identity", "attempt", "status", "input_sha256", "output_sha256",
               "args", "result", "error", "created_at", "updated_at")  # fmt: skip
SUBMISSION_FIELDS = ("state", "task_id", "request_digest", "request", "task_sha256")
CONFIRMATION_FIELDS = ("resolution", "actor", "reason", "confirmed_at", "receipt_sha256", "confirmation_id")
RUN_FIELDS = ("run_id", "state", "attempts", "contract_sha256")


def _check_against(document: dict[str, Any], run_dir: Path) -> list[str]:
    """Every field the export holds, in clear or as a digest, against the original run directory."""
    files, events = read_run(run_dir)
    problems = _differences("run", _pick(document.get("run"), RUN_FIELDS), _pick_original(files, RUN_FIELDS))
    if isinstance(document.get("run"), dict) and document["run"].get("events") != len(events):
        problems.append(
            f"run.events: the export counts {document['run'].get('events')!r}, the ledger has {len(events)}"
        )
    calls = {call.call_id: call for call in files.calls if call.receipt_present}
    problems += _check_section(document, "calls", "call_id", calls, CALL_FIELDS)
    submissions = {record.client_submission_id: record for record in files.submissions}
    problems += _check_section(document, "submissions", "client_submission_id", submissions, SUBMISSION_FIELDS)
    confirmations = {record.call_id: record for record in files.confirmations}
    problems += _check_section(document, "confirmations", "call_id", confirmations, CONFIRMATION_FIELDS)
    problems += _check_events(document.get("events"), events)
    for call in calls.values():
        if call.recomputed_call_id and call.recomputed_call_id != call.declared_call_id:
            problems.append(f"call {call.call_id}: the original receipt does not give its call_id")
    return problems


def _check_section(
    document: dict[str, Any], section: str, key: str, originals: dict[str, Any], names: tuple[str, ...]
) -> list[str]:
    """One section's records, matched by ``key`` (shown in clear or as its digest), field by field."""
    entries = document.get(section)
    if not isinstance(entries, list):
        return [f"{section}: not a list"]
    # An id is shown in clear, or redacted (the scanner saw a secret in it) as its marker.
    by_shown = {_canonical(name): name for name in originals} | {
        _canonical(protocol.redacted(name)): name for name in originals
    }
    problems, seen = [], set()
    for index, entry in enumerate(entries):
        shown = entry.get(key) if isinstance(entry, dict) else None
        if isinstance(shown, str):
            shown_key = shown
        elif protocol.is_redaction_marker(shown):
            shown_key = shown["redacted"]
        else:
            problems.append(f"{section}[{index}]: no {key}")
            continue
        name = by_shown.get(_canonical(shown))
        if name is None:
            problems.append(f"{section} {shown_key}: not in the run directory")
            continue
        seen.add(name)
        original = _pick_original(originals[name], names)
        problems += _differences(f"{section} {shown_key}", _pick(entry, names), original)
    problems += [f"{section} {name}: in the run directory, not in the export" for name in sorted(set(originals) - seen)]
    return problems


def _check_events(entries: Any, events: list[Any]) -> list[str]:
    if not isinstance(entries, list):
        return ["events: not a list"]
    originals = {event.seq: event for event in events}
    problems, seen = [], set()
    for index, entry in enumerate(entries):
        seq = entry.get("seq") if isinstance(entry, dict) else None
        if not protocol.is_whole_number(seq):
            problems.append(f"events[{index}]: no seq")
            continue
        original = originals.get(seq)
        if original is None:
            problems.append(f"event {seq}: not in the ledger")
            continue
        seen.add(seq)
        if entry.get("line_sha256") != original.line_sha256:
            problems.append(f"event {seq}: line_sha256 is not the digest of the ledger's line {original.line_no}")
        try:
            payload = protocol.load_json_text(original.payload)
        except ValueError:
            payload = None
        problems += _differences(f"event {seq}", entry.get("payload"), payload)
    problems += [f"event {seq}: in the ledger, not in the export" for seq in sorted(set(originals) - seen)]
    return problems


def _canonical(value: Any) -> str:
    return protocol.canonical_json(value).decode()


def _digest_of(value: Any) -> str:
    return protocol.redacted(value)["redacted"]


def _pick(entry: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: entry[name] for name in names if name in entry} if isinstance(entry, dict) else {}


def _pick_original(record: Any, names: tuple[str, ...]) -> dict[str, Any]:
    values = {name: getattr(record, name) for name in names}
    return {name: protocol.format_time(value) if isinstance(value, dt.datetime) else value
            for name, value in values.items()}  # fmt: skip


def _differences(where: str, shown: Any, original: Any) -> list[str]:
    """Each place where ``shown`` is neither ``original`` nor its digest, as a line. Only the
    export's own values are quoted: the original may hold what the export redacted."""
    if protocol.is_redaction_marker(shown):
        return [] if shown == protocol.redacted(original) else [f"{where}: the redacted digest is not the original's"]
    if isinstance(shown, dict) and isinstance(original, dict):
        # A key that looked like a secret is shown as its digest.
        by_shown = {name: name for name in original} | {_digest_of(name): name for name in original}
        problems, seen = [], set()
        for key, value in shown.items():
            name = by_shown.get(key)
            if name is None:
                problems.append(f"{where}.{key}: not in the original")
                continue
            seen.add(name)
            problems += _differences(f"{where}.{key}", value, original[name])
        return problems + [f"{where}: a field of the original is not in the export" for _ in set(original) - seen]
    if isinstance(shown, list) and isinstance(original, list) and len(shown) == len(original):
        return [
            problem
            for index, (a, b) in enumerate(zip(shown, original, strict=True))
            for problem in _differences(f"{where}[{index}]", a, b)
        ]
    if shown != original:
        return [f"{where}: the export says {_short(shown)}, the original differs"]
    return []


def _short(value: Any, length: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= length else text[: length - 1] + "…"
