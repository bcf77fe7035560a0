"""The run directory contract: formulas, strict JSON, durable writes, the ledger.

Everything here follows ``RUN_DIRECTORY.md`` to the letter and uses the
standard library only, so an agent runtime can vendor this file (and the
writer, ``runtime/``) without Django.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import math
import os
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, TypeGuard

from receipts.findings import Sentence

IDENTITY_V1 = "call-id-v1"
IDENTITY_V2 = "call-id-v2"
IDENTITIES = (IDENTITY_V1, IDENTITY_V2)
DIGEST_SCHEMA = "write-task-v1"
REQUEST_FIELDS = (
    "sender",
    "recipient",
    "subject",
    "body",
    "priority",
    "thread_key",
    "parent",
    "references",
    "depends_on",
    "risk_level",
)
# One order for each list, used wherever they are shown: statuses as the charts
# stack them, decisions most urgent first.
RECEIPT_STATUSES = ("committed", "prepared", "unknown", "rejected")
# The receipt statuses that do not say whether the effect happened: what a query or a person
# settles. Whether a call is in doubt is its recovery decision's to say (``in_doubt``).
OPEN_STATUSES = ("prepared", "unknown")
# What the pages show instead of a receipt's status when it fails its check: whatever the
# receipt says, it proves nothing, and is never shown as committed. "disputed" is a
# committed receipt that passes its check but whose target the writer found without
# its effect (the ledger's ``reuse_refused``).
SHOWN_FOR_VERDICT = {"mismatch": "tampered", "unverifiable": "unverified", "disputed": "disputed"}
LEGACY_STATUS = "failed"
DECISIONS = ("confirm", "query", "retry", "stop", "reuse")
# The one rule for "in doubt": a call whose recovery decision (``recovery.decide``) waits for
# its target to be asked or for a person. It covers an open status, a receipt that fails its
# identity check, a commit its target does not show, a legacy "failed" and a missing receipt;
# a call with another decision is settled, or needs nobody. The writer, the inbox, the run's
# counts, retention, settling and /metrics all ask it (the dashboard through ``Call.in_doubt``).
IN_DOUBT_DECISIONS = ("confirm", "query")
RESOLUTIONS = ("committed", "rejected")  # what a person's confirmation may say
# Event fields that are ids, digests, statuses, tool names, times or counts: facts, never bodies.
# Evidence shows them in clear; retention keeps them when it strips a run's bodies.
EVENT_FACT_FIELDS = {
    "seq",
    "ts",
    "type",
    "prev_sha256",
    "call_id",
    "tool",
    "attempt",
    "status",
    "state",
    "attempts",
    "request_digest",
    "digest_schema_version",
    "disposition",
    "action_taken",
    "task_id",
    "legacy",
    "resolution",
    "confirmation_id",
    "receipt_sha256",
    "recovered",
    "reason",
    "call_ids",
    "action",
    "signature",
}
# The seed's rule: tools run only while the run may still act. A run starts in
# "running" at attempt 1; "retrying" means the next attempt is due.
CALLABLE_STATES = ("running", "retrying")
# The one rule for "finished": a run in one of these states writes nothing more. Its page stops
# refreshing, retention may strip and archive it, /metrics stops watching its import lag. Names
# are matched exactly, as the runtime wrote them (``in_doubt``'s twin: ``run_is_finished``).
FINISHED_STATES = ("finished", "succeeded", "completed", "failed", "cancelled", "stopped")
SUBMISSION_STATES = ("reserved", "task_created", "committed")
DISPOSITIONS = ("created", "reused", "conflict")
ZERO_HASH = "0" * 64
LEDGER_NAME = "events.jsonl"
WRITER_DIR = ".writer"  # the writer's locks and task counter; readers skip dot names
RUN_FOLDERS = ("receipts", "submissions", "tasks", "confirmations")
MAX_SUBMISSION_ID_LENGTH = 256
# A call_id names a receipt file and a page: the reader refuses longer names.
MAX_CALL_ID_LENGTH = 200
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
HEX64_RE = re.compile(r"[0-9a-f]{64}")
MAX_JSON_DEPTH = 256
# A call's arguments and result are read back inside envelopes: a receipt, the daemon's
# messages, an export's evidence.json (document, calls, call: three levels). What the writer
# accepts must read back in every one of them, so a value may nest this much less.
VALUE_ENVELOPE_DEPTH = 8
MAX_VALUE_DEPTH = MAX_JSON_DEPTH - VALUE_ENVELOPE_DEPTH
# What a value costs in memory is its values, not its bytes: 13 MB of "{}," are six million
# dicts (700 MB parsed). A call's arguments or result holds at most this many values.
MAX_VALUE_NODES = 250_000
# A receipt holds its arguments and its result, and the reader reads a record file of up to
# 16 MiB (reader.safe_open.MAX_JSON_BYTES): each has a share of it, as canonical JSON.
MAX_ARGS_BYTES = 4 * 1024 * 1024
MAX_RESULT_BYTES = 8 * 1024 * 1024
# The largest integer the format gives a meaning to (seq, attempt, attempts): what a
# 64-bit signed column holds. Larger numbers are a schema error, never a crash.
MAX_INT = 2**63 - 1


def in_doubt(decision: str) -> bool:
    """Whether a call with this recovery decision waits for its target or a person."""
    return decision in IN_DOUBT_DECISIONS


def run_is_finished(state: str) -> bool:
    """Whether a run in this state writes nothing more (``FINISHED_STATES``)."""
    return state in FINISHED_STATES


def canonical_json(value: Any) -> bytes:
    """The one byte form every digest is taken over."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def record_value_problem(value: Any, max_bytes: int) -> str | None:
    """Why ``value`` cannot be a call's arguments or result, or ``None``: it must be a JSON object
    whose canonical form is at most ``max_bytes`` and reads back under ``load_json_strict``'s rules
    (no NaN or infinity, no lone surrogate, no set or datetime), nested at most
    ``MAX_VALUE_DEPTH`` deep so that it reads back inside every envelope it travels in. A value the
    writer recorded and could not read back would stop every later call of the run."""
    if not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__}"
    try:
        data = canonical_json(value)
    except UnicodeEncodeError:
        return "a lone surrogate in a string"
    except (TypeError, ValueError, RecursionError) as error:
        return f"not JSON: {str(error)[:200]}"
    if len(data) > max_bytes:
        return f"larger than {max_bytes // (1024 * 1024)} MiB as JSON ({len(data):,} bytes)"
    if json_nodes(data) > MAX_VALUE_NODES:
        return f"more than {MAX_VALUE_NODES:,} values (objects, arrays, strings, numbers) as JSON"
    # Nesting deeper than the limit needs more brackets than the limit: most values skip the walk.
    if data.count(b"[") + data.count(b"{") > MAX_VALUE_DEPTH and json_depth(value) > MAX_VALUE_DEPTH:
        return f"nesting deeper than {MAX_VALUE_DEPTH}"
    try:
        load_json_strict(data)
    except ValueError as error:
        return str(error)
    return None


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_nodes(data: bytes) -> int:
    """At most how many values the JSON text ``data`` holds, counted without parsing it: one,
    and one more for each comma, ``[`` and ``{`` outside its strings (those inside are counted
    too while that stays under ``MAX_VALUE_NODES``: most texts need no look at their strings).
    Cheap next to a parse, which costs some 100 bytes of memory a value: what bounds a message
    before it is parsed."""

    def counted(text: bytes) -> int:
        return 1 + text.count(b",") + text.count(b"[") + text.count(b"{")

    everywhere = counted(data)  # its strings' commas and brackets too: more, never fewer
    if everywhere <= MAX_VALUE_NODES or b'"' not in data:
        return everywhere
    inside = 0  # counted where each string lies, with no copy of the text
    for match in _JSON_STRING.finditer(data):
        start, end = match.span()
        inside += data.count(b",", start, end) + data.count(b"[", start, end) + data.count(b"{", start, end)
    return everywhere - inside


def json_depth(value: Any) -> int:
    """How deep ``value`` nests, as ``load_json_strict`` counts (a scalar at the top is 0, each
    object or array around a value adds one). Iterative: bounded by the value, not the C stack."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


# A run's own files: a run directory under one of these names would make its runs root look
# like a run (``reader.looks_like_run``), and every run in it vanish from a listing.
RUN_FILE_NAMES = ("steer.json", "state.json", LEDGER_NAME)


def valid_run_id(name: str) -> bool:
    """1-128 characters of ``[A-Za-z0-9._-]``, not starting with a dot, and not the name of one
    of a run's own files."""
    return bool(RUN_ID_RE.fullmatch(name)) and not name.startswith(".") and name not in RUN_FILE_NAMES


def valid_record_name(name: Any) -> bool:
    """Whether ``name`` can be one record file of a run folder as a shipper sends it and the
    dashboard's mirror keeps it: text that is UTF-8 (a name that is not arrives as surrogates),
    1-255 bytes of it, no ``/``, no NUL, not starting with a dot (the writer's temp and lock files)."""
    if not isinstance(name, str) or not name or "/" in name or "\x00" in name or name.startswith("."):
        return False
    try:
        return len(name.encode("utf-8")) <= 255
    except UnicodeEncodeError:
        return False


def valid_call_name(call_id: Any) -> bool:
    """Whether ``call_id`` can name a receipt file (``receipts/<call_id>.json``) and a page."""
    return (
        isinstance(call_id, str)
        and 0 < len(call_id) <= MAX_CALL_ID_LENGTH
        and "/" not in call_id
        and "\x00" not in call_id
        and not call_id.startswith(".")
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_call_id(
    contract_sha256: str,
    attempt: int,
    tool: str,
    args: Any,
    tool_version: str | None = None,
    identity: str = IDENTITY_V1,
) -> str:
    identity_object: dict[str, Any] = {
        "contract_sha256": contract_sha256,
        "attempt": attempt,
        "tool": tool,
        "args": args,
    }
    if identity == IDENTITY_V2:
        identity_object["tool_version"] = tool_version
    elif identity != IDENTITY_V1:
        raise ValueError(f"unknown identity formula {identity!r}")
    return sha256_hex(canonical_json(identity_object))


# --- the identity check ----------------------------------------------------

VERIFIED, MISMATCH, UNVERIFIABLE, DISPUTED = "verified", "mismatch", "unverifiable", "disputed"
_MISMATCH_CODES = (
    "signature_invalid",
    "receipt_name_mismatch",
    "contract_mismatch",
    "input_digest_mismatch",
    "identity_mismatch",
    "output_digest_mismatch",
)


@dataclasses.dataclass(frozen=True)
class IdentityCheck:
    """Whether a receipt is the call it claims to be (and, committed, the outcome it claims), and why not."""

    verdict: str  # verified, mismatch, unverifiable
    recomputed_call_id: str  # "" when an input is missing
    inputs: dict[str, Any]  # identity, contract_sha256, attempt, tool, tool_version: what was used
    problems: tuple[tuple[str, str, str, str], ...] = ()  # (finding code, detail, stored, recomputed)

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED

    def summary(self) -> str:
        return "; ".join(detail for _, detail, _, _ in self.problems) or "the receipt is the call it claims to be"


def check_receipt_identity(
    receipt: Mapping[str, Any], *, call_id: str, contract_sha256: str | None, signing_key: SigningKey | None = None
) -> IdentityCheck:
    """The one identity check: the writer, replay, the reader and the pages all call it.

    ``call_id`` is the call the receipt must be (its file's stem, or the call
    being made); ``contract_sha256`` is the run's (steer.json). The call_id is
    recomputed from the receipt's own formula, contract, attempt, tool, tool
    version and args. Any difference, or a contract other than the run's, or an
    ``input_sha256`` other than the args' digest, is a mismatch; a missing
    input makes the receipt unverifiable. A committed receipt must also carry
    its outcome: a ``result`` and an ``output_sha256`` that is its digest
    (missing: unverifiable; another digest: a mismatch), since a status edited
    to ``committed`` would otherwise pass. In a signed run (``signing_key``, the
    run's), the receipt's signature must verify too. Only a verified receipt may
    be reused.
    """
    problems: list[tuple[str, str, str, str]] = []
    if signing_key is not None:
        wrong = signature_problem(receipt, signing_key)
        if wrong is not None:
            problems.append((*wrong, _clip(receipt.get(SIGNATURE_FIELD)), ""))
    declared = receipt.get("call_id")
    if declared != call_id:
        problems.append(("receipt_name_mismatch", Sentence("receipt_name_mismatch.declared"), _clip(declared), call_id))
    stored_contract = receipt.get("contract_sha256")
    if stored_contract is not None and contract_sha256 and stored_contract != contract_sha256:
        problems.append(
            (
                "contract_mismatch",
                Sentence("contract_mismatch.receipt"),
                _clip(stored_contract),
                contract_sha256,
            )
        )
    args = receipt.get("args")
    stored_input = receipt.get("input_sha256")
    if stored_input is not None and isinstance(args, dict) and stored_input != input_sha256(args):
        problems.append(
            ("input_digest_mismatch", Sentence("input_digest_mismatch.args"), _clip(stored_input), input_sha256(args))
        )
    identity = receipt.get("identity", IDENTITY_V1)
    contract = stored_contract if stored_contract is not None else contract_sha256
    inputs = {
        "identity": identity,
        "contract_sha256": contract,
        "attempt": receipt.get("attempt"),
        "tool": receipt.get("tool"),
        "tool_version": receipt.get("tool_version"),
    }
    missing = []
    if identity not in IDENTITIES:
        missing.append(Sentence("identity_unverifiable.formula", identity=repr(_clip(identity, 40))))
    if type(inputs["attempt"]) is not int:
        missing.append(Sentence("identity_unverifiable.attempt"))
    if not isinstance(contract, str) or not contract:
        missing.append(Sentence("identity_unverifiable.contract"))
    if not isinstance(inputs["tool"], str) or not isinstance(args, dict):
        missing.append(Sentence("identity_unverifiable.tool"))
    if identity == IDENTITY_V2 and (not isinstance(inputs["tool_version"], str) or not inputs["tool_version"]):
        missing.append(Sentence("identity_unverifiable.tool_version"))
    recomputed = ""
    if missing or not isinstance(contract, str):  # a contract that is no text is among the missing
        problems.append(("identity_unverifiable", Sentence("identity_unverifiable.missing", missing=missing), "", ""))
    else:
        version = inputs["tool_version"] if identity == IDENTITY_V2 else None
        recomputed = make_call_id(contract, inputs["attempt"], inputs["tool"], args, version, identity)
        if recomputed != declared:
            problems.append(
                (
                    "identity_mismatch",
                    Sentence("identity_mismatch.recomputed", identity=identity, attempt=inputs["attempt"]),
                    _clip(declared),
                    recomputed,
                )
            )
    if receipt.get("status") == "committed":
        problems.extend(_outcome_problems(receipt))
    if any(code in _MISMATCH_CODES for code, _, _, _ in problems):
        verdict = MISMATCH
    elif problems:
        verdict = UNVERIFIABLE
    else:
        verdict = VERIFIED
    return IdentityCheck(verdict, recomputed, inputs, tuple(problems))


def _outcome_problems(receipt: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """A committed receipt's outcome against its digest."""
    stored = receipt.get("output_sha256")
    if not isinstance(receipt.get("result"), dict) or not isinstance(stored, str):
        return [("identity_unverifiable", Sentence("identity_unverifiable.outcome"), "", "")]
    recomputed = input_sha256(receipt["result"])
    if stored == recomputed:
        return []
    return [("output_digest_mismatch", Sentence("output_digest_mismatch.result"), _clip(stored), recomputed)]


def _clip(value: Any, limit: int = 200) -> str:
    return (value if isinstance(value, str) else json.dumps(value, default=str))[:limit]


def normalise_text(value: Any) -> Any:
    """Every string in ``value``, keys included: line ends to ``\\n``, then Unicode NFC.

    ``ValueError`` when two keys of one object become the same key: merging them
    would keep one value and drop the other, so a different request could pass
    for the same one (and the same one, reordered, for another).
    """
    # Line ends first, then NFC: the order the spec fixes.
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value.replace("\r\n", "\n").replace("\r", "\n"))
    if isinstance(value, list):
        return [normalise_text(item) for item in value]
    if isinstance(value, dict):
        normalised: dict[str, Any] = {}
        for key, item in value.items():
            name = normalise_text(key)
            if name in normalised:
                raise ValueError(f"two keys are the same key after normalising (NFC, line ends): {_clip(name, 80)!r}")
            normalised[name] = normalise_text(item)
        return normalised
    return value


def semantic_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ten fields of ``write-task-v1``, as given; a missing one is null."""
    return {field: copy.deepcopy(request.get(field)) for field in REQUEST_FIELDS}


def request_digest(request: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(normalise_text(semantic_request(request))))


def input_sha256(args: Any) -> str:
    return sha256_hex(canonical_json(args))


REDACTION_MARKER_RE = re.compile(r"sha256:[0-9a-f]{64}")


def is_redaction_marker(value: object) -> TypeGuard[dict[str, str]]:
    """Exactly the marker ``redacted`` writes. Anything else shaped like it (``{"redacted":
    "hunter2"}``) is data: trusting the shape would let a value pass through in clear."""
    return (
        isinstance(value, dict)
        and set(value) == {"redacted"}
        and isinstance(value["redacted"], str)
        and REDACTION_MARKER_RE.fullmatch(value["redacted"]) is not None
    )


def redacted(value: Any) -> dict[str, str]:
    """What stands for a value that may not be shown or kept: the digest of its canonical JSON.

    Evidence redacts with it and retention strips with it; a value already
    reduced to its digest (the exact marker, nothing merely shaped like it) stays that digest.
    """
    if is_redaction_marker(value):
        return value
    return {"redacted": f"sha256:{sha256_hex(canonical_json(value))}"}


# --- signatures (optional) ----------------------------------------------------

SIGNATURE_FIELD = "signature"
SIGNATURE_SCHEME = "hmac-sha256"


@dataclasses.dataclass(frozen=True)
class SigningKey:
    """A secret shared by the writer and the dashboard, named by an id that does not reveal it.

    ``run_id``: the run the key signs for (``for_run``). A signature covers it, so a
    record copied from one run into another does not verify there.
    """

    key_id: str
    secret: bytes = dataclasses.field(repr=False)
    run_id: str = ""

    @classmethod
    def from_secret(cls, secret: bytes) -> SigningKey:
        return cls(sha256_hex(b"callproof signing key id\x00" + secret)[:16], secret)

    def for_run(self, run_id: str) -> SigningKey:
        return dataclasses.replace(self, run_id=run_id)


RUN_UID_RE = re.compile(r"[0-9a-f]{32}")


def signing_subject(steer: Any, run_id: str) -> str:
    """What a signed run's signatures are bound to: the random ``run_uid`` its steer.json records
    (made at init, so that two runs of one name, on two hosts or one after the other, never accept
    each other's records), or the run's name for a run signed before runs had one. A NUL byte
    keeps the two apart: no run name holds one."""
    uid = steer.get("run_uid") if isinstance(steer, dict) else None
    return f"run_uid\x00{uid}" if isinstance(uid, str) and RUN_UID_RE.fullmatch(uid) else run_id


def signature_of(document: Mapping[str, Any], key: SigningKey) -> str:
    """``hmac-sha256:<key_id>:<hex>``: HMAC-SHA256 of the run_id, a NUL byte, and the canonical
    JSON of ``document`` without its signature."""
    body = {name: value for name, value in document.items() if name != SIGNATURE_FIELD}
    message = key.run_id.encode("utf-8") + b"\x00" + canonical_json(body)
    mac = hmac.new(key.secret, message, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_SCHEME}:{key.key_id}:{mac}"


def signed(document: Mapping[str, Any], key: SigningKey | None) -> dict[str, Any]:
    """``document`` with its signature (a fresh one), or as it is when there is no key."""
    body = {name: value for name, value in document.items() if name != SIGNATURE_FIELD}
    if key is not None:
        body[SIGNATURE_FIELD] = signature_of(body, key)
    return body


def signature_problem(document: Mapping[str, Any], key: SigningKey) -> tuple[str, str] | None:
    """``(finding code, detail)`` when a record of a run signed with ``key`` does not verify."""
    stored = document.get(SIGNATURE_FIELD)
    if stored is None:
        return ("signature_missing", Sentence("signature_missing.record"))
    if not isinstance(stored, str) or not hmac.compare_digest(stored, signature_of(document, key)):
        return ("signature_invalid", Sentence("signature_invalid.record", key_id=key.key_id))
    return None


# --- task creation -----------------------------------------------------------


def submission_key(client_submission_id: str) -> str:
    """The record's file stem: no caller string ever becomes a path."""
    return sha256_hex(client_submission_id.encode("utf-8"))


def render_task(task_id: str, request: Mapping[str, Any], client_submission_id: str | None) -> bytes:
    """The task file. Deterministic, so a resumed call (and a reader) recognises its own file."""
    fields = normalise_text(semantic_request(request))
    lines = [f"# {task_id}: {fields['subject'] or '(no subject)'}", ""]
    for name in REQUEST_FIELDS:
        if name not in ("subject", "body") and fields[name] is not None:
            lines.append(f"- {name}: {json.dumps(fields[name], ensure_ascii=False)}")
    if client_submission_id is not None:
        lines.append(f"- client_submission_id: {json.dumps(client_submission_id, ensure_ascii=False)}")
    lines += ["", str(fields["body"] or ""), ""]
    return "\n".join(lines).encode("utf-8")


def safe_task_path(task_path: Any) -> bool:
    """A ``task_path`` names one file directly in ``tasks/`` that readers do not skip."""
    if not isinstance(task_path, str) or not task_path.startswith("tasks/"):
        return False
    name = task_path[len("tasks/") :]
    return bool(name) and "/" not in name and "\x00" not in name and not name.startswith(".")


# --- confirmations -----------------------------------------------------------

CONFIRMATION_SCHEMA = "confirmation/v1"


def confirmation_id(call_id: str, resolution: str, receipt_sha256: str) -> str:
    return sha256_hex(canonical_json({"call_id": call_id, "resolution": resolution, "receipt_sha256": receipt_sha256}))


def confirmation_problem(
    confirmation: Any, call_id: str, receipt_sha256: str | None, signing_key: SigningKey | None = None
) -> str | None:
    """Why a confirmation does not hold for the receipt with this digest, or ``None`` when it does.

    In a signed run (``signing_key``) its signature must verify: a decision
    anyone could write would let an agent confirm its own effects.
    """
    if not isinstance(confirmation, dict) or confirmation.get("schema") != CONFIRMATION_SCHEMA:
        return Sentence("confirmation_invalid.schema", schema=CONFIRMATION_SCHEMA)
    if signing_key is not None and (wrong := signature_problem(confirmation, signing_key)) is not None:
        return wrong[1]
    if confirmation.get("call_id") != call_id:
        return Sentence("confirmation_invalid.other_call")
    resolution = confirmation.get("resolution")
    if resolution not in RESOLUTIONS:
        return Sentence("confirmation_invalid.resolution", resolution=repr(_clip(resolution, 40)))
    if receipt_sha256 is None:
        return Sentence("confirmation_invalid.no_receipt")
    if confirmation.get("receipt_sha256") != receipt_sha256:
        return Sentence("confirmation_invalid.receipt_changed")
    if confirmation.get("confirmation_id") != confirmation_id(call_id, resolution, receipt_sha256):
        return Sentence("confirmation_invalid.confirmation_id")
    if not isinstance(confirmation.get("reason"), str) or not confirmation["reason"].strip():
        return Sentence("confirmation_invalid.no_reason")
    return None


# --- times -------------------------------------------------------------------


def utc_now() -> dt.datetime:
    """Now, or the fixed instant in ``RECEIPTS_CLOCK`` (tests and demos only)."""
    fixed = os.environ.get("RECEIPTS_CLOCK")
    if fixed:
        return parse_time(fixed)
    return dt.datetime.now(dt.UTC)


def format_time(moment: dt.datetime) -> str:
    """RFC 3339 for machines: what run directories, the database's text, downloads and the API hold."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def human_time(moment: object) -> str:
    """A time for people, on every page and in every message: ``2026-12-03 06:49:32 UTC``.

    Takes a datetime or RFC 3339 text. What a record holds is data: anything else (not a
    time, an odd type) comes back as its text, never an error, for the caller to quote.
    """
    if isinstance(moment, str):
        try:
            instant = parse_time(moment)
        except ValueError:
            return moment
    elif isinstance(moment, dt.datetime):
        instant = moment
    else:
        return str(moment)
    # isoformat, not strftime: strftime("%Y") writes the year 1 as "1", not "0001".
    return instant.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ", "seconds") + " UTC"


def parse_time(text: object) -> dt.datetime:
    """RFC 3339 to an aware UTC datetime; ``ValueError`` for anything else."""
    if not isinstance(text, str):
        raise ValueError("time is not a string")
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"time without a zone: {text[:40]!r}")
    if moment.tzinfo is dt.UTC:
        return moment
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        # 0001-01-01T00:00:00+01:00 is a valid RFC 3339 time with no UTC form Python can hold.
        raise ValueError(f"time out of range: {text[:40]!r}") from None


def is_whole_number(value: object, minimum: int = 0) -> TypeGuard[int]:
    """An int (not a bool) from ``minimum`` to ``MAX_INT``."""
    return type(value) is int and minimum <= value <= MAX_INT


# --- strict JSON -----------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key[:80]!r}")
            seen.add(key)
    return result


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(value: Any) -> None:
    # Iterative so that depth is bounded by MAX_JSON_DEPTH, not the C stack.
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nesting deeper than {MAX_JSON_DEPTH}")
        if isinstance(item, str):
            if _has_surrogate(item):
                raise ValueError("lone surrogate in a string")
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_surrogate(key):
                    raise ValueError("lone surrogate in a key")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_refuse_constant, parse_float=_finite_float)


def load_json_strict(data: bytes) -> Any:
    """Parse one JSON document under the run directory's rules.

    Raises ``ValueError`` (and nothing else) for a BOM, invalid UTF-8, NaN or
    Infinity, a number that overflows to infinity, a duplicate key, a lone
    surrogate or nesting too deep.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError("load_json_strict takes bytes")
    return load_json_text(decode_utf8(data))


def decode_utf8(data: bytes) -> str:
    """The text of ``data``, or ``ValueError`` naming the first byte that is not UTF-8."""
    try:
        return str(data, "utf-8")  # bytes, bytearray or memoryview, without a copy
    except UnicodeDecodeError as error:
        raise ValueError(f"invalid UTF-8 at byte {error.start}") from None


_JSON_SPACE = " \t\n\r"


def load_json_text(text: str) -> Any:
    """``load_json_strict`` for a document already decoded from UTF-8 (the ledger decodes
    each line once, and keeps the text)."""
    if text.startswith("\ufeff"):
        raise ValueError("byte order mark")
    # raw_decode, and the whitespace around the value checked here: what JSONDecoder.decode
    # does, without its two regular-expression calls (a million ledger lines make each count).
    start = len(text) - len(text.lstrip(_JSON_SPACE)) if text[:1] in (" ", "\t", "\n", "\r") else 0
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError("nesting too deep") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        extra = json.JSONDecodeError("Extra data", text, end)
        raise ValueError(f"invalid JSON: {extra.msg} at line {extra.lineno} column {extra.colno}")
    # Valid UTF-8 cannot carry a surrogate, so only a \u escape can make one; and
    # nesting deeper than the limit needs more brackets than the limit (so more
    # characters). Most documents have neither, and skip the walk.
    if "\\u" in text or (len(text) > MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH):
        _check_tree(value)
    return value
