"""The sentences a decision rests on, in the reader's language (docs/glossary.md): a finding's
detail, what a target shows, and each action of the audit.

The reader writes a finding's detail in English from a sentence of
``receipts.findings.SENTENCES`` and the values it quotes, and keeps both beside it; a page
words the sentence from the catalogue with the values inside as data. A detail stored
without its sentence (an older import), or that its sentence no longer gives, is shown as
it was stored. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import string
from http import HTTPStatus
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext

from evidence.ingest import storing
from evidence.models import AuditEntry, Finding, Run
from evidence.review import triage
from evidence.words import audit_words, doubt_text, finding_words
from receipts import findings, protocol, runtime, tools
from receipts.findings import CODES, SENTENCES, FindingRecord, Sentence
from tests.helpers import CONTRACT, content, downloaded, import_as_seen_later
from tests.i18n_check import english_on, english_words
from tests.test_i18n import COMPILED, catalogue_entries

pytestmark = pytest.mark.django_db

PLACEHOLDER = re.compile(r"\{\w+\}")
# The sentences whose values are themselves sentences: a ledger line's signature problem, and
# the inputs an identity check misses.
NESTED = {
    "problem": Sentence("signature_invalid.record", key_id="key-1"),
    "missing": [Sentence("identity_unverifiable.attempt"), Sentence("identity_unverifiable.tool")],
}


def sample(key: str) -> Sentence:
    """The sentence ``key`` with a value for each of its names (identifiers: data on any page)."""
    names = [name for _, name, _, _ in string.Formatter().parse(SENTENCES[key]) if name]
    return Sentence(key, **{name: NESTED.get(name, f"v_{name}") for name in names})


def fixed_words(template: str) -> list[str]:
    """The English words a sentence says itself, around its values."""
    return english_words(PLACEHOLDER.sub(" ", template))


def a_run(root: Path, run_id: str = "run-1") -> Run:
    run_dir = root / run_id
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "hello"}, attempt=1)
    import_as_seen_later(root)
    return Run.objects.get(run_id=run_id)


# --- the catalogue ---------------------------------------------------------------


def test_every_code_the_reader_can_emit_has_a_sentence_and_every_sentence_a_code():
    codes_with_a_sentence = {key.split(".")[0] for key in SENTENCES}
    assert set(CODES) <= codes_with_a_sentence
    assert codes_with_a_sentence - set(CODES) == {"ledger_line"}  # a sentence around a signature's problem


def test_the_dashboards_msgids_are_the_writers_sentences_word_for_word():
    assert finding_words.WORDS == SENTENCES
    assert doubt_text.FACTS == tools.FACTS


def test_every_sentence_has_a_chinese_translation_with_no_english_word_of_its_own():
    translated = {msgid: text for (context, msgid), text in catalogue_entries(COMPILED).items() if not context}
    for english in [*SENTENCES.values(), *tools.FACTS.values()]:
        assert english in translated, english
        said = translated[english]
        assert sorted(PLACEHOLDER.findall(said)) == sorted(PLACEHOLDER.findall(english)), english
        assert fixed_words(said) == [], (english, said)
    assert set(audit_words.ACTIONS) == {
        value for name, value in vars(AuditEntry).items() if name.isupper() and isinstance(value, str)
    }
    with translation.override("zh-hans"):
        for code in audit_words.ACTIONS:
            assert audit_words.action(code) and english_words(audit_words.action(code)) == [], code
        for _action, _pattern, msgid in audit_words.REASONS:
            assert fixed_words(gettext(msgid)) == [], msgid


# --- a finding's detail -------------------------------------------------------------


def test_a_sentence_is_the_english_detail_and_keeps_its_values():
    said = Sentence("ledger_line.signature", seq=7, problem=Sentence("signature_invalid.record", key_id="k1"))
    assert said == "seq 7: the signature does not verify with the run's key k1: what it says is not taken"
    record = FindingRecord("signature_invalid", "ledger line 7", said)
    assert record.sentence == "ledger_line.signature"
    assert record.detail_values == {
        "seq": "7",
        "problem": {"key": "signature_invalid.record", "values": {"key_id": "k1"}},
    }
    assert findings.spoken(record.sentence, record.detail_values) == record.detail
    plain = FindingRecord("stale_call", "receipts/x.json", "an older reader's words")
    assert (plain.sentence, plain.detail_values) == ("", {})


def test_a_run_page_in_chinese_words_every_sentence_and_keeps_each_value_as_data(chinese, tmp_path):
    run = a_run(tmp_path)
    made = {key: sample(key) for key in SENTENCES}
    code_of = {key: key.split(".")[0] if key.split(".")[0] in CODES else "signature_invalid" for key in SENTENCES}
    records = [FindingRecord(code_of[key], f"subject {key}", said) for key, said in made.items()]
    storing.store_findings(run, records, protocol.utc_now())  # the bulk upsert: JSON as text, on both databases
    stored = list(Finding.objects.filter(run=run, subject__startswith="subject "))
    assert len(stored) == len(SENTENCES)
    assert all(f.sentence == f.subject.removeprefix("subject ") and f.detail == made[f.sentence] for f in stored)
    page = content(chinese.get(reverse("run", args=[run.run_id])))
    assert english_on(page) == []
    with translation.override("zh-hans"):
        for finding in stored:
            assert str(finding_words.detail(finding.sentence, finding.detail_values, finding.detail)) in page
            # Worded, not the English detail shown as data (a sentence that is all values is both).
            if fixed_words(SENTENCES[finding.sentence]):
                assert f'<span translate="no">{finding.detail}</span>' not in page, finding.sentence
    assert '<span translate="no">key-1</span>' in page  # a nested sentence's value, as data


def test_every_value_is_escaped_and_marked_as_data(chinese, tmp_path):
    run = a_run(tmp_path)
    said = Sentence("invalid_status.status", status="'<script>alert(1)</script>'")
    storing.store_findings(run, [FindingRecord("invalid_status", "receipts/x.json", said)], protocol.utc_now())
    page = content(chinese.get(reverse("run", args=[run.run_id])))
    assert "<script>alert(1)" not in page
    assert '状态 <span translate="no">&#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27;</span>' in page


def test_a_detail_stored_without_its_sentence_or_that_its_sentence_no_longer_gives_is_shown_as_stored(
    chinese, tmp_path
):
    run = a_run(tmp_path)
    now = protocol.utc_now()
    old = Finding.objects.create(run=run, code="stale_call", subject="receipts/old.json", severity="warning",
                                 detail="prepared since a day, unconfirmed", first_seen=now, last_seen=now)  # fmt: skip
    drifted = Finding.objects.create(run=run, code="invalid_status", subject="receipts/new.json", severity="error",
                                     detail="status 'odd'", sentence="invalid_status.status",
                                     detail_values={"status": "'other'"}, first_seen=now, last_seen=now)  # fmt: skip
    unknown = Finding.objects.create(run=run, code="invalid_status", subject="receipts/later.json", severity="error",
                                     detail="a later reader's words", sentence="invalid_status.a_later_one",
                                     detail_values={}, first_seen=now, last_seen=now)  # fmt: skip
    page = content(chinese.get(reverse("run", args=[run.run_id])))
    for finding in (old, drifted, unknown):
        assert f'<span translate="no">{finding.detail}</span>'.replace("'", "&#x27;") in page
    assert english_on(page) == []


def test_a_broken_run_imported_keeps_each_findings_sentence_and_the_pages_word_them(chinese, tmp_path):
    """Real findings, from a run directory broken as a person would find it: an edited receipt,
    a receipt removed, a torn ledger line, a line out of order, a stray file in the runs root."""
    root = tmp_path / "runs"
    run = a_run(root)
    run_dir = root / run.run_id
    receipt = next((run_dir / "receipts").glob("*.json"))
    document = json.loads(receipt.read_text())
    document["args"]["content"] = "edited"
    receipt.write_text(json.dumps(document))
    runtime.Executor(run_dir).call("write_file", {"path": "b.txt", "content": "two"}, attempt=1)
    second = next(path for path in (run_dir / "receipts").glob("*.json") if path != receipt)
    second.unlink()
    with (run_dir / protocol.LEDGER_NAME).open("ab") as ledger:
        ledger.write(b'{"seq": 1, "type": "note", "ts": "2026-01-01T00:00:00Z"}\n{"not json\n')
    (root / "notes.txt").write_text("not a run")
    (root / ".hidden").mkdir()
    import_as_seen_later(root)
    found = Finding.objects.filter(closed_at__isnull=True)
    codes = set(found.values_list("code", flat=True))
    assert {"input_digest_mismatch", "identity_mismatch", "missing_receipt", "invalid_json", "not_a_run"} <= codes
    assert "ledger_seq_duplicate" in codes or "ledger_chain_broken" in codes
    for finding in found:
        assert finding.sentence, finding.code
        assert findings.spoken(finding.sentence, finding.detail_values) == finding.detail
    edited = reverse("call", args=[run.run_id, receipt.stem])
    for url in (reverse("run", args=[run.run_id]), "/findings/", "/inbox/", edited):
        response = chinese.get(url)
        assert response.status_code == HTTPStatus.OK
        page = content(response)
        assert english_on(page) == [], url
        for finding in found.filter(run=run):
            if fixed_words(SENTENCES[finding.sentence]) and url != "/inbox/":
                assert f'<span translate="no">{finding.detail}</span>' not in page, finding.detail
    # The call page says what its identity check found (live, from the receipt) in Chinese too.
    assert "input_sha256 不是参数的摘要" in content(chinese.get(edited))


# --- what the target shows ----------------------------------------------------------


def test_what_a_built_in_target_shows_is_worded_and_an_adapters_own_fact_stays_as_written(tmp_path):
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "a.txt").write_text("hello")
    evidence = tools.write_file_evidence(tmp_path, {"path": "a.txt", "content": "hello"}, "c1")
    assert evidence.facts[0].startswith("workspace/a.txt holds exactly what the call writes (sha256 ")
    with translation.override("zh-hans"):
        (shown,) = doubt_text.facts(evidence)
        assert str(shown).startswith('<span translate="no">workspace/a.txt</span> 的内容正是该调用写入的内容')
        own = doubt_text.facts(tools.Evidence("unclear", ("the queue holds it",)))
    assert [str(fact) for fact in own] == ['<span translate="no">the queue holds it</span>']
    for fact in evidence.facts:
        assert isinstance(fact, tools.Fact)
        assert findings.spoken(fact.key, fact.values, tools.FACTS) == fact


def test_a_nested_fact_is_worded_inside_its_sentence(tmp_path):
    from receipts.adapters.sql import SqlRow

    adapter = SqlRow(name="add_row", connect=None, table="orders", columns=["item"])
    evidence = adapter.evidence(tmp_path, {"item": "pen"}, "c1")
    assert evidence.facts == ("this dashboard does not connect to the database: look in table orders for the row "
                              "whose call_id is c1",)  # fmt: skip
    with translation.override("zh-hans"):
        (shown,) = doubt_text.facts(evidence)
    assert str(shown) == (
        '本仪表盘不连接该数据库：在表 <span translate="no">orders</span> 中查找 <span translate="no">call_id</span>'
        ' 为 <span translate="no">c1</span> 的行'
    )


def test_a_call_page_in_chinese_says_what_the_target_shows_in_chinese(chinese, demo):
    from evidence.models import Call

    pages = 0
    for call in Call.objects.filter(tool__in=("write_file", "send_message")).in_doubt():
        page = content(chinese.get(reverse("call", args=[call.run.run_id, call.call_id])))
        assert english_on(page) == []
        assert "outbox.jsonl carries" not in page and "holds exactly" not in page and "does not exist<" not in page
        pages += 1
    assert pages >= 2


# --- the audit's actions ------------------------------------------------------------


def test_the_audit_page_words_each_action_and_keeps_its_code(chinese, tmp_path):
    run = a_run(tmp_path)
    now = protocol.utc_now()
    for minutes, action in enumerate(audit_words.ACTIONS):
        AuditEntry.objects.create(run=run, action=action, actor="ada", at=now - dt.timedelta(minutes=minutes),
                                  reason="why")  # fmt: skip
    page = content(chinese.get("/audit/"))
    assert english_on(page) == []
    with translation.override("zh-hans"):
        for action in audit_words.ACTIONS:
            assert f"{audit_words.action(action)} <code>{action}</code>" in page
    csv = downloaded(chinese.get("/audit/?list=actions&format=csv")).decode()
    assert all(action in csv for action in audit_words.ACTIONS)
    assert "法律保全" not in csv  # downloads keep the action's code, never the page's words


def test_what_triage_adds_to_a_reason_is_worded_and_the_persons_words_stay_as_written(chinese, tmp_path):
    run = a_run(tmp_path)
    finding = FindingRecord("stale_call", "receipts/x.json", Sentence("stale_call.since", status="prepared", since="t"))
    storing.store_findings(run, [finding], protocol.utc_now())
    stored = Finding.objects.get(run=run, subject="receipts/x.json")
    person = chinese.get("/").wsgi_request.user
    now = protocol.utc_now()
    triage.act(finding=stored, user=person, action=triage.SNOOZE, reason="waiting on ops", on_change=True,
               until=now + dt.timedelta(days=1), now=now)  # fmt: skip
    entry = AuditEntry.objects.get(action=AuditEntry.SNOOZED)
    assert entry.reason.startswith("waiting on ops (snoozed until ") and entry.reason.endswith(" or until it changes)")
    # The import sees the finding change: the snooze ends, and the import says why.
    changed = FindingRecord("stale_call", "receipts/x.json", Sentence("stale_call.since", status="unknown", since="t"))
    storing.store_findings(run, [changed], protocol.utc_now())
    ended = AuditEntry.objects.get(action=AuditEntry.TRIAGE_ENDED)
    assert ended.reason == "snoozed no longer: it changed (detail): unknown since t, unconfirmed"
    for url in ("/audit/", reverse("triage", args=[stored.pk])):
        page = content(chinese.get(url))
        assert english_on(page) == [], url
        assert '<span translate="no">waiting on ops</span>（暂缓至 ' in page
        ended_said = "已暂缓状态结束：它发生了变化（<code>detail</code>）："
        assert ended_said + '<span translate="no">unknown since t, unconfirmed</span>' in page
        assert "snoozed until" not in page and "no longer" not in page
    assert AuditEntry.objects.filter(reason__contains="(snoozed until").count() == 1  # stored as written
