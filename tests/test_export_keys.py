"""An npm token that is not alone: as an event's key, nested in its facts and among a fact's items.

The scanner's bare npm pattern wanted the token alone on both sides (``npm_`` and exactly 36
letters or digits, no letter or digit after): two tokens joined as one key, a token with a suffix
(``…v2``) or one glued to a word went out in clear, as keys and as values. Issue 55, case 10.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command

from evidence.export.redaction import Policy, clear, secret_kind
from evidence.ingest import importer
from receipts import durable, protocol, runtime
from receipts.reader.verify import verify_export
from tests.helpers import CONTRACT
from tests.test_evidence_export import HARMLESS, assert_nowhere, exported_texts

pytestmark = pytest.mark.django_db

# npm_ and 36 letters or digits, the shape npm issues, fake; no word that names a secret in them.
FIRST = "npm_" + ("CanaryJoinedOne" + "0123456789abcdefghijklmnopqrstuvwxyz")[:36]
SECOND = "npm_" + ("CanaryJoinedTwo" + "0123456789abcdefghijklmnopqrstuvwxyz")[:36]
# What an agent could write where a key goes; the bodies of the tokens are the canaries.
KEYS = {
    "two tokens joined, an event's key": FIRST + SECOND,
    "a token with a suffix, a key nested in a fact": FIRST + "v2",
    "a token glued to a word, an item of a fact's list": "deploy" + SECOND,
}
BODIES = {"first token": FIRST.removeprefix("npm_"), "second token": SECOND.removeprefix("npm_")}


@pytest.fixture
def keyed_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "keyed-run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    runtime.Executor(run_dir).call("write_file", {"path": "a.txt", "content": "hello"})
    glued = KEYS["a token glued to a word, an item of a fact's list"]
    durable.append_event(
        run_dir,
        "note",
        {
            KEYS["two tokens joined, an event's key"]: "x",
            "action": {KEYS["a token with a suffix, a key nested in a fact"]: "rotate"},
            "call_ids": [glued, {glued: 1}],
        },
    )
    importer.run_import(path=run_dir)
    return run_dir


def test_an_npm_token_not_alone_is_in_no_exported_byte_as_a_key_or_an_item(keyed_run, tmp_path):
    out = tmp_path / "export"
    call_command("export_evidence", "keyed-run", "--out", str(out))
    assert_nowhere(BODIES, exported_texts(out))
    assert verify_export(out, keyed_run) == []


def test_the_scanner_knows_a_token_that_is_not_alone_and_still_leaves_words_alone():
    policy = Policy()
    for where, text in KEYS.items():
        assert secret_kind(text, policy) == "npm token", where
        assert clear({text: 1}, policy) == {protocol.redacted(text)["redacted"]: 1}, where
    for value in HARMLESS:
        assert secret_kind(value, policy) is None, value
    for word in ("npm_install", "npm_config_registry", "npm_package_json_dependencies_lodash_version"):
        assert secret_kind(word, policy) is None, word
