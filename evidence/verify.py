"""Checking exported evidence with no database: the manifest, the page, and the original run.

Standard library and the protocol only, so ``verify_evidence`` runs from a
clone of the project with no migrations and no database.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.reader import read_run

FORMAT = "callproof-evidence/v1"
SECTIONS = ("run", "calls", "submissions", "events", "findings", "confirmations")


def whole_digest(section_digests: Any, policy: Any) -> str:
    """The digest of the whole export: its format, every section's digest, and the policy."""
    whole = {"format": FORMAT, "sections": section_digests, "policy": policy}
    return protocol.sha256_hex(protocol.canonical_json(whole))


PAGE_DIGEST = re.compile(r'<code class="digest" data-section="([a-z]+)">([0-9a-f]{64})</code>')


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
    problems += _check_page(directory, manifest)
    if against is not None:
        problems += _check_against(document, Path(against))
    return problems


def _check_page(directory: Path, manifest: dict[str, Any]) -> list[str]:
    try:
        data = (directory / "index.html").read_bytes()
        page = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return [f"index.html cannot be read: {error}"]
    if manifest.get("page_sha256") != protocol.sha256_hex(data):
        return [
            f"index.html: its digest is {protocol.sha256_hex(data)}, the manifest says {manifest.get('page_sha256')}"
        ]
    shown = dict(PAGE_DIGEST.findall(page))
    expected = {"whole": manifest.get("whole"), **manifest["sections"]}
    problems = [
        f"index.html shows {name} as {shown.get(name)}, evidence.json says {digest}"
        for name, digest in expected.items()
        if shown.get(name) != digest
    ]
    if f'<meta name="evidence-sha256" content="{manifest.get("whole")}">' not in page:
        problems.append("index.html does not name the whole digest in its head")
    return problems


def _check_against(document: dict[str, Any], run_dir: Path) -> list[str]:
    """Each call_id, input digest and redacted args value against the original receipts."""
    files, _ = read_run(run_dir, keep_events=False)
    receipts = {call.call_id: call for call in files.calls if call.receipt_present}
    problems = []
    exported = {call.get("call_id"): call for call in document.get("calls") or [] if isinstance(call, dict)}
    for call_id in sorted(set(receipts) | set(exported)):
        original, shown = receipts.get(call_id), exported.get(call_id)
        if original is None or shown is None:
            problems.append(
                f"call {call_id}: {'not in the run directory' if original is None else 'not in the export'}"
            )
            continue
        if shown.get("input_sha256") != original.input_sha256:
            problems.append(f"call {call_id}: input_sha256 differs from the receipt's")
        if original.recomputed_call_id and original.recomputed_call_id != original.declared_call_id:
            problems.append(f"call {call_id}: the original receipt does not give its call_id")
        problems += _check_args(call_id, shown.get("args"), original.args)
    return problems


def _check_args(call_id: str, shown: Any, original: Any) -> list[str]:
    if not isinstance(shown, dict) or not isinstance(original, dict):
        return [] if shown == original else [f"call {call_id}: args differ"]
    problems = []
    for name, value in original.items():
        kept = shown.get(name)
        if protocol.is_redaction_marker(kept):
            if kept != protocol.redacted(value):
                problems.append(f"call {call_id}: the redacted digest of args.{name} is not the original's")
        elif kept != value:
            problems.append(f"call {call_id}: args.{name} in clear differs from the original")
    return problems
