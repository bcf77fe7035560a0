"""Optional signing: what a key adds beyond the digests, and what refuses to mix signed and unsigned.

Each attack below passes every digest and every target check (the agent can
write the run directory, so it recomputes them): only the signature stops it,
and the same attack on an unsigned run shows what that run cannot tell.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.urls import reverse

from evidence.ingest import importer
from evidence.models import Finding
from receipts import durable, protocol, runtime, signing
from receipts.demo import run_writer
from tests.helpers import CONTRACT, join
from tests.ledger import read_ledger
from tests.writer import (
    FILE_ARGS,
    MESSAGE,
    cli_call,
    decisions,
    edit_receipt,
    only_receipt,
    outbox_lines,
    output,
    receipt_of,
    receipt_path,
)


@pytest.fixture
def signed_run(tmp_path: Path, key_file: Path, monkeypatch) -> Path:
    """A run made with a key: the writer (this process and its children) signs all it writes."""
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    run = tmp_path / "signed-run"
    runtime.run_init(run, contract_sha256=CONTRACT)
    return run


def reader_keys(key_file: Path) -> dict:
    return signing.load_keys([str(key_file)])


def run_key(run: Path, key_file: Path) -> protocol.SigningKey:
    """The key as the run's records are signed with it: bound to the run's own identity."""
    steer = json.loads((run / "steer.json").read_bytes())
    return signing.load_key(key_file).for_run(protocol.signing_subject(steer, run.name))


def signature_codes(run: Path, key_file: Path) -> set[str]:
    from receipts.reader import read_run

    files, _ = read_run(run, keep_events=False, keys=reader_keys(key_file))
    return {finding.code for finding in files.findings if finding.code.startswith("signature")}


def forge_commit_of_the_file(run: Path) -> str:
    """The agent writes the file itself and edits the prepared receipt to a commit with every digest right."""
    call_id = only_receipt(run)
    target = run / "workspace" / FILE_ARGS["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(FILE_ARGS["content"])
    result = {"path": f"workspace/{FILE_ARGS['path']}", "file_sha256": protocol.sha256_hex(target.read_bytes())}
    edit_receipt(
        run,
        call_id,
        lambda receipt: receipt.update(status="committed", result=result, output_sha256=protocol.input_sha256(result)),
    )
    return call_id


def test_a_signed_run_signs_every_record_and_reads_clean(signed_run, key_file):
    assert cli_call(signed_run, "write_file", FILE_ARGS).returncode == 0
    assert cli_call(signed_run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    call_id = next(
        path.stem
        for path in (signed_run / "receipts").glob("*.json")
        if receipt_of(signed_run, path.stem)["tool"] == "send_message"
    )
    digest = protocol.sha256_hex(receipt_path(signed_run, call_id).read_bytes())
    runtime.confirm_call(
        signed_run, call_id, resolution="committed", reason="log", actor="alice", receipt_sha256=digest
    )
    runtime.write_task(signed_run, {"subject": "signed"}, "sub-1")

    key = run_key(signed_run, key_file)
    steer = json.loads((signed_run / "steer.json").read_bytes())
    assert steer["signing_key_id"] == key.key_id and protocol.signature_problem(steer, key) is None
    documents = [*read_ledger(signed_run)]
    documents += [
        json.loads(path.read_bytes())
        for folder in ("receipts", "confirmations")
        for path in (signed_run / folder).glob("*.json")
    ]
    assert len(documents) > 8 and all(protocol.signature_problem(document, key) is None for document in documents)
    assert signature_codes(signed_run, key_file) == set()
    assert key_file.read_bytes() not in (signed_run / "events.jsonl").read_bytes(), "the key itself is never written"


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_forged_commit_passes_every_digest_but_not_the_signature(tmp_path, key_file, monkeypatch, signed):
    if signed:
        monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    run = tmp_path / "run"
    runtime.run_init(run, contract_sha256=CONTRACT)
    assert cli_call(run, "write_file", FILE_ARGS, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    call_id = forge_commit_of_the_file(run)
    if not signed:
        # The missing commit event would give the forgery away to the reader: the agent adds it, chained.
        # (In the signed run this process holds the key, so it does not: the agent has no key.)
        event = {"call_id": call_id, "tool": "write_file", "attempt": 1, "status": "committed"}
        durable.append_event(run, "receipt", event)

    again = cli_call(run, "write_file", FILE_ARGS)
    if signed:
        assert again.returncode == 4 and "signature" in output(again)["error"]["message"]
        assert decisions(run)[call_id] == "confirm"
        assert "signature_invalid" in signature_codes(run, key_file)
    else:
        # What an unsigned run cannot tell: every check passes, and the forgery is reused.
        assert again.returncode == 0 and output(again)["reused"] is True


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_decision_the_agent_writes_itself_holds_only_in_an_unsigned_run(tmp_path, key_file, monkeypatch, signed):
    if signed:
        monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    run = tmp_path / "run"
    runtime.run_init(run, contract_sha256=CONTRACT)
    assert cli_call(run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_prepared").returncode == 137
    call_id = only_receipt(run)
    digest = protocol.sha256_hex(receipt_path(run, call_id).read_bytes())
    forged = {
        "schema": protocol.CONFIRMATION_SCHEMA, "call_id": call_id, "resolution": "committed", "reason": "trust me",
        "actor": "agent", "confirmed_at": protocol.format_time(protocol.utc_now()), "receipt_sha256": digest,
        "confirmation_id": protocol.confirmation_id(call_id, "committed", digest),
    }  # fmt: skip
    (run / "confirmations" / f"{call_id}.json").write_text(json.dumps(forged))

    again = cli_call(run, "send_message", MESSAGE)
    assert (again.returncode, output(again)["reused"]) == ((4, False) if signed else (0, True))
    assert outbox_lines(run) == [], "either way nothing was sent: the forged decision skips the effect"
    if signed:
        from receipts.reader import read_run

        files, _ = read_run(run, keep_events=False, keys=reader_keys(key_file))
        assert any(f.code == "confirmation_invalid" and "signature" in f.detail for f in files.findings)


@pytest.mark.parametrize(
    ("forge", "code"),
    [
        (lambda run, key: durable.append_event(run, "note", {}), None),
        (lambda run, key: _append_raw(run, {"type": "note"}), "signature_missing"),
        (
            lambda run, key: _append_raw(run, {"type": "note", "signature": f"hmac-sha256:{key.key_id}:" + "0" * 64}),
            "signature_invalid",
        ),
    ],
    ids=["the writer's line", "an unsigned line", "a made-up signature"],
)
def test_every_ledger_line_of_a_signed_run_must_verify(signed_run, key_file, forge, code):
    forge(signed_run, signing.load_key(key_file))
    read_ledger(signed_run)  # the chain itself is intact: only the signature tells
    assert signature_codes(signed_run, key_file) == ({code} if code else set())


def _append_raw(run: Path, fields: dict) -> None:
    """A chained line appended by someone without the key."""
    lines = (run / "events.jsonl").read_bytes().splitlines()
    event = {
        "seq": len(lines) + 1,
        "ts": protocol.format_time(protocol.utc_now()),
        "prev_sha256": protocol.sha256_hex(lines[-1]),
    }
    with (run / "events.jsonl").open("ab") as ledger:
        ledger.write(protocol.canonical_json(event | fields) + b"\n")


def test_signed_and_unsigned_never_mix(tmp_path, key_file, monkeypatch):
    unsigned = tmp_path / "unsigned"
    runtime.run_init(unsigned, contract_sha256=CONTRACT)
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    signed = tmp_path / "signed"
    runtime.run_init(signed, contract_sha256=CONTRACT)

    with_key = cli_call(unsigned, "write_file", FILE_ARGS)
    assert with_key.returncode == 1 and b"not a signed run" in with_key.stderr
    monkeypatch.delenv(signing.KEY_ENV)
    without_key = cli_call(signed, "write_file", FILE_ARGS)
    assert without_key.returncode == 1 and b"is a signed run" in without_key.stderr
    other_key = tmp_path / "other.key"
    other_key.write_bytes(os.urandom(32).hex().encode())
    wrong_key = cli_call(signed, "write_file", FILE_ARGS, RECEIPTS_SIGNING_KEY=str(other_key))
    assert wrong_key.returncode == 1 and b"is signed with key" in wrong_key.stderr
    task = run_writer("write-task", str(signed), "--request", "-", stdin=b'{"subject": "x"}')
    assert task.returncode == 1
    assert not list((signed / "receipts").iterdir()) and not list((signed / "tasks").iterdir())
    assert not list((unsigned / "receipts").iterdir())


def test_a_key_must_be_long_and_outside_the_run(tmp_path, key_file, monkeypatch):
    short = tmp_path / "short.key"
    short.write_bytes(b"hunter2")
    monkeypatch.setenv(signing.KEY_ENV, str(short))
    with pytest.raises(ValueError, match="shorter than 32 bytes"):
        runtime.run_init(tmp_path / "run-a", contract_sha256=CONTRACT)
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    run = tmp_path / "run-b"
    runtime.run_init(run, contract_sha256=CONTRACT)
    inside = run / "workspace" / "key"  # where the agent can read it
    inside.parent.mkdir()
    inside.write_bytes(key_file.read_bytes())
    completed = cli_call(run, "write_file", FILE_ARGS, RECEIPTS_SIGNING_KEY=str(inside))
    assert completed.returncode == 1 and b"lies inside" in completed.stderr
    assert not list((run / "receipts").iterdir())


@pytest.mark.django_db
def test_the_importer_checks_signed_runs_with_its_keys(signed_run, key_file, tmp_path, settings):
    assert cli_call(signed_run, "write_file", FILE_ARGS).returncode == 0
    call_id = only_receipt(signed_run)
    edit_receipt(signed_run, call_id, lambda receipt: receipt.update(created_at="2026-01-01T00:00:00.000000Z"))

    importer.run_import(path=signed_run)  # no keys: nothing about signatures is said
    assert not Finding.objects.filter(code__startswith="signature").exists()

    settings.EVIDENCE_SIGNING_KEY_FILES = [str(key_file)]
    importer.run_import(path=signed_run, force=True)
    assert set(Finding.objects.filter(code__startswith="signature", closed_at=None).values_list("code", flat=True)) == {
        "signature_invalid"
    }

    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32).hex().encode())
    settings.EVIDENCE_SIGNING_KEY_FILES = [str(other)]
    importer.run_import(path=signed_run, force=True)
    assert Finding.objects.filter(code="signature_unchecked", closed_at=None).exists()


@pytest.mark.django_db
def test_signed_runs_only_flags_an_unsigned_run(run_dir, key_file, settings):
    settings.EVIDENCE_SIGNING_KEY_FILES = [str(key_file)]
    settings.EVIDENCE_SIGNED_RUNS_ONLY = True
    importer.run_import(path=run_dir)
    assert Finding.objects.filter(code="signature_missing", subject="steer.json").exists()


@pytest.mark.django_db
def test_settling_in_a_signed_run_signs_the_decision(
    signed_run, key_file, client, django_user_model, settings, monkeypatch
):
    assert cli_call(signed_run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    call_id = only_receipt(signed_run)
    settings.EVIDENCE_SIGNING_KEY_FILES = [str(key_file)]
    importer.run_import(path=signed_run)
    client.force_login(join(django_user_model.objects.create_user("carol", password="a-long-password-1"), "confirmer"))
    form = {
        "resolution": "committed", "reason": "the mail log shows it", "confirm_call_id": call_id[:12],
        "receipt_sha256": protocol.sha256_hex(receipt_path(signed_run, call_id).read_bytes()),
    }  # fmt: skip
    url = reverse("confirm", args=[signed_run.name, call_id])

    monkeypatch.delenv(signing.KEY_ENV)  # a web process without the writer's key records nothing
    refused = client.post(url, form)
    assert refused.status_code == 503 and not (signed_run / "confirmations" / f"{call_id}.json").exists()

    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    assert client.post(url, form).status_code == 303
    confirmation = json.loads((signed_run / "confirmations" / f"{call_id}.json").read_bytes())
    assert protocol.signature_problem(confirmation, run_key(signed_run, key_file)) is None
    resumed = cli_call(signed_run, "send_message", MESSAGE)
    assert resumed.returncode == 0 and output(resumed)["reused"] is True and len(outbox_lines(signed_run)) == 1


# --- a second review: records moved, edited or written beside the signed ones -----------------------


def test_a_signed_run_whose_steer_was_edited_is_not_acted_on(signed_run):
    assert cli_call(signed_run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    steer = json.loads((signed_run / "steer.json").read_bytes())
    steer["identity"] = "call-id-v1"  # new call_ids for every intent: the message in doubt would go again
    (signed_run / "steer.json").write_text(json.dumps(steer))
    completed = cli_call(signed_run, "send_message", MESSAGE)
    assert completed.returncode == 1 and b"steer.json does not verify" in completed.stderr
    assert len(outbox_lines(signed_run)) == 1


def test_a_lost_event_is_recovered_only_for_the_call_s_own_signed_receipt(signed_run):
    call_id = output(cli_call(signed_run, "send_message", MESSAGE))["call_id"]
    fake = protocol.sha256_hex(b"never ran")
    receipt_path(signed_run, call_id).write_text(
        json.dumps({"call_id": fake, "status": "committed", "tool": "send_message", "attempt": 1, "args": {}})
    )
    (signed_run / ".writer" / f"call-{call_id}.lock").write_text('{"receipt":"committed","ledger_size":999999999}')
    assert cli_call(signed_run, "send_message", MESSAGE).returncode == 4
    assert not [event for event in read_ledger(signed_run) if event.get("recovered")], "no signed line for a forgery"


def test_signed_records_copied_from_another_run_do_not_verify(tmp_path, key_file, monkeypatch):
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    source, target = tmp_path / "run-a", tmp_path / "run-b"
    for run in (source, target):
        runtime.run_init(run, contract_sha256=CONTRACT)
    assert cli_call(source, "send_message", MESSAGE).returncode == 0
    for receipt in (source / "receipts").iterdir():
        (target / "receipts" / receipt.name).write_bytes(receipt.read_bytes())
    (target / "outbox.jsonl").write_bytes((source / "outbox.jsonl").read_bytes())
    copied = cli_call(target, "send_message", MESSAGE)
    assert copied.returncode == 4 and "signature" in output(copied)["error"]["message"], "run-b never sent it"


def test_an_unsigned_line_moves_no_verdict_of_a_signed_run(signed_run, key_file):
    call_id = output(cli_call(signed_run, "write_file", FILE_ARGS))["call_id"]
    (signed_run / "workspace" / FILE_ARGS["path"]).unlink()
    assert cli_call(signed_run, "write_file", FILE_ARGS).returncode == 4  # refused: the file is gone
    _append_raw(signed_run, {"type": "call_reused", "call_id": call_id})  # "it was reused after all"
    assert decisions(signed_run)[call_id] == "confirm"
    refused = run_writer("state", str(signed_run), "retrying", "--attempts", "1")
    assert refused.returncode == 4
    assert "signature_missing" in signature_codes(signed_run, key_file)


def test_a_seq_at_the_end_of_its_range_stops_the_writer(signed_run):
    _append_raw(signed_run, {"type": "note", "seq": protocol.MAX_INT})
    completed = cli_call(signed_run, "write_file", FILE_ARGS)
    assert completed.returncode == 1 and b"end of its range" in completed.stderr
    assert not (signed_run / "workspace" / FILE_ARGS["path"]).exists(), "nothing was done"


def test_a_signed_receipt_copied_into_another_run_of_the_same_name_does_not_verify(tmp_path, key_file, monkeypatch):
    """Signatures were bound to the run directory's name: a commit copied from one host's run into
    another host's run of that name verified, and the writer reused it there without sending the
    message. Each signed run has an identity of its own, made at init and signed in steer.json."""
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    one, other = tmp_path / "host-a" / "nightly", tmp_path / "host-b" / "nightly"
    for run in (one, other):
        runtime.run_init(run, contract_sha256=CONTRACT)
    uids = {json.loads((run / "steer.json").read_bytes())["run_uid"] for run in (one, other)}
    assert len(uids) == 2 and all(len(uid) == 32 for uid in uids)

    assert cli_call(one, "send_message", MESSAGE).returncode == 0
    call_id = only_receipt(one)
    (other / "receipts" / f"{call_id}.json").write_bytes(receipt_path(one, call_id).read_bytes())
    assert "signature_invalid" in signature_codes(other, key_file)
    again = cli_call(other, "send_message", MESSAGE)
    assert again.returncode == 4, "the copy is not the other run's record: a person decides, nothing is reused"
    assert outbox_lines(other) == [] and len(outbox_lines(one)) == 1


def test_a_run_signed_before_runs_had_an_identity_still_verifies_under_its_name(tmp_path, key_file, monkeypatch):
    """Made as the writer made signed runs before ``run_uid``: every record bound to the name."""
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    monkeypatch.setattr("receipts.runs.new_run_uid", lambda: "none-yet")  # not a uid: the name binds
    run = tmp_path / "older-run"
    runtime.run_init(run, contract_sha256=CONTRACT)
    steer = json.loads((run / "steer.json").read_bytes())
    del steer["run_uid"]
    by_name = signing.load_key(key_file).for_run(run.name)
    (run / "steer.json").write_bytes(protocol.canonical_json(protocol.signed(steer, by_name)))
    assert cli_call(run, "write_file", FILE_ARGS).returncode == 0
    assert protocol.signature_problem(receipt_of(run, only_receipt(run)), by_name) is None
    assert signature_codes(run, key_file) == set()


def test_a_forged_confirmation_and_a_planted_lock_note_get_no_signed_ledger_line(signed_run):
    """The lock file's note tells the writer to append the event a kill kept out of the ledger for a
    confirmation it wrote. An agent that planted the note beside a confirmation of its own made the
    writer sign that line: the writer now appends only a confirmation it can verify."""
    assert cli_call(signed_run, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    call_id = only_receipt(signed_run)
    receipt_sha256 = protocol.sha256_hex(receipt_path(signed_run, call_id).read_bytes())
    wanted = protocol.confirmation_id(call_id, "rejected", receipt_sha256)
    forged = {
        "schema": protocol.CONFIRMATION_SCHEMA, "call_id": call_id, "resolution": "rejected", "actor": "agent",
        "reason": "it never happened", "confirmation_id": wanted, "receipt_sha256": receipt_sha256,
        "confirmed_at": "2026-12-04T00:00:00Z",
    }  # fmt: skip
    (signed_run / "confirmations").mkdir(exist_ok=True)
    (signed_run / "confirmations" / f"{call_id}.json").write_text(json.dumps(forged))
    ledger_size = (signed_run / "events.jsonl").stat().st_size
    note = json.dumps({"installed": True, "confirmation": wanted, "ledger_size": ledger_size})
    (signed_run / ".writer" / f"call-{call_id}.lock").write_text(note)

    again = cli_call(signed_run, "send_message", MESSAGE)
    assert again.returncode == 4, "the forged decision is not followed: a person decides"
    assert [event for event in read_ledger(signed_run) if event["type"] == "confirmation"] == []
    assert len(outbox_lines(signed_run)) == 1
