"""Runs written by the seed article's own code, and by this project before it recorded the formula.

A run whose steer.json records no call_id formula was written to the seed article (its steer.json
holds the contract alone): its formula is the article's, call-id-v1. The writer read such runs as
call-id-v2, never found their receipts, and sent the message again. tests/data/seed-run/ was
written by the article's code as the article prints it (tests/seed_article.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest

from receipts import protocol, runtime
from receipts.demo import run_writer
from tests.helpers import CONTRACT, data_path
from tests.seed_article import MESSAGE_ARGS, PATCH_ARGS, make_call_id, write_seed_run
from tests.writer import cli_call, outbox_lines, receipt_of

MESSAGE = {"to": "ops@example.com", "body": "a new message, after the article's"}


@pytest.fixture
def seed_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(data_path("seed-run"), tmp_path / "demo-001"))


class ApplyPatch:
    """The article's own tool, counted."""

    name: ClassVar[str] = "apply_patch"
    version: ClassVar[str] = "1.0.0"

    def __init__(self) -> None:
        self.executions = 0

    def normalise(self, args: Any) -> dict[str, Any]:
        return dict(args)

    def execute(self, run_dir: Path, args: Any, call_id: str) -> dict[str, Any]:
        self.executions += 1
        return {"patched": args["path"]}


def test_the_fixture_is_what_the_articles_code_writes(tmp_path):
    written = write_seed_run(tmp_path / "again")
    stored = data_path("seed-run")
    names = sorted(str(path.relative_to(stored)) for path in stored.rglob("*") if path.is_file())
    assert names == sorted(str(path.relative_to(written)) for path in written.rglob("*") if path.is_file())
    assert all((stored / name).read_bytes() == (written / name).read_bytes() for name in names)


def test_the_articles_committed_message_is_not_sent_again(seed_run):
    """Its receipt says committed with no output digest: a person decides, and nothing is sent."""
    completed = cli_call(seed_run, "send_message", MESSAGE_ARGS, None)
    assert completed.returncode == 4, completed.stderr
    output = json.loads(completed.stdout)
    assert output["call_id"] == make_call_id(json.loads((seed_run / "steer.json").read_bytes())["contract_sha256"],
                                             2, "send_message", MESSAGE_ARGS)  # fmt: skip
    assert outbox_lines(seed_run) == []
    named = cli_call(seed_run, "send_message", MESSAGE_ARGS, None, "--identity", "call-id-v1")
    assert named.returncode == 4 and outbox_lines(seed_run) == [], "the run's own formula is not refused"


def test_the_articles_own_tool_is_not_run_again_through_the_api(seed_run):
    tool = ApplyPatch()
    outcome = runtime.Executor(seed_run, {tool.name: tool}).call(tool.name, PATCH_ARGS)
    assert tool.executions == 0 and outcome.needs == "confirmation"
    receipt = receipt_of(seed_run, outcome.call_id)
    assert receipt["status"] == "committed" and set(receipt) == {"call_id", "status", "tool", "args"}


def test_a_new_call_in_the_articles_run_is_made_under_its_formula(seed_run):
    assert MESSAGE != MESSAGE_ARGS
    completed = cli_call(seed_run, "send_message", MESSAGE, None)
    assert completed.returncode == 0, completed.stderr
    call_id = json.loads(completed.stdout)["call_id"]
    contract = json.loads((seed_run / "steer.json").read_bytes())["contract_sha256"]
    assert call_id == make_call_id(contract, 2, "send_message", MESSAGE) and len(outbox_lines(seed_run)) == 1
    assert receipt_of(seed_run, call_id)["identity"] == protocol.IDENTITY_V1
    assert cli_call(seed_run, "send_message", MESSAGE, None).returncode == 0 and len(outbox_lines(seed_run)) == 1


def test_a_run_this_project_wrote_before_it_recorded_the_formula_is_still_read(tmp_path):
    """Its receipts are call-id-v2 and say so: found under that formula, reused, never sent again."""
    run_dir = tmp_path / "older"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    first = cli_call(run_dir, "send_message", MESSAGE, None)
    assert (
        first.returncode == 0 and receipt_of(run_dir, json.loads(first.stdout)["call_id"])["identity"] == "call-id-v2"
    )
    steer = json.loads((run_dir / "steer.json").read_bytes())
    del steer["identity"]
    (run_dir / "steer.json").write_text(json.dumps(steer))

    again = cli_call(run_dir, "send_message", MESSAGE, None)
    assert again.returncode == 0 and json.loads(again.stdout)["reused"] is True
    assert json.loads(again.stdout)["call_id"] == json.loads(first.stdout)["call_id"]
    assert len(outbox_lines(run_dir)) == 1
    # A new intent in it is made under the seed's formula, which the run records none of.
    other = cli_call(run_dir, "send_message", {"to": "ops@example.com", "body": "a second one"}, None)
    assert other.returncode == 0
    assert receipt_of(run_dir, json.loads(other.stdout)["call_id"])["identity"] == "call-id-v1"
    assert run_writer("replay", str(run_dir), "--json").returncode == 0
