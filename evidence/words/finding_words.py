"""A finding's detail in the reader's language (docs/glossary.md).

The reader writes each detail in English from a sentence of ``receipts.findings.SENTENCES``
and the values it quotes (the reader is standard library only, and its details go to programs:
the CLI, downloads, the API, exports). Each sentence is here as a msgid, word for word (the
catalogue is built from this file; tests/test_finding_words.py keeps the two the same). A page
says the sentence in the reader's language with the values inside as data: escaped, and
``translate="no"``. A detail stored without its sentence (before the sentence was kept), or
whose sentence and values no longer give it, is shown as it was stored: as data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext, pgettext
from django.utils.translation import gettext_noop as _

from receipts import findings

WORDS: dict[str, str] = {
    "unsafe_path.dot_dot": _("a path with '..' in it: not followed"),
    "unsafe_path.root_not_utf8": _("the path is not UTF-8: not followed"),
    "unsafe_path.root_symlink": _("the root is a symlink: not followed"),
    "unsafe_path.not_a_directory": _("not a directory"),
    "unsafe_path.root_run_id": _("not a valid run_id"),
    "unsafe_path.not_listed": _("cannot be listed: {error}"),
    "unsafe_path.symlink_in_root": _("a symlink in the runs root: not followed"),
    "not_a_run.regular_file": _("a regular file, not a run directory: left alone"),
    "unsafe_path.special_file": _("not a regular file or directory: not opened"),
    "not_a_run.dot_directory": _("a dot-directory, not a run directory: left alone"),
    "unsafe_path.run_id": _("not a valid run_id (1-128 of A-Za-z0-9._-, no leading dot)"),
    "duplicate_run_id.elsewhere": _("run_id {run_id} is already imported from {other}: this copy is not imported"),
    "archived_run_id_reused.at": _(
        "run_id {run_id} was archived at {archived_at}; this directory holds another run under its id (its "
        "steer.json is not the archived run's): it is not imported, and retention leaves it where it is. Give"
        " it a run_id of its own to import it"
    ),
    "archived_run_id_reused.some_time": _(
        "run_id {run_id} was archived at some time; this directory holds another run under its id (its "
        "steer.json is not the archived run's): it is not imported, and retention leaves it where it is. Give"
        " it a run_id of its own to import it"
    ),
    "unsafe_path.os_error": _("{error}"),
    "unsafe_path.symlink_or_not_directory": _("a symlink or not a directory: not followed"),
    "unsafe_path.symlink": _("a symlink: not followed"),
    "unsafe_path.not_regular": _("not a regular file"),
    "unsafe_path.unreadable": _("cannot be read: {error}"),
    "unsafe_path.name_not_utf8": _("the file name is not UTF-8: not read"),
    "unsafe_path.receipt_name_too_long": _("file name over {limit} characters: not read"),
    "unsafe_path.confirmation_name_too_long": _("file name over {limit} characters"),
    "oversize.file": _("{size} bytes, over the limit of {limit}"),
    "oversize.grew": _("over the limit of {limit} bytes"),
    "invalid_json.parse": _("{error}"),
    "unstorable_value.fields": _("U+0000 in {fields}: stored with U+FFFD in its place; the file keeps the original"),
    "schema_error.state": _("needs a string name and attempts from 0 to {max}"),
    "unstorable_value.state_name": _("U+0000 in name: stored with U+FFFD in its place"),
    "schema_error.steer_missing": _("missing: receipts' contract cannot be checked"),
    "schema_error.steer_contract": _("contract_sha256 must be 64 lowercase hex digits"),
    "signature_missing.unsigned_run": _("an unsigned run, where only signed runs are accepted"),
    "signature_unchecked.key": _("signed with key {key_id}, which this reader does not have: no signature was checked"),
    "signature_missing.record": _("the run is signed, and this record carries no signature"),
    "signature_invalid.record": _("the signature does not verify with the run's key {key_id}"),
    "schema_error.receipt_not_object": _("a receipt must be a JSON object"),
    "schema_error.missing_or_wrong_type": _("missing or wrong type: {fields}"),
    "schema_error.wrong_type": _("wrong type: {fields}"),
    "legacy_status.failed": _("status 'failed' cannot tell retryable from permanent"),
    "invalid_status.status": _("status {status}"),
    "stale_call.since": _("{status} since {since}, unconfirmed"),
    "receipt_name_mismatch.declared": _("the receipt's call_id is not the call it is filed as"),
    "contract_mismatch.receipt": _("the receipt was made under another contract than the run's"),
    "input_digest_mismatch.args": _("input_sha256 is not the digest of args"),
    "identity_unverifiable.missing": _("{missing}"),
    "identity_unverifiable.formula": _("unknown identity formula {identity}"),
    "identity_unverifiable.attempt": _("no attempt"),
    "identity_unverifiable.contract": _("no contract_sha256 here or in steer.json"),
    "identity_unverifiable.tool": _("no tool name or args"),
    "identity_unverifiable.tool_version": _("call-id-v2 without tool_version"),
    "identity_unverifiable.outcome": _("committed without a result object and its output_sha256"),
    "identity_mismatch.recomputed": _(
        "{identity} over contract, attempt {attempt}, tool and args gives another call_id"
    ),
    "output_digest_mismatch.result": _("output_sha256 is not the digest of result"),
    "missing_receipt.ledger": _("the ledger names this call but there is no receipt file"),
    "orphan_receipt.ledger": _("no ledger event names this call"),
    "committed_event_missing.ledger": _(
        "committed, but no ledger event records the commit (lost to a kill, or the status was edited)"
    ),
    "effect_not_shown.reuse_refused": _(
        "the writer refused to reuse this commit: its target did not show the result (see the ledger's "
        "reuse_refused event); a person decides"
    ),
    "receipt_contradicts_ledger.committed": _(
        "status {status}, but the ledger records this call's commit, and a commit is final: the receipt was "
        "changed since"
    ),
    "confirmation_invalid.schema": _("not a {schema} document"),
    "confirmation_invalid.other_call": _("names another call_id"),
    "confirmation_invalid.resolution": _("resolution {resolution} is neither committed nor rejected"),
    "confirmation_invalid.no_receipt": _("there is no receipt to confirm"),
    "confirmation_invalid.receipt_changed": _("the receipt changed since the person saw it"),
    "confirmation_invalid.confirmation_id": _("confirmation_id does not match"),
    "confirmation_invalid.no_reason": _("no reason given"),
    "ledger_rewritten.changed": _(
        "the first {offset} bytes, already imported, have changed: the ledger was read again"
    ),
    "oversize.line": _("a line of {length} bytes, over {limit}: not read"),
    "schema_error.event_not_object": _("an event must be a JSON object"),
    "schema_error.event_seq": _("an event needs a seq from 1 to {max} and a type"),
    "ledger_line.signature": _("seq {seq}: {problem}: what it says is not taken"),
    "ledger_chain_broken.no_prev": _("seq {seq}: no prev_sha256, but the lines before carry the chain"),
    "ledger_chain_broken.prev": _("seq {seq}: prev_sha256 is not the digest of the line before"),
    "ledger_clock_back.earlier": _(
        "seq {seq}: ts {ts} is {seconds} s before the line before it ({before}): the writer's clock went back"
    ),
    "schema_error.event_ts": _("seq {seq}: ts is not an RFC 3339 time"),
    "schema_error.event_call_id": _("seq {seq}: call_id cannot name a receipt file"),
    "unstorable_value.event": _("U+0000 in {fields}: stored with U+FFFD in its place; the ledger keeps the original"),
    "ledger_seq_duplicate.whole": _("seq {seq} after seq {last}: this line is kept here (whole), not as an event"),
    "ledger_seq_duplicate.first": _(
        "seq {seq} after seq {last}: this line is kept here (its first {chars} characters), not as an event"
    ),
    "ledger_seq_gap.due": _("seq {seq} where {due} was due"),
    "submission_conflict.disposition": _("seq {seq}: disposition conflict ({reason}); no task was written"),
    "submission_conflict.digests": _(
        "seq {seq}: one client_submission_id seen with two request digests (first, then this one)"
    ),
    "submission_conflict.both": _(
        "seq {seq}: disposition conflict ({reason}); no task was written; one client_submission_id seen with "
        "two request digests (first, then this one)"
    ),
    "unstorable_value.submission_id": _("its client_submission_id, stored, is another record's"),
    "schema_error.submission_not_object": _("a submission record must be a JSON object"),
    "schema_error.submission_id": _("client_submission_id must be a string of 1 to 256 characters"),
    "schema_error.submission_name": _("the file name is not sha256(client_submission_id)"),
    "schema_error.request_digest": _("the stored request has no digest: {error}"),
    "submission_digest_mismatch.request": _("the stored request does not give the stored request_digest"),
    "unsafe_path.task_path": _("task_path {path} is not a file in {folder}"),
    "task_missing.absent": _("{path} is absent but the record is {state}"),
    "task_digest_mismatch.file": _("{path} is not the file the record describes"),
    "stale_reservation.matching": _(
        "state {state} since {since}; task {task_id} file present: yes; digests match: yes"
    ),
    "stale_reservation.differing": _(
        "state {state} since {since}; task {task_id} file present: yes; digests match: no"
    ),
    "stale_reservation.absent": _("state {state} since {since}; task {task_id} file present: no; digests match: n/a"),
    "import_failed.error": _("{error}"),
    "run_abandoned.silent": _(
        "not finished (state {state}) and no event since {since}: no longer checked every pass; resume the "
        "run, or end it with {command}"
    ),
    "decision_undeliverable.why": _("{actor}'s decision ({resolution}, {reason}) was not written: {why}"),
    "decision_contradicted.not_done": _(
        "{actor} decided that this call did not happen, and its target shows the effect {times} time(s): {facts}"
    ),
    "decision_contradicted.more_than_once": _(
        "{actor} decided this call ({resolution}), and its target shows its effect {times} times for one call_id: "
        "{facts}"
    ),
    "decision_made_on_host.by_name": _(
        "settled {resolution} on host {host} by the name {actor} (not a dashboard account): no decision made on the "
        "dashboard matches it"
    ),
    "host_clock_off.offset": _(
        "the clock of host {host} is {offset} s off the server's (ahead when positive, more than {skew} s): its "
        "runs' times are checked against when the server received them"
    ),
}


def data(value: object) -> SafeString:
    """Text a record, a person or an adapter wrote: never translated."""
    return format_html('<span translate="no">{}</span>', value)


def detail(sentence: str, values: Any, stored: str) -> SafeString:
    """A finding's detail ``stored`` in the reader's language, from its ``sentence`` and ``values``."""
    return said(WORDS, findings.SENTENCES, sentence, values, stored)


def said(words: Mapping[str, str], english: Mapping[str, str], key: str, values: Any, stored: str) -> SafeString:
    """``stored``, an English sentence made from ``english[key]`` and ``values``, in the
    reader's language (``words[key]``, a msgid), the values as data; ``stored`` itself, as
    data, when they are not what gave it (an older or a later writer's, or no sentence)."""
    if key not in words or key not in english or not isinstance(values, dict):
        return data(stored)
    try:
        if findings.spoken(key, values, english) != stored:
            return data(stored)
        return _worded(words, key, values)
    except (KeyError, IndexError, TypeError, ValueError):  # values a later or older writer wrote
        return data(stored)


def _worded(words: Mapping[str, str], key: str, values: dict[str, Any]) -> SafeString:
    text = gettext(words[key])
    if not values:  # a sentence with no value: nothing to put in, only to escape
        return conditional_escape(text)
    return format_html(text, **{name: _value(words, value) for name, value in values.items()})


def _value(words: Mapping[str, str], value: Any) -> SafeString:
    if isinstance(value, dict):  # a sentence inside the sentence: worded too
        return _worded(words, value["key"], value["values"])
    if isinstance(value, list):
        # Translators: what stands between two sentences said as one (a list of problems).
        joiner = pgettext("between sentences", "; ")
        return format_html_join(joiner, "{}", ((_value(words, each),) for each in value))
    return data(value)


def identity_problems(identity: Any) -> SafeString:
    """What an identity check found (``protocol.IdentityCheck.summary``), in the reader's
    language: each problem a sentence, worded; one that is not, as data."""
    problems = getattr(identity, "problems", ())
    if not problems:
        return data(getattr(identity, "summary", lambda: "")())
    worded = (
        detail(problem.key, problem.values, problem) if isinstance(problem, findings.Sentence) else data(problem)
        for _code, problem, _stored, _recomputed in problems
    )
    return format_html_join(pgettext("between sentences", "; "), "{}", ((each,) for each in worded))
