"""The conformance kit (``callproof conformance``), run as a user runs it: the real command, real children.

The built-in tools pass it; each broken tracker of tests/broken_adapters.py fails
the check that names its fault, with exit 6; a tracker that keeps the promises
passes, so that the failures are the faults' and not the kit's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from receipts import protocol, runtime
from receipts.conformance import CHECKS, NEEDS_A_PERSON, count_outbox_lines
from receipts.crashes import call_window, kill_at_failpoint
from receipts.demo import writer_command, writer_env
from tests.helpers import PROJECT

pytestmark = pytest.mark.slow
COUNT_TICKETS = "tests.broken_adapters:count_tickets"


def kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m receipts conformance ARGS`` from the checkout (where ``tests`` imports), scratch under tmp_path."""
    return subprocess.run(
        writer_command("conformance", *args),
        capture_output=True,
        text=True,
        cwd=PROJECT,
        env=writer_env(TMPDIR=str(tmp_path)),
        check=False,
    )


def verdicts(completed: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert "Traceback" not in completed.stderr, completed.stderr
    report = json.loads(completed.stdout)
    assert [check["name"] for check in report["checks"]] == list(CHECKS)
    return {check["name"]: check["verdict"] for check in report["checks"]}


def test_write_file_passes_every_check(tmp_path):
    completed = kit(tmp_path, "receipts.tools:WriteFile", "--trials", "6", "--json")
    assert completed.returncode == 0, completed.stdout
    assert set(verdicts(completed).values()) == {"pass"}
    [kills] = [check for check in json.loads(completed.stdout)["checks"] if check["name"] == "random_kills"]
    # The first six trials begin with a kill at each failpoint in turn: the effect done, its receipt not yet.
    for window in ("effect_done_receipt_prepared", "temp_receipt_committed", "committed_without_event"):
        assert window in kills["evidence"], kills["evidence"]
    assert list(tmp_path.iterdir()) == [], "a passing kit leaves no scratch run behind"


def test_send_message_passes_what_applies_and_leaves_the_rest_to_a_person(tmp_path):
    completed = kit(
        tmp_path, "receipts.tools:SendMessage", "--trials", "6", "--counter",
        "receipts.conformance:count_outbox_lines", "--json",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout
    found = verdicts(completed)
    assert found.pop("idempotency_key") == found.pop("query_answers_truly") == NEEDS_A_PERSON
    assert set(found.values()) == {"pass"}


def test_the_table_names_each_check_and_its_verdict(tmp_path):
    completed = kit(tmp_path, "receipts.tools:SendMessage", "--trials", "0", "--concurrency", "3")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == (
        "send_message 1.0.0 (receipts.tools:SendMessage): not queryable (a call in doubt waits for a person)"
    )
    assert lines[1].startswith("effects counted by the adapter's evidence")
    rows = {line.split()[0]: line for line in lines[4:12]}
    assert list(rows) == list(CHECKS)
    assert rows["concurrency"].split()[1] == "PASS" and "3 processes at once" in rows["concurrency"]
    assert NEEDS_A_PERSON in rows["idempotency_key"]
    assert lines[-1] == "5 passed, 0 failed, 3 not applicable"


def test_a_tracker_that_keeps_the_promises_passes_through_a_factory(tmp_path):
    completed = kit(tmp_path, "tests.broken_adapters:tickets_factory", "--counter", COUNT_TICKETS, "--trials", "6",
                    "--concurrency", "4", "--json")  # fmt: skip
    assert completed.returncode == 0, completed.stdout
    assert set(verdicts(completed).values()) == {"pass"}


@pytest.mark.parametrize(
    ("adapter", "failing"),
    [
        # Its query files the ticket again: the restart after a lost response makes a second one.
        ("ReExecutesOnResume", {"restart_after_lost_response", "query_answers_truly", "resume_original_identity"}),
        # No idempotency key: the same call_id twice files two tickets. The writer's resumes pass.
        ("IgnoresCallId", {"idempotency_key"}),
        # "Did not happen" without looking: nothing doubles (its execute dedupes), and still it is caught.
        ("NotDoneWithoutEvidence", {"query_answers_truly"}),
        # Its normalise differs in each process: every process computes its own call_id for one intent.
        (
            "StampsTheArgs",
            {
                "restart_after_lost_response",
                "same_request_reuse",
                "identity_mismatch",
                "concurrency",
                "resume_original_identity",
            },
        ),
    ],
)
def test_each_broken_tracker_fails_the_check_that_names_its_fault(tmp_path, adapter, failing):
    completed = kit(tmp_path, f"tests.broken_adapters:{adapter}", "--counter", COUNT_TICKETS, "--trials", "0",
                    "--concurrency", "3", "--json")  # fmt: skip
    assert completed.returncode == 6
    found = verdicts(completed)
    assert {name for name, verdict in found.items() if verdict == "fail"} == failing
    report = json.loads(completed.stdout)
    assert report["passed"] is False
    kept = Path(report["run_directories"])
    assert kept.parent == tmp_path and any(kept.iterdir()), "a failing kit keeps its run directories"


def test_a_broken_tracker_is_caught_by_random_kills_too(tmp_path):
    """A kill after the effect, then a resume that asks the query: it files a second ticket."""
    completed = kit(tmp_path, "tests.broken_adapters:ReExecutesOnResume", "--counter", COUNT_TICKETS,
                    "--trials", "3", "--concurrency", "2", "--seed", "1", "--json")  # fmt: skip
    assert completed.returncode == 6
    [kills] = [check for check in json.loads(completed.stdout)["checks"] if check["name"] == "random_kills"]
    assert kills["verdict"] == "fail" and "2 effects" in kills["evidence"], kills


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["nowhere.module:Adapter"], "the adapter: cannot import 'nowhere.module': ModuleNotFoundError"),
        (["receipts.tools"], "the adapter must be MODULE:NAME"),
        (["receipts.tools:Nothing"], "has no 'Nothing'"),
        (["receipts.tools:Evidence"], "needs arguments: name an instance or a zero-argument factory"),
        (["receipts.tools:short_text"], "needs arguments"),
        (["receipts.protocol:IDENTITY_V2"], "is not an adapter"),
        (["tests.test_doubt:TicketTool"], "cannot import 'tests.test_doubt': AppRegistryNotReady"),
        (["tests.broken_adapters:Blind"], "the kit needs the args of one call of blind_ticket"),
        (["tests.broken_adapters:Blind", "--args", '{"title": "x"}'], "nothing counts blind_ticket's effects"),
        (["receipts.tools:WriteFile", "--args", "[1]"], "--args must be a JSON object"),
        (["receipts.tools:WriteFile", "--args", '{"path": 1}'], "write_file refuses the args"),
        (["receipts.tools:WriteFile", "--counter", "receipts.tools:PRESENT"], "is not callable"),
    ],
)
def test_what_the_kit_cannot_run_is_said_in_one_line(tmp_path, args, said):
    completed = kit(tmp_path, *args)
    assert completed.returncode == 1, completed
    assert said in completed.stderr and "Traceback" not in completed.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_failpoint_can_stop_the_writer_for_a_real_sigkill_there(run_dir):
    """``RECEIPTS_FAILPOINT=NAME:stop``: the writer stops itself there, and the harness kills it with SIGKILL."""
    args = {"to": "ops@example.com", "body": "once"}
    child = subprocess.Popen(
        writer_command("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(args)),
        stdout=subprocess.DEVNULL,
        env=writer_env(RECEIPTS_FAILPOINT="after_effect:stop"),
    )
    assert kill_at_failpoint(child, 60) == "killed"
    assert child.returncode == -signal.SIGKILL
    adapter = runtime.BUILTIN_ADAPTERS["send_message"]
    call_id = protocol.make_call_id(
        runtime.run_contract(run_dir), 1, "send_message", adapter.normalise(args), "1.0.0", protocol.IDENTITY_V2
    )
    assert count_outbox_lines(run_dir, args, call_id) == 1
    assert call_window(run_dir, call_id, {child.pid}, lambda: True) == "effect_done_receipt_prepared"
    # A writer that passes no failpoint (a reuse of the commit) ends on its own; the harness says so.
    subprocess.run(writer_command("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(args)),
                   env=writer_env(), capture_output=True, check=False)  # fmt: skip
    assert (run_dir / "receipts" / f"{call_id}.json").exists()
    again = subprocess.Popen(
        writer_command("replay", str(run_dir)), stdout=subprocess.DEVNULL,
        env=writer_env(RECEIPTS_FAILPOINT="after_effect:stop"),
    )  # fmt: skip
    assert kill_at_failpoint(again, 60) == "exited" and again.returncode == 0


def test_the_kit_runs_as_the_installed_command_from_any_folder(tmp_path):
    """``callproof`` is a console script: its path starts at its own folder, not the current one."""
    script = Path(sys.executable).parent / "callproof"
    if not script.exists():
        pytest.skip("no callproof script beside this Python (the checkout is not installed)")
    module = tmp_path / "my_tool.py"
    module.write_text("from receipts.tools import WriteFile\n\ndef make():\n    return WriteFile()\n")
    completed = subprocess.run(
        [str(script), "conformance", "my_tool:make", "--trials", "0", "--concurrency", "2", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)}, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["tool"] == "write_file"


def guide_section(title: str) -> str:
    guide = (PROJECT / "docs" / "runtime-authors.md").read_text(encoding="utf-8")
    return guide.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_guides_example_runs_as_it_stands(tmp_path):
    """docs/runtime-authors.md, "The conformance kit": the module and the two commands, in an empty folder."""
    section = guide_section("The conformance kit")
    [module] = re.findall(r"```python\n# my_tickets.py\n(.*?)```", section, re.DOTALL)
    [commands] = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    (tmp_path / "my_tickets.py").write_text(module)
    for line in commands.splitlines():
        assert line.startswith("callproof conformance ")
        completed = subprocess.run(
            [sys.executable, "-m", "receipts", *shlex.split(line)[1:]], capture_output=True, text=True,
            cwd=tmp_path, env=writer_env(TMPDIR=str(tmp_path)), check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stdout + completed.stderr
        if "--json" in line:
            assert json.loads(completed.stdout)["passed"] is True
        else:
            assert completed.stdout.splitlines()[-1] == "8 passed, 0 failed, 0 not applicable"


def test_the_sql_row_adapter_passes_every_check(tmp_path):
    """The kit against receipts.adapters.sql on a real SQLite file, counted by its own evidence."""
    database = tmp_path / "rows.sqlite3"
    completed = subprocess.run(
        writer_command("conformance", "receipts.adapters.sql:sqlite_factory", "--trials", "4", "--json",
                       "--args", json.dumps({"title": "deploy", "body": "v2 is out"})),
        capture_output=True, text=True, cwd=PROJECT, check=False,
        env=writer_env(TMPDIR=str(tmp_path), CALLPROOF_SQL_SQLITE=str(database)),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert set(verdicts(completed).values()) == {"pass"}


def test_the_http_adapter_passes_every_check_against_an_idempotent_service(tmp_path):
    """The kit against receipts.adapters.http and the Stripe-like service on 127.0.0.1, looked up by key."""
    from tests.idempotent_service import Service

    with Service() as service:
        completed = subprocess.run(
            writer_command("conformance", "receipts.adapters.http:http_factory", "--trials", "4", "--json",
                           "--args", json.dumps({"amount": 4000, "currency": "eur"})),
            capture_output=True, text=True, cwd=PROJECT, check=False,
            env=writer_env(TMPDIR=str(tmp_path), CALLPROOF_HTTP_URL=f"{service.url}/v1/charges",
                           CALLPROOF_HTTP_LOOKUP_URL=f"{service.url}/v1/charges?idempotency_key={{call_id}}"),
        )  # fmt: skip
        charged_keys = [charge["idempotency_key"] for charge in service.charges]
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert set(verdicts(completed).values()) == {"pass"}
    assert len(charged_keys) == len(set(charged_keys)), "one charge a call_id, whatever the kills"
