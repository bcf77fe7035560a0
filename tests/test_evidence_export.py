"""Exported evidence: no secret in any byte, in any encoding; digests that verify; changes that do not."""

from __future__ import annotations

import base64
import json
import urllib.parse
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils.html import escape

from evidence.export.redaction import Policy, clear, load_policy, secret_kind
from evidence.ingest import importer
from receipts import durable, protocol, runtime
from receipts.demo import run_writer
from receipts.reader.verify import verify_export
from tests.helpers import CONTRACT, export_through_the_page, first_call_of

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
    from evidence.models import Call

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


def b64(value: object, *, urlsafe: bool = False) -> str:
    data = json.dumps(value).encode()
    return (base64.urlsafe_b64encode(data).decode().rstrip("=")) if urlsafe else base64.b64encode(data).decode()


# The security review's canaries (issue 19): realistic-looking, fake. Each names where it is planted.
REVIEW_CANARIES = {
    "event type": "xoxb-2048812345-4096812345-QzLmNpRsTuVwXyAbCdEfGhIj",
    "event tool": "https://hooks.slack.com/services/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",
    "run_id": "sk_live_51CanaryRunIdQz8NpLmRsTuVwXy",
    "dict key": "rk_live_51CanaryDictKeyQz8NpLmRsTuVw",
    "event key": "sk_test_51CanaryEventKeyQz8NpLmRsTu",
    "tool_version": "AIzaSyC4naryToolVersion_0123456789abcde",
    "tool": "AIzaSyC4naryToolName-0123456789abcdefgh",
    "run state": "AIzaSyC4naryRunState_0123456789abcdefgh",
    "client_submission_id (Azure)": "DefaultEndpointsProtocol=https;AccountName=canarystore;"
    "AccountKey=Q2FuYXJ5QWNjb3VudEtleUZha2VGYWtlMDEyMzQ1Njc4OQ==;EndpointSuffix=core.windows.net",
    "client_submission_id (phone)": "+14155550134",
    "client_submission_id (IBAN)": "GB82WEST12345698765432",
    "client_submission_id (SSN)": "078-05-1120",
    "client_submission_id (URL)": "https://api.example.com/v1/items?api_key=canaryQueryKey0123456789",
    "finding subject (file name)": "xoxp-1234567890-0987654321-1122334455-canaryfilename0123",
    "identity": b64({"api_key": "canary-identity-0123", "kid": "k1"}),
    "task_id": "DE89 3704 0044 0532 0130 00",
    "call_id": "+442079460958",
}
# Further places a value stays in clear, each holding a secret of a kind the scanner knows.
FURTHER_CANARIES = {
    "submission state": "+1 415 555 0175",
    "confirmation file name": "219-09-9999",
    "confirmation resolution": "pk_live_51CanaryResolution0123456789",
    "submission event request_digest": "NL91ABNA0417164300",
    "submission event action_taken": "AIzaSyC4naryActionTaken0123456789abcdef",
    "receipt status": "sk_live_51CanaryStatus0123456789",
    "run attempts": "4111111111111111",
}
# Issue 36: kinds that left in fields kept in clear. Each is the shape its issuer gives, fake.
SECRET_SHAPES = {
    "GitHub fine-grained token": "github_pat_11CANARYfineGrained0Tk_" + ("CanaryFineGrainedBody0123456789" * 2)[:59],
    "npm token": "npm_CanaryBareNpmToken0123456789abcdefgh",
    "Basic credentials": "Basic Y2FuYXJ5OmNhbmFyeS1iYXNpYy1wYXNzd29yZA==",  # canary:canary-basic-password
    "Google OAuth token": "ya29.a0CanaryGoogleAccessToken_0123456789-abcdefghij",
}
# A card number is also a JSON number: 4111111111111111, and a float with the same digits.
CARD_NUMBERS = [4111111111111111, 4.111111111111111e15, 4111111111111111.0, 5500000000000004.0]
# Numbers that are what they say: counts, sizes, ratios, times, a whole float that fails Luhn.
PLAIN_NUMBERS = [0, 1, 42, 3.0, 0.5, 12.75, 1048576.0, 1e15, 4111111111111112.0, 1732999999.123, 1e300, -7.0]
# More forms of each kind the scanner knows.
RECOGNISED = [
    "xoxp-1234567890-0987654321-1122334455-abcdef0123456789abcdef0123456789",
    "xapp-1-A0CANARY-1234567890-abcdef0123456789",
    "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "pk_live_51CanaryPublishableKey0123456789",
    "https://canarystore.blob.core.windows.net/c/f.txt?sv=2022-11-02&ss=b&sp=r&sig=Q2FuYXJ5U2lnbmF0dXJl%3D",
    "BlobEndpoint=https://x.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02&sig=abcdEFGH1234",
    "https://example.com/callback#access_token=ya29.canary&expires_in=3600",
    "https://example.com/login?user=ann&password=hunter2",
    "https://example.com/x?token=abc123&page=2",
    "Authorization: Basic dXNlcjpwYXNz",
    "curl -H 'authorization: basic dXNlcjpwYXNzd29yZA' https://example.com",
    "BASIC dXNlcjpwYXNz",
    "token ya29.c.b0AXv0zTOcanaryServiceAccount0123 expires soon",
    "//registry.npmjs.org/ " + SECRET_SHAPES["npm token"],
    "pushed with " + SECRET_SHAPES["GitHub fine-grained token"] + ".",
    "+44 20 7946 0958",
    "+1 (415) 555-0134",
    "(415) 555-0134",
    "call 415.555.0134 today",
    "sub-415-555-0134",
    "GB82 WEST 1234 5698 7654 32",
    "refund-NL91ABNA0417164300",
    "FR1420041010050500013M02606",
    "ssn 219-09-9999 on file",
    b64({"nested": {"client_secret": "x"}}),
    b64({"user": "ann", "apiKey": "abc"}, urlsafe=True),
    b64({"note": "AKIACANARY0123456789"}),
    # detect-secrets' filters would skip these; its plugins are called without them
    "AKIACANARY0123456789 # pragma: allowlist secret",
    CANARIES["jwt"] + "  # pragma: allowlist secret",
]
# detect-secrets' plugins that none of our patterns precedes, by the kind each reports.
PLUGIN_CANARIES = {
    "GitLab Token": "glpat-CanaryGitLab0123456789ab",
    "Discord Bot Token": "MTCanaryDiscordBot0123456.GCanry.CanaryDiscordSignature01234",
    "Mailchimp Access Key": "0123456789abcdef0123456789abcdef-us14",
    "NPM tokens": "//registry.npmjs.org/:_authToken=npm_CanaryNpmToken0123456789",
    "PyPI Token": "pypi-AgEIcHlwaS5vcmc" + "Canary0123456789" * 5,
    "SendGrid API Key": "SG.CanarySendGridKey01234.CanarySendGridSecret0123456789abcdefghijklm",
    "Square OAuth Secret": "sq0csp-CanarySquareSecret0123456789abcdefghijklmno",
    "Telegram Bot Token": "123456789:AAFcanaryTelegramBotToken0123456789",
    "Twilio API Key": "SKcanarytwilio0123456789abcdef0123",
}
# What evidence is made of, and ordinary words: none of it may be taken for a secret.
HARMLESS = [
    "0" * 64,
    "f63844ddff3bed389df35a08eb21b23aa620785fcb976105b1e4578d40f6e9ac",
    "sha256:f63844ddff3bed389df35a08eb21b23aa620785fcb976105b1e4578d40f6e9ac",
    "123e4567-e89b-12d3-a456-426614174000",
    "12345678-1234-1234-1234-123456789012",
    "2026-11-29T12:00:00.000000Z",
    "2026-11-29T12:00:00.123456+05:30",
    "2026-11-29",
    "20261129T120000Z",
    "1.0.0",
    "1.0.0+20240101123456",
    "v2.14.0-rc.1",
    "2024.10.1.1234",
    "10.0.0.1",
    "192.168.100.200",
    "42",
    "9223372036854775807",
    "14155550134",
    "1732999999999",
    "send_message",
    "write_file",
    "call-id-v2",
    "running",
    "committed",
    "task-000001",
    "sub-1",
    "canary-run",
    "receipts/abc.json",
    "events.jsonl line 7",
    "the quiet harbour at nine",
    "https://example.com/page?id=42&sort=asc",
    "page=2&size=50",
    "4111 1111 1111 1112",
    "000-12-3456",
    "666-12-3456",
    "900-12-3456",
    "123-00-4567",
    "123-45-0000",
    "GB82WEST12345698765433",
    "XX82WEST12345698765432",
    "+01:00",
    "555-0134",
    "tokenizer",
    "pk_lives_here",
    "eyJ0eXAiOiJub3RlIn0",
    "basic settings",
    "Basic Auth",
    "basic dGhlIHF1aWV0IGhhcmJvdXI",  # base64 of words without a colon: no user:password
    "the basic plan",
    "npm_install",
    "npm_config_registry",
    "github_pat_expiry",
    "ya29.short",
    "ya29",
]


def test_the_scanner_recognises_every_kind_and_leaves_digests_and_ids_alone():
    policy = Policy()
    for kind, secret in CANARIES.items():
        if kind != "keyed":
            assert secret_kind(secret, policy), kind
    for where, secret in REVIEW_CANARIES.items():
        assert secret_kind(secret, policy), where
    for secret in RECOGNISED:
        assert secret_kind(secret, policy), secret
    for kind, secret in PLUGIN_CANARIES.items():
        assert secret_kind(secret, policy) == kind
    for value in HARMLESS:
        assert secret_kind(value, policy) is None, value
    for kind, secret in SECRET_SHAPES.items():
        assert secret_kind(secret, policy) == kind
    assert len(SECRET_SHAPES["GitHub fine-grained token"].split("_", 2)[2]) == 22 + 1 + 59
    for number in CARD_NUMBERS:
        assert clear(number, policy) == protocol.redacted(number), number
        assert clear({"attempt": [number]}, policy) == {"attempt": [protocol.redacted(number)]}
    for number in PLAIN_NUMBERS:
        assert clear(number, policy) == number, number
    for value in HARMLESS:
        assert clear(value, policy) == value, value
    assert all(len(REVIEW_CANARIES[where]) == 39 for where in ("tool_version", "tool", "run state")), "AIza + 35"
    assert protocol.valid_run_id(REVIEW_CANARIES["run_id"])


def test_a_long_value_is_scanned_in_time_that_grows_with_its_length_not_its_square():
    """A run of 100,000 letters once took 90 s: the e-mail and URL patterns were tried at each one."""
    import time

    policy = Policy()
    for value in ("a" * 100_000 + "@", "ey" + "A" * 100_000, "x://" + "a" * 100_000, "+1 2 3 4 5 6 7 8 9 " * 10_000,
                  ("GB82" + "A" * 3_000 + " ") * 30, ("+1" + "9" * 5_000 + " ") * 50, "Basic " * 20_000,
                  "basic " + "QUFB" * 25_000, "github_pat_" * 10_000, "ya29." * 20_000):  # fmt: skip
        started = time.perf_counter()
        secret_kind(value, policy)
        assert time.perf_counter() - started < 5, value[:20]


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
    assert any(
        problem.startswith("index.html does not say what evidence.json says: line ") and "0" * 64 in problem
        for problem in verify_export(exported)
    )


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
    assert client.post("/runs/clean-run/export/").status_code == HTTPStatus.FORBIDDEN
    assert "Export the redacted evidence" not in client.get("/runs/clean-run/").content.decode()
    user.user_permissions.add(Permission.objects.get(codename="export_evidence"))
    page = client.get("/runs/clean-run/").content.decode()
    assert "Export the redacted evidence" in page
    response = export_through_the_page(client, "clean-run")
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


def exported_texts(out: Path) -> dict[str, str]:
    return {name: (out / name).read_text(encoding="utf-8") for name in ("evidence.json", "index.html")}


def download_evidence(client, user, run_id: str, into: Path) -> tuple[str, list[str], dict[str, str]]:
    """The run page's zip: its Content-Disposition, its entry names, and each entry's text (also extracted)."""
    import io
    import zipfile
    from http import HTTPStatus

    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="export_evidence"))
    client.force_login(user)
    response = export_through_the_page(client, run_id)
    assert response.status_code == HTTPStatus.OK
    with zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))) as bundle:
        names = bundle.namelist()
        texts = {name: bundle.read(name).decode("utf-8") for name in names}
        bundle.extractall(into)
    return response["Content-Disposition"], names, texts


def assert_nowhere(canaries: dict[str, str], places: dict[str, str]) -> None:
    """No canary, raw or JSON-escaped, HTML-escaped or URL-encoded, in any of ``places``."""
    for where, secret in canaries.items():
        for form in encodings(secret):
            for place, text in places.items():
                assert form not in text, f"the canary planted in the {where} is in {place} as {form!r}"


# Plain words: no scanner recognises them, so only the allowlist keeps them out of an export.
UNRECOGNISED = {
    "confirmation reason": "the quiet harbour at nine",
    "confirmation actor": "marigold lantern keeper",
    "event free text": "seven herons over the salt marsh",
    "event message": "a kettle left singing in the attic",
    "event reason": "because the tide turned early",
    "event detail": "copper bells beneath the old bridge",
    "write_file path (in its args, result and error)": "notes about the orchard wall",
    "write_file content": "plums ripen slowly in a cold summer",
    "send_message body": "meet me by the blue boathouse",
    "request subject": "mend the lighthouse stairs",
    "request body": "paint the railings before the storms",
    "finding detail": "the lighthouse keeper's ledger",
}


@pytest.fixture
def unrecognised_run(tmp_path: Path) -> Path:
    """A run that holds each phrase of UNRECOGNISED only in a field the allowlist drops."""
    run_dir = tmp_path / "allowlist-run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    executor = runtime.Executor(run_dir)
    path = UNRECOGNISED["write_file path (in its args, result and error)"]
    executor.call("write_file", {"path": f"{path}.txt", "content": UNRECOGNISED["write_file content"]})
    executor.call("write_file", {"path": f"../{path}", "content": "x"})  # rejected: the path is in its error
    runtime.write_task(
        run_dir, {"subject": UNRECOGNISED["request subject"], "body": UNRECOGNISED["request body"]}, "sub-1"
    )
    [record] = (run_dir / "submissions").glob("*.json")
    edit_json(record, lambda document: document.update(task_path=UNRECOGNISED["finding detail"]))  # a finding
    durable.append_event(
        run_dir,
        "note",
        {
            "text": UNRECOGNISED["event free text"],
            "message": UNRECOGNISED["event message"],
            "reason": UNRECOGNISED["event reason"],
            "detail": UNRECOGNISED["event detail"],
        },
    )
    killed = run_writer(
        "call", str(run_dir), "--tool", "send_message", "--args",
        json.dumps({"to": "ops-desk", "body": UNRECOGNISED["send_message body"]}), RECEIPTS_FAILPOINT="after_effect",
    )  # fmt: skip
    assert killed.returncode == 137
    importer.run_import(path=run_dir)
    prepared = next(call for call in first_call_of_all("allowlist-run") if call.status == "prepared")
    runtime.confirm_call(
        run_dir,
        prepared.call_id,
        resolution="committed",
        reason=UNRECOGNISED["confirmation reason"],
        actor=UNRECOGNISED["confirmation actor"],
        receipt_sha256=prepared.file_sha256,
    )
    importer.run_import(path=run_dir)
    return run_dir


def test_what_the_allowlist_drops_is_in_no_exported_byte_though_no_scanner_knows_it(
    unrecognised_run, tmp_path, client, user
):
    """Reasons, actors, free text, args the policy does not allow, results, errors, requests and
    finding details are redacted because the allowlist drops them, not because they look like secrets."""
    from evidence.models import Confirmation, Finding

    policy = Policy()
    assert all(secret_kind(phrase, policy) is None for phrase in UNRECOGNISED.values()), "the scanner must not help"
    # Each phrase is where this test says it is, in the imported records.
    assert Confirmation.objects.get(run__run_id="allowlist-run").reason == UNRECOGNISED["confirmation reason"]
    assert any(UNRECOGNISED["finding detail"] in f.detail for f in Finding.objects.filter(run__run_id="allowlist-run"))
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('allow = ["send_message.to"]\n')
    out = tmp_path / "export"
    call_command("export_evidence", "allowlist-run", "--out", str(out), "--policy", str(policy_file))
    exported = exported_texts(out)
    disposition, names, zipped = download_evidence(client, user, "allowlist-run", tmp_path / "zip")
    places = {**exported, **{f"the zip's {name}": text for name, text in zipped.items()}}
    places |= {"the zip's entry names": "\n".join(names), "Content-Disposition": disposition}
    assert_nowhere(UNRECOGNISED, places)
    assert '"to":"ops-desk"' in exported["evidence.json"], "the field the policy allows is in clear"
    assert verify_export(out, unrecognised_run) == []
    assert verify_export(tmp_path / "zip" / "allowlist-run-evidence", unrecognised_run) == []


@pytest.fixture
def review_run(tmp_path: Path) -> Path:
    """A run directory holding the review's canaries in ids, keys, names and states, written by the
    real writer where it can (tasks, events, a call) and as files beside it where it cannot."""
    canary = REVIEW_CANARIES
    run_dir = tmp_path / canary["run_id"]
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "hello"})
    for where in [name for name in canary if name.startswith("client_submission_id")]:
        runtime.write_task(run_dir, {"subject": "s", "body": where}, canary[where])
    record = run_dir / "submissions" / f"{protocol.submission_key(canary['client_submission_id (phone)'])}.json"
    edit_json(record, lambda document: document.update(task_id=canary["task_id"]))
    durable.append_event(run_dir, canary["event type"], {"tool": canary["event tool"]})
    durable.append_event(run_dir, "note", {canary["event key"]: "x", "action": {canary["dict key"]: "rotate"}})
    # A call whose tool and tool_version are keys (its receipt verifies: its call_id is theirs).
    args = {"path": "b.txt", "content": "b"}
    tool, version = canary["tool"], canary["tool_version"]
    call_id = protocol.make_call_id(CONTRACT, 1, tool, args, version, protocol.IDENTITY_V2)
    receipt = {"call_id": call_id, "identity": protocol.IDENTITY_V2, "contract_sha256": CONTRACT, "attempt": 1,
               "tool": tool, "tool_version": version, "args": args, "input_sha256": protocol.input_sha256(args),
               "status": "committed", "result": {}, "output_sha256": protocol.input_sha256({}),
               "created_at": "2026-11-29T12:00:00.000000Z", "updated_at": "2026-11-29T12:00:01.000000Z"}  # fmt: skip
    (run_dir / "receipts" / f"{call_id}.json").write_bytes(protocol.canonical_json(receipt))
    durable.append_event(run_dir, "receipt", {"call_id": call_id, "tool": tool, "attempt": 1, "status": "committed"})
    # A receipt whose file name (its call_id) is a phone number and whose identity is base64 of a key.
    odd = {**receipt, "call_id": canary["call_id"], "identity": canary["identity"], "tool": "write_file"}
    (run_dir / "receipts" / f"{canary['call_id']}.json").write_bytes(protocol.canonical_json(odd))
    durable.append_event(run_dir, "receipt", {"call_id": canary["call_id"], "attempt": 1, "status": "committed"})
    # A file that is not JSON, named by a token: its finding's subject is the file name.
    (run_dir / "receipts" / f"{canary['finding subject (file name)']}.json").write_text("{not json")
    further = FURTHER_CANARIES
    record = run_dir / "submissions" / f"{protocol.submission_key(canary['client_submission_id (SSN)'])}.json"
    edit_json(record, lambda document: document.update(state=further["submission state"]))
    durable.append_event(run_dir, "submission", {
        "client_submission_id": canary["client_submission_id (phone)"], "disposition": "reused",
        "request_digest": further["submission event request_digest"],
        "action_taken": further["submission event action_taken"]})  # fmt: skip
    args = {"path": "c.txt", "content": "c"}
    call_id = protocol.make_call_id(CONTRACT, 1, "write_file", args, "1.0.0", protocol.IDENTITY_V2)
    status = {**receipt, "call_id": call_id, "tool": "write_file", "tool_version": "1.0.0", "args": args,
              "input_sha256": protocol.input_sha256(args), "status": further["receipt status"]}  # fmt: skip
    (run_dir / "receipts" / f"{call_id}.json").write_bytes(protocol.canonical_json(status))
    durable.append_event(run_dir, "receipt", {"call_id": call_id, "status": further["receipt status"]})
    confirmation = {"schema": protocol.CONFIRMATION_SCHEMA, "call_id": further["confirmation file name"],
                    "resolution": further["confirmation resolution"], "reason": "r", "actor": "a"}  # fmt: skip
    (run_dir / "confirmations").mkdir(exist_ok=True)
    (run_dir / "confirmations" / f"{further['confirmation file name']}.json").write_text(json.dumps(confirmation))
    state = {"name": canary["run state"], "attempts": int(further["run attempts"])}
    (run_dir / "state.json").write_text(json.dumps(state))
    importer.run_import(path=run_dir)
    return run_dir


def test_the_reviews_canaries_in_ids_keys_and_names_are_in_no_exported_byte_nor_name(
    review_run, tmp_path, client, user
):
    """Issue 19: with the default policy, no canary of the review is in evidence.json, index.html,
    the zip's entries or its names; each id it was in is its digest, the same one everywhere."""
    from evidence.models import Call, Event, Finding, Run, Submission

    canary = REVIEW_CANARIES
    run_id = canary["run_id"]
    # Each canary was imported where the review found it.
    run = Run.objects.get(run_id=run_id)
    assert run.state == canary["run state"]
    assert {canary["tool"], "write_file"} <= set(Call.objects.filter(run=run).values_list("tool", flat=True))
    assert Call.objects.filter(run=run, tool_version=canary["tool_version"]).exists()
    assert Call.objects.filter(run=run, call_id=canary["call_id"], identity=canary["identity"]).exists()
    submissions = set(Submission.objects.filter(run=run).values_list("client_submission_id", "task_id"))
    assert {name for name, _ in submissions} == {canary[w] for w in canary if w.startswith("client_submission_id")}
    assert canary["task_id"] in {task for _, task in submissions}
    assert Event.objects.filter(run=run, type=canary["event type"]).exists()
    assert Finding.objects.filter(run=run, subject=f"receipts/{canary['finding subject (file name)']}.json").exists()
    further = FURTHER_CANARIES
    assert Submission.objects.filter(run=run, state=further["submission state"]).exists()
    assert Call.objects.filter(run=run, status=further["receipt status"], verification=protocol.VERIFIED).exists()
    assert Event.objects.filter(run=run, request_digest=further["submission event request_digest"]).exists()
    assert run.confirmations.get().resolution == further["confirmation resolution"]
    assert run.attempts == int(further["run attempts"])

    out = tmp_path / "export"
    call_command("export_evidence", run_id, "--out", str(out))
    exported = exported_texts(out)
    disposition, names, zipped = download_evidence(client, user, run_id, tmp_path / "zip")
    places = {**exported, **{f"the zip's {name}": text for name, text in zipped.items()}}
    places |= {"the zip's entry names": "\n".join(names), "Content-Disposition": disposition}
    assert_nowhere(canary | FURTHER_CANARIES, places)

    # The run_id is its digest, the same in evidence.json, index.html and the zip's names.
    marker = protocol.redacted(run_id)
    document = json.loads(exported["evidence.json"])
    assert document["run"]["run_id"] == marker and document["run"]["state"] == protocol.redacted(canary["run state"])
    assert escape(json.dumps(marker, separators=(",", ":"))) in exported["index.html"]
    stem = marker["redacted"].replace("sha256:", "sha256-") + "-evidence"
    assert names == [f"{stem}/evidence.json", f"{stem}/index.html"]
    assert disposition == f'attachment; filename="{stem}.zip"'
    assert zipped[f"{stem}/evidence.json"] == exported["evidence.json"], "the download is the same export"
    # A key that trips the scanner is the marker's digest string, nested or not.
    payloads = [event["payload"] for event in document["events"]]
    assert any(protocol.redacted(canary["event key"])["redacted"] in payload for payload in payloads)
    assert any(protocol.redacted(canary["dict key"])["redacted"] in payload.get("action", {}) for payload in payloads)
    # The ids a scanner let through are there, in clear: the export still says what happened.
    call_ids = [call["call_id"] for call in document["calls"]]
    assert protocol.redacted(canary["call_id"]) in call_ids
    assert any(isinstance(call_id, str) and protocol.HEX64_RE.fullmatch(call_id) for call_id in call_ids)
    assert "write_file" in exported["index.html"]
    # Intact: the manifest holds, and against the run every id matches in clear or by its digest.
    assert verify_export(out, review_run) == [] and verify_export(tmp_path / "zip" / stem, review_run) == []


@pytest.fixture(params=sorted(SECRET_SHAPES))
def shaped_run(request, tmp_path: Path, settings) -> tuple[Path, str]:
    """Issue 36: a run holding one of SECRET_SHAPES in every field an export keeps in clear, or
    that a person might think it keeps (its id, its host's name, a call's id and tool, a submission's
    ids, reasons, a finding's subject and detail, an event's facts), and a card number stored as a
    JSON float in an event's facts and in an argument a policy allows."""
    secret = SECRET_SHAPES[request.param]
    run_id = secret if protocol.valid_run_id(secret) else "shaped-run"
    if protocol.valid_run_id(secret):
        settings.EVIDENCE_HOST_NAME = secret  # the importing host is named by it too
    run_dir = tmp_path / run_id
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "hello"})
    runtime.write_task(run_dir, {"subject": "s", "body": "b"}, secret)
    [record] = (run_dir / "submissions").glob("*.json")
    edit_json(record, lambda document: document.update(task_id=secret, task_path=secret))  # a finding's detail
    durable.append_event(run_dir, "submission", {
        "client_submission_id": secret, "disposition": "conflict", "reason": secret,
        "request_digest": "0" * 64})  # fmt: skip
    durable.append_event(run_dir, "note", {"tool": secret, "reason": secret, "attempt": CARD_NUMBERS[1]})
    # A committed call whose tool is the secret, with a card as a float in an argument the policy allows.
    args = {"path": "b.txt", "content": "b", "size": CARD_NUMBERS[2]}
    call_id = protocol.make_call_id(CONTRACT, 1, secret, args, "1.0.0", protocol.IDENTITY_V2)
    receipt = {"call_id": call_id, "identity": protocol.IDENTITY_V2, "contract_sha256": CONTRACT, "attempt": 1,
               "tool": secret, "tool_version": "1.0.0", "args": args, "input_sha256": protocol.input_sha256(args),
               "status": "committed", "result": {}, "output_sha256": protocol.input_sha256({}),
               "created_at": "2026-11-29T12:00:00.000000Z", "updated_at": "2026-11-29T12:00:01.000000Z"}  # fmt: skip
    (run_dir / "receipts" / f"{call_id}.json").write_bytes(protocol.canonical_json(receipt))
    durable.append_event(run_dir, "receipt", {"call_id": call_id, "tool": secret, "attempt": 1, "status": "committed"})
    # A receipt named by the secret (its call_id), and a file that is not JSON named by it (a finding's subject).
    named = {**receipt, "call_id": secret, "tool": "write_file"}
    (run_dir / "receipts" / f"{secret}.json").write_bytes(protocol.canonical_json(named))
    durable.append_event(run_dir, "receipt", {"call_id": secret, "attempt": 1, "status": "committed"})
    (run_dir / "receipts" / f"{secret}.broken.json").write_text("{not json")
    killed = run_writer("call", str(run_dir), "--tool", "send_message", "--args", json.dumps({"to": "x", "body": "y"}),
                        RECEIPTS_FAILPOINT="after_effect")  # fmt: skip
    assert killed.returncode == 137
    importer.run_import(path=run_dir)
    prepared = next(call for call in first_call_of_all(run_id) if call.status == "prepared")
    runtime.confirm_call(run_dir, prepared.call_id, resolution="committed", reason=secret, actor="ann",
                         receipt_sha256=prepared.file_sha256)  # fmt: skip
    importer.run_import(path=run_dir)
    return run_dir, request.param


def test_issue_36_secrets_in_fields_kept_in_clear_are_in_no_exported_byte_nor_name(shaped_run, tmp_path, client, user):
    from evidence.models import Call, Confirmation, Event, Finding, Run, Submission

    run_dir, kind = shaped_run
    secret = SECRET_SHAPES[kind]
    run = Run.objects.get(run_id=run_dir.name)
    # Each was imported where this test says.
    assert run.run_id == secret or not protocol.valid_run_id(secret)
    assert run.host is not None and (run.host.name == secret or not protocol.valid_run_id(secret))
    assert Call.objects.filter(run=run, call_id=secret).exists()
    assert Call.objects.filter(run=run, tool=secret, verification=protocol.VERIFIED).exists()
    assert Submission.objects.filter(run=run, client_submission_id=secret, task_id=secret).exists()
    payloads = [event.payload for event in Event.objects.filter(run=run)]
    assert any(payload.get("tool") == secret for payload in payloads)
    assert sum(payload.get("reason") == secret for payload in payloads) >= 2, "a conflict's and a note's"
    assert any(payload.get("attempt") == CARD_NUMBERS[1] for payload in payloads), "stored as a float"
    assert Confirmation.objects.filter(run=run, reason=secret).exists()
    findings = Finding.objects.filter(run=run)
    assert any(secret in finding.subject for finding in findings), "a finding's subject"
    assert any(secret in finding.detail for finding in findings), "a finding's detail"

    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'allow = ["{secret}.size", "write_file.size"]\n')
    out = tmp_path / "export"
    call_command("export_evidence", run.run_id, "--out", str(out), "--policy", str(policy_file))
    exported = exported_texts(out)
    disposition, names, zipped = download_evidence(client, user, run.run_id, tmp_path / "zip")
    places = {**exported, **{f"the zip's {name}": text for name, text in zipped.items()}}
    places |= {"the zip's entry names": "\n".join(names), "Content-Disposition": disposition}
    card_forms = {"card as an int": "4111111111111111", "card as a float": json.dumps(CARD_NUMBERS[1])}
    assert_nowhere({kind: secret, **card_forms}, places)
    # The export still says what happened, and verifies against the run.
    document = json.loads(exported["evidence.json"])
    assert protocol.redacted(secret) in [call["tool"] for call in document["calls"]]
    assert any((call["args"] or {}).get("size") == protocol.redacted(CARD_NUMBERS[2]) for call in document["calls"])
    assert "write_file" in exported["index.html"]
    # Intact; against the run, only the receipt named by the secret is said not to give its call_id
    # (it claims a name its content does not hash to), matched through its digest.
    [stem] = {name.split("/")[0] for name in names}
    tampered = [f"call {secret}: the original receipt does not give its call_id"]
    assert verify_export(out) == [] and verify_export(tmp_path / "zip" / stem) == []
    assert verify_export(out, run_dir) == tampered and verify_export(tmp_path / "zip" / stem, run_dir) == tampered


def test_issue_36_secrets_a_stripped_run_keeps_in_clear_are_in_no_export_of_it(shaped_run, tmp_path):
    """Retention strips bodies to the same marker and keeps ids, tools and event facts: an export of
    the stripped run scans what was kept like any value."""
    from evidence.models import Event, Run
    from evidence.retention.actions import strip_bodies

    run_dir, kind = shaped_run
    run = Run.objects.get(run_id=run_dir.name)
    strip_bodies(run=run, now=protocol.utc_now())
    payloads = [event.payload for event in Event.objects.filter(run=run)]
    assert any(payload.get("tool") == SECRET_SHAPES[kind] for payload in payloads), "a fact kept by stripping"
    assert any(payload.get("attempt") == CARD_NUMBERS[1] for payload in payloads)
    out = tmp_path / "export"
    call_command("export_evidence", run.run_id, "--out", str(out))
    card_forms = {"card as an int": "4111111111111111", "card as a float": json.dumps(CARD_NUMBERS[1])}
    assert_nowhere({kind: SECRET_SHAPES[kind], **card_forms}, exported_texts(out))
    assert verify_export(out) == []


def test_a_call_nested_at_the_writers_limit_exports_and_verifies(run_dir, tmp_path):
    """Issue 55, case 7: what the writer accepts reads back in every envelope, an export's
    evidence.json (three levels around a call's arguments) and its page included."""
    from tests.test_executor import EchoingAdapter, deep

    args = deep(protocol.MAX_VALUE_DEPTH - 2)
    outcome = runtime.Executor(run_dir, {"counting": EchoingAdapter()}).call("counting", args, attempt=1)
    assert outcome.status == "committed"
    importer.run_import(path=run_dir)
    out = tmp_path / "export"
    call_command("export_evidence", run_dir.name, "--out", str(out))
    [call] = protocol.load_json_strict((out / "evidence.json").read_bytes())["calls"]
    assert call["call_id"] == outcome.call_id
    assert verify_export(out, run_dir) == []


@pytest.mark.parametrize(
    "reason", [{"why": "a secret sk-live-0123456789abcdef"}, ["one", "two"]], ids=["object", "list"]
)
def test_an_event_whose_reason_is_not_text_is_exported_redacted(run_dir, tmp_path, reason):
    """A ledger event whose ``reason`` is an object or a list made every export of its run fail
    (``TypeError: unhashable type``, looking it up among the known conflict reasons): it is a
    value like any other now, redacted, and the export verifies."""
    call = runtime.Executor(run_dir).call("write_file", {"path": "notes.txt", "content": "x"})
    durable.append_event(run_dir, "unsettled_override", {"call_id": call.call_id, "reason": reason})
    importer.run_import(path=run_dir)
    out = tmp_path / "export"
    call_command("export_evidence", run_dir.name, "--out", str(out))
    [event] = [e for e in json.loads((out / "evidence.json").read_bytes())["events"]
               if e["payload"].get("reason") is not None]  # fmt: skip
    assert protocol.is_redaction_marker(event["payload"]["reason"])
    assert verify_export(out, run_dir) == []
