"""Exported evidence: no secret in any byte, in any encoding; digests that verify; changes that do not."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils.html import escape

from evidence.redaction import Policy, load_policy, secret_kind
from evidence.verify import verify_export
from receipts import durable, importer, protocol, runtime
from receipts.demo import run_writer
from tests.helpers import CONTRACT, first_call_of

pytestmark = pytest.mark.django_db

CANARIES = {
    "bearer": "Bearer canaryBearerTokenValue0123456789",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJjYW5hcnkiOiJ5ZXMifQ.c2lnbmF0dXJlY2FuYXJ5MDEyMzQ1Njc4OWFi",
    "aws": "AKIACANARY0123456789",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIcanaryPEMbody\n-----END RSA PRIVATE KEY-----",
    "github": "ghp_canaryGitHubToken0123456789abcdefghij",
    "sk": "sk-canaryOpenAIKey0123456789abcdef",
    "url": "https://canaryuser:canarypass@internal.example.com/path",
    "email": "canary.person@example.com",
    "card": "4111 1111 1111 1111",
    "keyed": "hunter2-canary-password",
}


def encodings(secret: str) -> set[str]:
    return {
        secret,
        json.dumps(secret)[1:-1],
        escape(secret),
        urllib.parse.quote(secret),
        urllib.parse.quote_plus(secret),
    }


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A run that holds every canary in args, results, reasons, requests, events, file names and free text."""
    run_dir = tmp_path / "canary-run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    executor = runtime.Executor(run_dir)
    free_text = " | ".join(CANARIES.values())
    executor.call("write_file", {"path": f"notes/{CANARIES['email']}.txt", "content": free_text})
    executor.call(
        "write_file", {"path": f"../{CANARIES['github']}", "content": "x"}
    )  # rejected: the path is in the error
    runtime.write_task(run_dir, {"subject": CANARIES["jwt"], "body": free_text}, CANARIES["aws"])
    killed = run_writer(
        "call", str(run_dir), "--tool", "send_message", "--args",
        json.dumps({"to": CANARIES["email"], "body": CANARIES["bearer"]}), RECEIPTS_FAILPOINT="after_effect",
    )  # fmt: skip
    assert killed.returncode == 137
    durable.append_event(
        run_dir,
        "note",
        {"text": free_text, "password": CANARIES["keyed"], CANARIES["sk"]: "a key that is a secret", "n": 1},
    )
    importer.run_import(path=run_dir)
    prepared = next(call for call in first_call_of_all("canary-run") if call.status == "prepared")
    runtime.confirm_call(
        run_dir,
        prepared.call_id,
        resolution="committed",
        reason=f"checked with {CANARIES['url']} and {CANARIES['card']}",
        actor=CANARIES["email"],
        receipt_sha256=prepared.file_sha256,
    )
    importer.run_import(path=run_dir)
    return run_dir


def first_call_of_all(run_id: str):
    from receipts.models import Call

    return list(Call.objects.filter(run__run_id=run_id))


@pytest.mark.parametrize("policy_text", ["", 'allow = ["write_file.path", "send_message.to"]\n'])
def test_no_canary_is_in_any_exported_byte_in_any_encoding(planted, tmp_path, policy_text):
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(policy_text)
    out = tmp_path / "export"
    call_command("export_evidence", "canary-run", "--out", str(out), "--policy", str(policy_file))
    exported = {name: (out / name).read_text(encoding="utf-8") for name in ("evidence.json", "index.html")}
    for name, text in exported.items():
        for kind, secret in CANARIES.items():
            for form in encodings(secret):
                assert form not in text, f"{kind} canary found in {name}"
    call = first_call_of("canary-run")
    assert call.call_id in exported["evidence.json"] and call.call_id in exported["index.html"]
    assert "write_file" in exported["evidence.json"] and "send_message" in exported["index.html"]
    assert verify_export(out, planted) == []


def test_a_policy_keeps_an_allowed_field_in_clear_and_the_scanner_still_masks_secrets(planted, tmp_path):
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('allow = ["write_file.path"]\n')
    out = tmp_path / "export"
    call_command("export_evidence", "canary-run", "--out", str(out), "--policy", str(policy_file))
    document = json.loads((out / "evidence.json").read_bytes())
    paths = [call["args"]["path"] for call in document["calls"] if call["tool"] == "write_file"]
    assert all(set(path) == {"redacted"} for path in paths), "a path holding a secret is masked even when allowed"
    assert document["manifest"]["policy"]["allowed_fields"] == ["write_file.path"]


def test_a_plain_allowed_field_stays_in_clear(run_dir, tmp_path):
    runtime.Executor(run_dir).call("write_file", {"path": "src/app.py", "content": "print(1)"})
    importer.run_import(path=run_dir)
    out = tmp_path / "export"
    policy = tmp_path / "policy.toml"
    policy.write_text('allow = ["write_file.path"]\n')
    call_command("export_evidence", run_dir.name, "--out", str(out), "--policy", str(policy))
    [call] = json.loads((out / "evidence.json").read_bytes())["calls"]
    assert call["args"]["path"] == "src/app.py" and set(call["args"]["content"]) == {"redacted"}


def test_the_scanner_recognises_every_kind_and_leaves_digests_and_ids_alone():
    policy = Policy()
    for kind, secret in CANARIES.items():
        if kind != "keyed":
            assert secret_kind(secret, policy), kind
    assert secret_kind("0" * 64, policy) is None
    assert secret_kind("f63844ddff3bed389df35a08eb21b23aa620785fcb976105b1e4578d40f6e9ac", policy) is None
    assert secret_kind("send_message", policy) is None and secret_kind("4111 1111 1111 1112", policy) is None


def test_a_policy_file_that_cannot_be_read_is_a_clear_error(tmp_path):
    bad = tmp_path / "policy.toml"
    bad.write_text("allow = [\n")
    with pytest.raises(ValueError, match="cannot be read"):
        load_policy(bad)
    bad.write_text('allow = ["no-dot"]\n')
    with pytest.raises(ValueError, match=r"tool\.field"):
        load_policy(bad)


@pytest.fixture
def exported(demo, tmp_path) -> Path:
    out = tmp_path / "export"
    call_command("export_evidence", "tampered-receipt", "--out", str(out))
    return out


def flip_a_byte(path: Path, needle: bytes) -> None:
    data = path.read_bytes()
    index = data.index(needle)
    path.write_bytes(data[:index] + bytes([data[index] ^ 1]) + data[index + 1 :])


def test_an_intact_export_verifies_against_its_run(exported, demo):
    assert verify_export(exported) == []
    assert verify_export(exported, demo / "tampered-receipt") == [
        f"call {first_call_of('tampered-receipt').call_id}: the original receipt does not give its call_id"
    ], "the tampering the run exists to show is named, and nothing else"


@pytest.mark.parametrize(
    ("name", "needle"), [("evidence.json", b'"tool":"write_file"'), ("index.html", b"Evidence of run")]
)
def test_a_flipped_byte_fails_verification(exported, name, needle):
    flip_a_byte(exported / name, needle)
    problems = verify_export(exported)
    assert problems, f"a flipped byte in {name} went unnoticed"


def test_a_page_edited_and_re_hashed_still_disagrees_with_the_json(exported):
    page = (exported / "index.html").read_bytes()
    evidence = (exported / "evidence.json").read_bytes()
    manifest = json.loads(evidence)["manifest"]
    digest = manifest["sections"]["calls"]
    edited = page.replace(digest.encode(), b"0" * 64)
    (exported / "index.html").write_bytes(edited)
    new_page_digest = protocol.sha256_hex(edited).encode()
    (exported / "evidence.json").write_bytes(evidence.replace(manifest["page_sha256"].encode(), new_page_digest))
    assert f"index.html shows calls as {'0' * 64}, evidence.json says {digest}" in verify_export(exported)


def test_a_changed_original_fails_against(exported, demo):
    run_dir = demo / "tampered-receipt"
    receipt = next((run_dir / "receipts").glob("*.json"))
    document = json.loads(receipt.read_bytes())
    document["input_sha256"] = "1" * 64
    receipt.write_text(json.dumps(document))
    problems = verify_export(exported, run_dir)
    assert any(".input_sha256: the export says" in problem for problem in problems), problems


def test_verify_evidence_needs_no_database(exported, tmp_path):
    import subprocess
    import sys

    from tests.helpers import PROJECT

    env = {"DJANGO_DEBUG": "1", "DATABASE_URL": f"sqlite:///{tmp_path / 'never-made.sqlite3'}", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, str(PROJECT / "manage.py"), "verify_evidence", str(exported)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    assert "intact" in completed.stdout and not (tmp_path / "never-made.sqlite3").exists()
    flip_a_byte(exported / "evidence.json", b'"tool":"write_file"')
    assert subprocess.run(command, env=env, capture_output=True, text=True, check=False).returncode == 1


def test_the_evidence_download_needs_its_permission_and_verifies(client, demo, user, tmp_path):
    import io
    import zipfile
    from http import HTTPStatus

    from django.contrib.auth.models import Permission

    client.force_login(user)
    assert client.get("/runs/clean-run/evidence.zip").status_code == HTTPStatus.FORBIDDEN
    assert "Download the redacted evidence" not in client.get("/runs/clean-run/").content.decode()
    user.user_permissions.add(Permission.objects.get(codename="export_evidence"))
    page = client.get("/runs/clean-run/").content.decode()
    assert "Download the redacted evidence" in page
    response = client.get("/runs/clean-run/evidence.zip")
    assert response.status_code == HTTPStatus.OK
    assert response["Content-Disposition"] == 'attachment; filename="clean-run-evidence.zip"'
    with zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))) as bundle:
        bundle.extractall(tmp_path)
    assert verify_export(tmp_path / "clean-run-evidence", demo / "clean-run") == []


# A phrase no scanner recognises: only the rule under test can keep it out.
MARKER_CANARY = "plain words shaped as a marker, 7f3a"


def test_a_value_shaped_like_the_redaction_marker_is_data_not_a_redaction(run_dir, tmp_path):
    """``{"redacted": X}`` that this project did not write is redacted like any other value."""
    posing = {"redacted": MARKER_CANARY}
    durable.append_event(run_dir, "note", {"token": posing, "detail": posing})
    runtime.write_task(run_dir, {"subject": "s", "body": "b", "labels": [posing]}, "marker-submission")
    importer.run_import(path=run_dir)
    out = tmp_path / "export"
    call_command("export_evidence", run_dir.name, "--out", str(out))
    for name in ("evidence.json", "index.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert not any(form in text for form in encodings(MARKER_CANARY)), name
    assert verify_export(out, run_dir) == []
    # The marker this project writes is kept as it is: a digest is not digested again.
    marker = protocol.redacted(posing)
    assert protocol.is_redaction_marker(marker) and protocol.redacted(marker) == marker
    assert not protocol.is_redaction_marker(posing)
    assert not protocol.is_redaction_marker({"redacted": "sha256:" + "A" * 64})


@pytest.fixture
def settled_export(demo, tmp_path) -> tuple[Path, Path]:
    """The export of a run with a call, a submission-free ledger and a confirmation: every section filled."""
    run_dir = demo / "send-message-killed"
    call = next(call for call in first_call_of_all("send-message-killed") if call.status == "prepared")
    runtime.confirm_call(run_dir, call.call_id, resolution="committed", reason="the mail log shows it",
                         actor="carol", receipt_sha256=call.file_sha256)  # fmt: skip
    importer.run_import(path=run_dir)
    out = tmp_path / "settled-export"
    call_command("export_evidence", "send-message-killed", "--out", str(out))
    assert verify_export(out, run_dir) == []
    return out, run_dir


def edit_json(path: Path, change) -> None:
    document = json.loads(path.read_bytes())
    change(document)
    path.write_text(json.dumps(document))


EDITS = {
    # what changed in the original, after the export: the field a verifier must name
    "a receipt's status": (lambda run: edit_json(next((run / "receipts").glob("*.json")),
                                                 lambda d: d.update(status="committed")), ".status"),
    "a receipt's result": (lambda run: edit_json(next((run / "receipts").glob("*.json")),
                                                 lambda d: d.update(result={"remote_resource_id": "msg-other"})),
                           ".result"),
    "a confirmation's reason": (lambda run: edit_json(next((run / "confirmations").glob("*.json")),
                                                      lambda d: d.update(reason="edited later")), ".reason"),
    "a ledger line": (lambda run: (run / "events.jsonl").write_bytes(
        (run / "events.jsonl").read_bytes().replace(b'"type":"state"', b'"type":"stat3"', 1)), "line_sha256"),
    "an event dropped": (lambda run: (run / "events.jsonl").write_bytes(
        b"\n".join((run / "events.jsonl").read_bytes().split(b"\n")[:-2]) + b"\n"), "not in the ledger"),
}  # fmt: skip


@pytest.mark.parametrize("edit", list(EDITS))
def test_verify_against_names_every_field_that_changed_in_the_original(settled_export, edit):
    out, run_dir = settled_export
    change, named = EDITS[edit]
    change(run_dir)
    problems = verify_export(out, run_dir)
    assert any(named in problem for problem in problems), problems


def test_verify_against_never_crashes_on_an_export_edited_by_hand(settled_export):
    out, run_dir = settled_export
    document = json.loads((out / "evidence.json").read_bytes())
    document["calls"].append({"tool": "no call_id here"})
    document["calls"].append("not even an object")
    document["events"].append({"seq": "one"})
    document["confirmations"] = {"not": "a list"}
    (out / "evidence.json").write_text(json.dumps(document))
    problems = verify_export(out, run_dir)
    assert "calls[1]: no call_id" in problems or any("no call_id" in problem for problem in problems)
    assert any("no seq" in problem for problem in problems) and "confirmations: not a list" in problems
