"""The finding codes of RUN_DIRECTORY.md: severity, scope, and what each means.

Standard library only: the reader produces ``FindingRecord``s, the importer
stores them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

ERROR, WARNING = "error", "warning"
# Scopes: when a stored finding is checked again, and so when it can close.
FILES = "files"  # re-checked on every import: closed when not seen again
LEDGER = "ledger"  # about ledger lines: re-checked only when the ledger is read from scratch
STICKY = "sticky"  # a rewritten ledger: stays open until a person deals with it
ACTIVITY = "activity"  # a run's silence: re-checked by every pass that checks the run, from its rows

CODES: dict[str, tuple[str, str]] = {
    # code: (severity, meaning)
    "invalid_json": (ERROR, "not valid JSON under the run directory's rules"),
    "schema_error": (ERROR, "valid JSON, wrong shape"),
    "unsafe_path": (ERROR, "symlink, path escaping the run directory, non-regular file, or bad name"),
    "oversize": (ERROR, "file or ledger line over the size limit"),
    "not_a_run": (WARNING, "an entry of the runs root that is not a run directory"),
    "duplicate_run_id": (ERROR, "a run_id already imported from another runs root: refused"),
    "archived_run_id_reused": (ERROR, "another run under an archived run's id: not imported, never removed"),
    "receipt_name_mismatch": (ERROR, "file stem differs from call_id"),
    "identity_mismatch": (ERROR, "recomputed call_id differs from call_id"),
    "identity_unverifiable": (WARNING, "not enough fields to recompute the call_id"),
    "contract_mismatch": (ERROR, "receipt's contract_sha256 differs from steer.json"),
    "input_digest_mismatch": (ERROR, "input_sha256 differs from the args' digest"),
    "output_digest_mismatch": (ERROR, "a committed receipt's output_sha256 differs from its result's digest"),
    "committed_event_missing": (ERROR, "a committed receipt whose commit no ledger event records"),
    "effect_not_shown": (ERROR, "a commit the writer refused to reuse: its target did not show the result"),
    "receipt_contradicts_ledger": (ERROR, "a receipt not committed, for a call whose commit the ledger records"),
    "invalid_status": (ERROR, "status outside prepared, committed, rejected, unknown"),
    "legacy_status": (WARNING, "legacy status 'failed': retryable or permanent is unknown"),
    "missing_receipt": (ERROR, "the ledger names a call_id with no receipt file"),
    "orphan_receipt": (WARNING, "a receipt the ledger never names"),
    "ledger_seq_gap": (ERROR, "seq skips numbers"),
    "ledger_seq_duplicate": (ERROR, "seq repeats or goes back"),
    "ledger_chain_broken": (ERROR, "prev_sha256 does not match the previous line"),
    "ledger_rewritten": (ERROR, "bytes already imported have changed since"),
    "ledger_clock_back": (WARNING, "a ledger line more than a second earlier than the line before it"),
    "submission_digest_mismatch": (ERROR, "stored request does not give the stored digest"),
    "submission_conflict": (WARNING, "a conflict disposition, or one id seen with two digests"),
    "task_missing": (ERROR, "task file absent"),
    "task_digest_mismatch": (ERROR, "task file is not the recorded digest"),
    "stale_reservation": (WARNING, "reserved or task_created past the stale age"),
    "stale_call": (WARNING, "prepared or unknown past the stale age, unconfirmed"),
    "confirmation_invalid": (ERROR, "a confirmation file that does not match its receipt"),
    "signature_invalid": (ERROR, "in a signed run, a record whose signature does not verify with the run's key"),
    "signature_missing": (
        ERROR,
        "a record of a signed run without a signature, or an unsigned run where signed ones are required",
    ),
    "signature_unchecked": (WARNING, "a signed run whose key this reader does not have: signatures not checked"),
    "unstorable_value": (WARNING, "a value the database cannot hold as written: stored with U+FFFD in its place"),
    "import_failed": (ERROR, "the run's import failed for a reason nobody foresaw: rolled back"),
    "decision_undeliverable": (
        ERROR,
        "a person's decision its host could not write into the run: the receipt changed since, or another is there",
    ),
    "decision_made_on_host": (
        WARNING,
        "a valid confirmation no decision made on the dashboard matches: its host's word, by a name that is no account",
    ),
    "decision_contradicted": (
        ERROR,
        "a decided call whose target shows its effect more than once, or the effect a decision said did not happen",
    ),
    "run_abandoned": (
        WARNING,
        "not finished, and no event for EVIDENCE_ABANDONED_AFTER_SECONDS: no longer checked every pass",
    ),
    "host_clock_off": (
        WARNING,
        "a shipping host whose clock differs from the server's by more than EVIDENCE_HOST_CLOCK_SKEW_SECONDS",
    ),
}

# The digest mismatches: shown first on the findings page, stored beside recomputed.
DIGEST_CODES = (
    "identity_mismatch",
    "input_digest_mismatch",
    "output_digest_mismatch",
    "contract_mismatch",
    "submission_digest_mismatch",
    "task_digest_mismatch",
    "ledger_chain_broken",
    "ledger_rewritten",
)


# Each sentence a finding's detail can be, in English, with its values as ``{name}``: the
# reader's own output, the CLI and the exports read the sentence; the dashboard words it in
# the reader's language from its key and values (evidence/words/finding_words.py, docs/glossary.md).
# A key names its finding code first; a sentence that is part of another (a signature's
# problem inside a ledger line's) is a value of it.
SENTENCES: dict[str, str] = {
    # the runs root
    "unsafe_path.dot_dot": "a path with '..' in it: not followed",
    "unsafe_path.root_not_utf8": "the path is not UTF-8: not followed",
    "unsafe_path.root_symlink": "the root is a symlink: not followed",
    "unsafe_path.not_a_directory": "not a directory",
    "unsafe_path.root_run_id": "not a valid run_id",
    "unsafe_path.not_listed": "cannot be listed: {error}",
    "unsafe_path.symlink_in_root": "a symlink in the runs root: not followed",
    "not_a_run.regular_file": "a regular file, not a run directory: left alone",
    "unsafe_path.special_file": "not a regular file or directory: not opened",
    "not_a_run.dot_directory": "a dot-directory, not a run directory: left alone",
    "unsafe_path.run_id": "not a valid run_id (1-128 of A-Za-z0-9._-, no leading dot)",
    "duplicate_run_id.elsewhere": "run_id {run_id} is already imported from {other}: this copy is not imported",
    "archived_run_id_reused.at": (
        "run_id {run_id} was archived at {archived_at}; this directory holds another run under its id (its "
        "steer.json is not the archived run's): it is not imported, and retention leaves it where it is. Give it "
        "a run_id of its own to import it"
    ),
    "archived_run_id_reused.some_time": (
        "run_id {run_id} was archived at some time; this directory holds another run under its id (its "
        "steer.json is not the archived run's): it is not imported, and retention leaves it where it is. Give it "
        "a run_id of its own to import it"
    ),
    # opening and reading files
    "unsafe_path.os_error": "{error}",
    "unsafe_path.symlink_or_not_directory": "a symlink or not a directory: not followed",
    "unsafe_path.symlink": "a symlink: not followed",
    "unsafe_path.not_regular": "not a regular file",
    "unsafe_path.unreadable": "cannot be read: {error}",
    "unsafe_path.name_not_utf8": "the file name is not UTF-8: not read",
    "unsafe_path.receipt_name_too_long": "file name over {limit} characters: not read",
    "unsafe_path.confirmation_name_too_long": "file name over {limit} characters",
    "oversize.file": "{size} bytes, over the limit of {limit}",
    "oversize.grew": "over the limit of {limit} bytes",
    "invalid_json.parse": "{error}",
    "unstorable_value.fields": "U+0000 in {fields}: stored with U+FFFD in its place; the file keeps the original",
    # state.json and steer.json
    "schema_error.state": "needs a string name and attempts from 0 to {max}",
    "unstorable_value.state_name": "U+0000 in name: stored with U+FFFD in its place",
    "schema_error.steer_missing": "missing: receipts' contract cannot be checked",
    "schema_error.steer_contract": "contract_sha256 must be 64 lowercase hex digits",
    "signature_missing.unsigned_run": "an unsigned run, where only signed runs are accepted",
    "signature_unchecked.key": "signed with key {key_id}, which this reader does not have: no signature was checked",
    "signature_missing.record": "the run is signed, and this record carries no signature",
    "signature_invalid.record": "the signature does not verify with the run's key {key_id}",
    # receipts
    "schema_error.receipt_not_object": "a receipt must be a JSON object",
    "schema_error.missing_or_wrong_type": "missing or wrong type: {fields}",
    "schema_error.wrong_type": "wrong type: {fields}",
    "legacy_status.failed": "status 'failed' cannot tell retryable from permanent",
    "invalid_status.status": "status {status}",
    "stale_call.since": "{status} since {since}, unconfirmed",
    "receipt_name_mismatch.declared": "the receipt's call_id is not the call it is filed as",
    "contract_mismatch.receipt": "the receipt was made under another contract than the run's",
    "input_digest_mismatch.args": "input_sha256 is not the digest of args",
    "identity_unverifiable.missing": "{missing}",
    "identity_unverifiable.formula": "unknown identity formula {identity}",
    "identity_unverifiable.attempt": "no attempt",
    "identity_unverifiable.contract": "no contract_sha256 here or in steer.json",
    "identity_unverifiable.tool": "no tool name or args",
    "identity_unverifiable.tool_version": "call-id-v2 without tool_version",
    "identity_unverifiable.outcome": "committed without a result object and its output_sha256",
    "identity_mismatch.recomputed": "{identity} over contract, attempt {attempt}, tool and args gives another call_id",
    "output_digest_mismatch.result": "output_sha256 is not the digest of result",
    "missing_receipt.ledger": "the ledger names this call but there is no receipt file",
    "orphan_receipt.ledger": "no ledger event names this call",
    "committed_event_missing.ledger": (
        "committed, but no ledger event records the commit (lost to a kill, or the status was edited)"
    ),
    "effect_not_shown.reuse_refused": (
        "the writer refused to reuse this commit: its target did not show the result (see the ledger's "
        "reuse_refused event); a person decides"
    ),
    "receipt_contradicts_ledger.committed": (
        "status {status}, but the ledger records this call's commit, and a commit is final: the receipt was "
        "changed since"
    ),
    # confirmations
    "confirmation_invalid.schema": "not a {schema} document",
    "confirmation_invalid.other_call": "names another call_id",
    "confirmation_invalid.resolution": "resolution {resolution} is neither committed nor rejected",
    "confirmation_invalid.no_receipt": "there is no receipt to confirm",
    "confirmation_invalid.receipt_changed": "the receipt changed since the person saw it",
    "confirmation_invalid.confirmation_id": "confirmation_id does not match",
    "confirmation_invalid.no_reason": "no reason given",
    # the ledger
    "ledger_rewritten.changed": ("the first {offset} bytes, already imported, have changed: the ledger was read again"),
    "oversize.line": "a line of {length} bytes, over {limit}: not read",
    "schema_error.event_not_object": "an event must be a JSON object",
    "schema_error.event_seq": "an event needs a seq from 1 to {max} and a type",
    "ledger_line.signature": "seq {seq}: {problem}: what it says is not taken",
    "ledger_chain_broken.no_prev": "seq {seq}: no prev_sha256, but the lines before carry the chain",
    "ledger_chain_broken.prev": "seq {seq}: prev_sha256 is not the digest of the line before",
    "ledger_clock_back.earlier": (
        "seq {seq}: ts {ts} is {seconds} s before the line before it ({before}): the writer's clock went back"
    ),
    "schema_error.event_ts": "seq {seq}: ts is not an RFC 3339 time",
    "schema_error.event_call_id": "seq {seq}: call_id cannot name a receipt file",
    "unstorable_value.event": ("U+0000 in {fields}: stored with U+FFFD in its place; the ledger keeps the original"),
    "ledger_seq_duplicate.whole": "seq {seq} after seq {last}: this line is kept here (whole), not as an event",
    "ledger_seq_duplicate.first": (
        "seq {seq} after seq {last}: this line is kept here (its first {chars} characters), not as an event"
    ),
    "ledger_seq_gap.due": "seq {seq} where {due} was due",
    "submission_conflict.disposition": "seq {seq}: disposition conflict ({reason}); no task was written",
    "submission_conflict.digests": (
        "seq {seq}: one client_submission_id seen with two request digests (first, then this one)"
    ),
    "submission_conflict.both": (
        "seq {seq}: disposition conflict ({reason}); no task was written; one client_submission_id seen with "
        "two request digests (first, then this one)"
    ),
    # submissions and tasks
    "unstorable_value.submission_id": "its client_submission_id, stored, is another record's",
    "schema_error.submission_not_object": "a submission record must be a JSON object",
    "schema_error.submission_id": "client_submission_id must be a string of 1 to 256 characters",
    "schema_error.submission_name": "the file name is not sha256(client_submission_id)",
    "schema_error.request_digest": "the stored request has no digest: {error}",
    "submission_digest_mismatch.request": "the stored request does not give the stored request_digest",
    "unsafe_path.task_path": "task_path {path} is not a file in {folder}",
    "task_missing.absent": "{path} is absent but the record is {state}",
    "task_digest_mismatch.file": "{path} is not the file the record describes",
    "stale_reservation.matching": ("state {state} since {since}; task {task_id} file present: yes; digests match: yes"),
    "stale_reservation.differing": "state {state} since {since}; task {task_id} file present: yes; digests match: no",
    "stale_reservation.absent": "state {state} since {since}; task {task_id} file present: no; digests match: n/a",
    # the dashboard's own
    "import_failed.error": "{error}",
    "run_abandoned.silent": (
        "not finished (state {state}) and no event since {since}: no longer checked every pass; resume the run, "
        "or end it with {command}"
    ),
    "decision_undeliverable.why": "{actor}'s decision ({resolution}, {reason}) was not written: {why}",
    "decision_contradicted.not_done": (
        "{actor} decided that this call did not happen, and its target shows the effect {times} time(s): {facts}"
    ),
    "decision_contradicted.more_than_once": (
        "{actor} decided this call ({resolution}), and its target shows its effect {times} times for one call_id: "
        "{facts}"
    ),
    "decision_made_on_host.by_name": (
        "settled {resolution} on host {host} by the name {actor} (not a dashboard account): no decision made on the "
        "dashboard matches it"
    ),
    "host_clock_off.offset": (
        "the clock of host {host} is {offset} s off the server's (ahead when positive, more than {skew} s): its "
        "runs' times are checked against when the server received them"
    ),
}


class Sentence(str):
    """A detail in English (it is a ``str``: every caller that reads a detail reads it as one),
    carrying the key of its sentence and the values it quotes, so that a page can word it in
    another language. A value is text, or a sentence of its own (stored as ``{"key", "values"}``),
    or several sentences (joined with "; ")."""

    catalogue: dict[str, str] = SENTENCES  # where its keys are: a finding's details
    key: str
    values: dict[str, Any]

    def __new__(cls, key: str, **values: object) -> Sentence:
        kept = {name: _value(value) for name, value in values.items()}
        made = super().__new__(cls, cls.catalogue[key].format(**{name: _said(value) for name, value in values.items()}))
        made.key, made.values = key, kept
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as made (the importer's read-ahead child sends findings to its parent): the
        # text, key and values as they are, not the text taken for a key.
        return (_restored, (type(self), str(self), self.key, self.values))


def _restored(cls: type[Sentence], text: str, key: str, values: dict[str, Any]) -> Sentence:
    made = str.__new__(cls, text)
    made.key, made.values = key, values
    return made


def _value(value: object) -> Any:
    if isinstance(value, Sentence):
        return {"key": value.key, "values": value.values}
    if isinstance(value, (list, tuple)):
        return [_value(each) for each in value]
    return storable_text(str(value))


def _said(value: object) -> str:
    return "; ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def spoken(key: str, values: Mapping[str, Any], catalogue: Mapping[str, str] = SENTENCES) -> str:
    """The English sentence ``key`` of ``catalogue`` with stored ``values`` (nested ones said
    too): what ``Sentence(key, **values)`` wrote."""
    return catalogue[key].format(**{name: _spoken_value(value, catalogue) for name, value in values.items()})


def _spoken_value(value: Any, catalogue: Mapping[str, str]) -> str:
    if isinstance(value, dict):
        return spoken(value["key"], value["values"], catalogue)
    if isinstance(value, list):
        return "; ".join(_spoken_value(each, catalogue) for each in value)
    return str(value)


def storable_text(text: str) -> str:
    """``text`` as any database can hold it: U+0000 becomes U+FFFD, and the bytes of a
    name that is not UTF-8 (surrogate escapes) are spelled as ``\\xNN``."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


@dataclasses.dataclass(frozen=True)
class FindingRecord:
    code: str
    subject: str
    detail: str
    call_id: str = ""
    stored_value: str = ""
    recomputed_value: str = ""
    scope: str = FILES
    evidence: str = ""  # what no other row keeps: a ledger line whose seq was taken
    record_key: str = ""  # the submission record a finding is about (its file stem)
    # The detail's sentence (a key of SENTENCES) and its values, when it was made as a ``Sentence``.
    sentence: str = ""
    detail_values: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if isinstance(self.detail, Sentence) and not self.sentence:
            object.__setattr__(self, "sentence", self.detail.key)
            object.__setattr__(self, "detail_values", self.detail.values)
        # Subjects and details quote what was found, which may be anything: make it storable here, once.
        for name in ("subject", "detail", "call_id", "stored_value", "recomputed_value"):
            object.__setattr__(self, name, storable_text(getattr(self, name)))

    @property
    def severity(self) -> str:
        return CODES[self.code][0]
