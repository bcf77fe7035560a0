"""The SMTP adapter (receipts/adapters/smtp.py) against a real SMTP server on 127.0.0.1 (tests/smtp_server.py)."""

from __future__ import annotations

import dataclasses
import html
import json
import mailbox
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils.html import strip_tags

from evidence.ingest import importer
from receipts import doubt, runtime
from receipts.adapters.smtp import SmtpAdapter, message_id
from receipts.conformance import NEEDS_A_PERSON, NOT_APPLICABLE
from receipts.demo import writer_command, writer_env
from tests.helpers import PROJECT, content, until
from tests.smtp_server import EXAMPLE, messages_with_id

pytest.importorskip("aiosmtpd")


@dataclasses.dataclass
class Server:
    port: int
    maildir: Path

    def adapter(self, **settings: object) -> SmtpAdapter:
        return SmtpAdapter("127.0.0.1", self.port, sender="agent@example.com", timeout=10, **settings)  # type: ignore[arg-type]

    def env(self, **extra: str) -> dict[str, str]:
        return writer_env(CALLPROOF_TEST_SMTP_PORT=str(self.port), CALLPROOF_TEST_MAILDIR=str(self.maildir), **extra)


def start_server(folder: Path, *options: str) -> Iterator[Server]:
    folder.mkdir()
    port_file, maildir = folder / "port", folder / "maildir"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.smtp_server", str(maildir), str(port_file), *options], cwd=PROJECT
    )
    try:
        until(lambda: port_file.exists() and port_file.read_text(), "the SMTP server listens")
        yield Server(int(port_file.read_text()), maildir)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[Server]:
    yield from start_server(tmp_path / "smtp")


@pytest.fixture
def smtp_losing_answers(tmp_path: Path) -> Iterator[Server]:
    """Takes each message, stores it, and closes the connection before its answer goes out."""
    yield from start_server(tmp_path / "smtp-lossy", "--lose-answers")


@pytest.fixture
def smtp_utf8(tmp_path: Path) -> Iterator[Server]:
    """Offers SMTPUTF8: addresses with non-ASCII characters are taken."""
    yield from start_server(tmp_path / "smtp-utf8", "--smtputf8")


def test_a_non_ascii_address_goes_out_with_smtputf8_where_the_server_offers_it(run_dir, smtp_utf8):
    message = EXAMPLE | {"to": "josé@example.com"}
    outcome = runtime.Executor(run_dir, {"send_email": smtp_utf8.adapter()}).call("send_email", message)
    assert outcome.status == "committed" and outcome.result is not None
    [stored] = messages_with_id(smtp_utf8.maildir, outcome.result["message_id"])
    assert b"To: jos\xc3\xa9@example.com" in stored.as_bytes(), "the address as it was given, in UTF-8"


def test_a_non_ascii_address_is_refused_before_sending_where_the_server_does_not_offer_it(run_dir, smtp):
    """It was marked unknown (a person asked to decide) though nothing had gone out."""
    message = EXAMPLE | {"to": "josé@example.com"}
    outcome = runtime.Executor(run_dir, {"send_email": smtp.adapter()}).call("send_email", message)
    assert outcome.status == "rejected" and outcome.needs is None
    assert "SMTPUTF8" in (outcome.error or {})["message"]
    assert list(mailbox.Maildir(smtp.maildir, create=False)) == []


def test_a_message_is_sent_once_with_the_message_id_of_its_call(run_dir, smtp):
    executor = runtime.Executor(run_dir, {"send_email": smtp.adapter()})
    first = executor.call("send_email", EXAMPLE)
    assert first.status == "committed" and not first.reused
    wanted = f"<{first.call_id}@callproof.invalid>"
    assert first.result is not None and first.result["message_id"] == wanted
    assert first.result["accepted"] == ["ops@example.com"] and first.result["refused"] == {}
    [stored] = messages_with_id(smtp.maildir, wanted)
    assert stored["To"] == "ops@example.com" and stored["From"] == "agent@example.com"
    assert stored["Subject"] == "Deployed" and stored["X-Callproof-Call-Id"] == first.call_id
    assert stored.get_payload(decode=True) == b"The release is out.\n"
    again = executor.call("send_email", EXAMPLE)
    assert again.reused and again.call_id == first.call_id
    assert len(messages_with_id(smtp.maildir, wanted)) == 1, "the same call is never sent twice"


def test_the_message_id_domain_is_a_setting_and_is_kept_in_the_receipt(run_dir, smtp):
    outcome = runtime.Executor(run_dir, {"send_email": smtp.adapter(domain="mail.example.org")}).call(
        "send_email", {**EXAMPLE, "body": ".starts with a dot\n.\nand a lone dot\n"}
    )
    wanted = message_id(outcome.call_id, "mail.example.org")
    assert wanted == f"<{outcome.call_id}@mail.example.org>"
    [stored] = messages_with_id(smtp.maildir, wanted)
    assert stored.get_payload(decode=True) == b".starts with a dot\n.\nand a lone dot\n", "dot-stuffed on the way"
    receipt = json.loads((run_dir / "receipts" / f"{outcome.call_id}.json").read_text())
    assert receipt["args"]["message_id_domain"] == "mail.example.org" and receipt["queryable"] is False


def test_normalising_sorts_the_recipients_and_refuses_header_injection(smtp):
    adapter = smtp.adapter()
    normalised = adapter.normalise({"to": ["b@example.com", " a@example.com", "b@example.com"], "subject": "s",
                                    "body": ""})  # fmt: skip
    assert normalised == {"from": "agent@example.com", "to": ["a@example.com", "b@example.com"], "subject": "s",
                          "body": "", "message_id_domain": "callproof.invalid"}  # fmt: skip
    assert adapter.normalise(normalised) == normalised
    for bad, said in [
        ({**EXAMPLE, "subject": "hi\r\nBcc: all@example.com"}, "one line of text"),
        ({**EXAMPLE, "to": "ops@example.com\r\nBcc: x@example.com"}, "one plain e-mail address"),
        ({**EXAMPLE, "to": []}, "non-empty list"),
        ({**EXAMPLE, "cc": "x@example.com"}, "unknown argument(s): cc"),
        ({**EXAMPLE, "message_id_domain": "a b"}, "must be a host name"),
    ]:
        with pytest.raises(runtime.Rejected, match=said.replace("(", r"\(").replace(")", r"\)")):
            adapter.normalise(bad)


def test_a_server_that_is_not_there_is_a_rejection_and_nothing_was_sent(run_dir, tmp_path):
    closed = SmtpAdapter("127.0.0.1", 1, sender="agent@example.com", timeout=5)
    outcome = runtime.Executor(run_dir, {"send_email": closed}).call("send_email", EXAMPLE)
    assert outcome.status == "rejected" and outcome.error is not None
    assert outcome.error["kind"] == "retryable" and "nothing was sent" in outcome.error["message"]


def test_recipients_the_server_refuses(run_dir, smtp):
    executor = runtime.Executor(run_dir, {"send_email": smtp.adapter()})
    none = executor.call("send_email", {**EXAMPLE, "to": ["nobody@example.com"]})
    assert none.status == "rejected" and none.error is not None and none.error["kind"] == "permanent"
    assert "every recipient was refused, nothing was sent" in none.error["message"]
    assert messages_with_id(smtp.maildir, message_id(none.call_id)) == []
    some = executor.call("send_email", {**EXAMPLE, "to": ["nobody@example.com", "ops@example.com"]})
    assert some.status == "committed" and some.result is not None
    assert some.result["accepted"] == ["ops@example.com"]
    assert some.result["refused"] == {"nobody@example.com": [550, "5.1.1 no such mailbox"]}
    [stored] = messages_with_id(smtp.maildir, message_id(some.call_id))
    assert stored["To"] == "nobody@example.com, ops@example.com"


def test_a_lost_answer_leaves_the_call_in_doubt_with_the_message_id_to_search_for(run_dir, smtp_losing_answers):
    executor = runtime.Executor(run_dir, {"send_email": smtp_losing_answers.adapter()})
    outcome = executor.call("send_email", EXAMPLE)
    wanted = message_id(outcome.call_id)
    assert outcome.status == "unknown" and outcome.needs == "confirmation"
    assert outcome.error is not None and f"search the mailbox for Message-ID {wanted}" in outcome.error["message"]
    assert len(messages_with_id(smtp_losing_answers.maildir, wanted)) == 1, "the server took it"
    again = executor.call("send_email", EXAMPLE)
    assert again.needs == "confirmation" and again.call_id == outcome.call_id
    assert len(messages_with_id(smtp_losing_answers.maildir, wanted)) == 1, "a call in doubt is never sent again"
    receipt = runtime.read_receipt(run_dir / "receipts" / f"{outcome.call_id}.json", run_dir)
    assert receipt is not None
    evidence = doubt.evidence_for(run_dir, "send_email", receipt["args"], outcome.call_id)
    assert evidence is not None and evidence.verdict == doubt.UNCLEAR
    assert evidence.facts[0] == f"no mail server is asked from here: search the mailbox for Message-ID {wanted}"
    assert evidence.facts[1:] == ("sent to ops@example.com, from agent@example.com", "subject “Deployed”")


def test_the_evidence_of_a_hostile_receipt_is_only_text():
    evidence = doubt.evidence_for(Path("/nonexistent"), "send_email", {"to": 7, "message_id_domain": "x\n<b>"}, "c")
    assert evidence is not None and evidence.verdict == doubt.UNCLEAR
    assert "Message-ID <c@callproof.invalid>" in evidence.facts[0], "a domain that is not a host name is not used"
    assert evidence.facts[1] == "sent to 7, from null"


def test_an_email_is_described_in_plain_words():
    args = {"to": ["a@example.com", "b@example.com"], "subject": "Deployed"}
    assert doubt.describe("send_email", args) == "Send an e-mail to a@example.com, b@example.com: “Deployed”"


def kill_after_sending(run_dir: Path, server: Server) -> str:
    """A runtime process that sent the e-mail and died before its receipt said so (SIGKILL there)."""
    from receipts.crashes import kill_at_failpoint

    request = {"adapter": "tests.smtp_server:adapter", "run_dir": str(run_dir), "args": EXAMPLE, "mode": "call"}
    child = subprocess.Popen(
        [sys.executable, "-m", "receipts.conformance", json.dumps(request)],
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        env=server.env(RECEIPTS_FAILPOINT="after_effect:stop"),
    )
    assert kill_at_failpoint(child, 60) == "killed"
    [receipt] = (run_dir / "receipts").glob("*.json")
    return receipt.stem


@pytest.mark.django_db
def test_the_call_page_shows_the_message_id_of_an_email_killed_after_sending(run_dir, smtp, logged_in):
    call_id = kill_after_sending(run_dir, smtp)
    wanted = message_id(call_id)
    assert len(messages_with_id(smtp.maildir, wanted)) == 1
    importer.run_import(path=run_dir)
    page = content(logged_in.get(reverse("call", args=[run_dir.name, call_id])))
    assert "This call is in doubt" in page
    # The fact in the reader's language, the Message-ID in it as data.
    assert f'search the mailbox for Message-ID <span translate="no">&lt;{call_id}@callproof.invalid&gt;</span>' in page
    # the sentence as a person reads it (its values are marked as data)
    assert "Send an e-mail to ops@example.com: “Deployed”" in html.unescape(strip_tags(page))
    assert 'subject “<span translate="no">Deployed</span>”' in page


@pytest.mark.slow
def test_the_conformance_kit_passes_the_smtp_adapter_where_it_applies(tmp_path, smtp):
    completed = subprocess.run(
        writer_command("conformance", "tests.smtp_server:adapter", "--counter", "tests.smtp_server:count_messages",
                       "--trials", "6", "--concurrency", "4", "--json"),
        capture_output=True, text=True, cwd=PROJECT, env=smtp.env(TMPDIR=str(tmp_path)), check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    found = {check["name"]: check["verdict"] for check in json.loads(completed.stdout)["checks"]}
    # Not queryable: whatever turns on asking the server is a person's to decide.
    for needs_a_person in ("idempotency_key", "query_answers_truly", "keys_kept", "past_key_retention"):
        assert found.pop(needs_a_person) == NEEDS_A_PERSON, needs_a_person
    assert found.pop("evidence_matches_target") == NOT_APPLICABLE  # the doubt panel says what to search for
    assert set(found.values()) == {"pass"}, completed.stdout


def test_the_guides_example_sends_once_and_prints_what_it_says(tmp_path):
    """docs/runtime-authors.md, "Sending e-mail: the SMTP adapter": run as it stands, in an empty folder."""
    guide = (PROJECT / "docs" / "runtime-authors.md").read_text(encoding="utf-8")
    section = guide.split("\n## Sending e-mail: the SMTP adapter\n", 1)[1].split("\n## ", 1)[0]
    [example] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    said = re.search(r"# (True True)$", example, re.MULTILINE)
    assert said is not None, "the example says what it prints"
    completed = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                               env=writer_env(), check=False)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == said.group(1)
    [receipt] = (tmp_path / "runs" / "mail-1" / "receipts").glob("*.json")
    assert json.loads(receipt.read_text())["status"] == "committed"
