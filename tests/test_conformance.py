"""The conformance kit (``callproof conformance``), run as a user runs it: the real command, real children.

The built-in tools pass it; each broken tracker of tests/broken_adapters.py fails
the check that names its fault, with exit 6; a tracker that keeps the promises
passes, so that the failures are the faults' and not the kit's.
"""

from __future__ import annotations

import datetime as dt
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
from receipts.conformance import CHECKS, NEEDS_A_PERSON, NOT_APPLICABLE, count_outbox_lines
from receipts.crashes import call_window, kill_at_failpoint
from receipts.demo import writer_command, writer_env
from tests.broken_adapters import FORGETS_AFTER
from tests.helpers import PROJECT

pytestmark = pytest.mark.slow
COUNT_TICKETS = "tests.broken_adapters:count_tickets"


def kit(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m receipts conformance ARGS`` from the checkout (where ``tests`` imports), scratch under tmp_path."""
    return subprocess.run(
        writer_command("conformance", *args),
        capture_output=True,
        text=True,
        cwd=PROJECT,
        env=writer_env(TMPDIR=str(tmp_path), **env),
        check=False,
    )


def mid_hour() -> str:
    """Half past the hour before this one: the writer's clock fixed there (``RECEIPTS_CLOCK``) stays in one
    hour however long a kit runs, and only the kit's moves of it cross one."""
    now = protocol.utc_now().replace(minute=0, second=0, microsecond=0)
    return protocol.format_time(now - dt.timedelta(minutes=30))


def verdicts(completed: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert "Traceback" not in completed.stderr, completed.stderr
    report = json.loads(completed.stdout)
    assert [check["name"] for check in report["checks"]] == list(CHECKS)
    return {check["name"]: check["verdict"] for check in report["checks"]}


def passed_or(found: dict[str, str], **others: str) -> None:
    """Every check passed but those named, which had the verdict given."""
    assert {name: verdict for name, verdict in found.items() if verdict != "pass"} == others


def test_write_file_passes_every_check(tmp_path):
    completed = kit(tmp_path, "receipts.tools:WriteFile", "--trials", "6", "--key-wait", "1", "--json")
    assert completed.returncode == 0, completed.stdout
    # Its evidence is its counter; no args make its target fail, and no break_target(); it keeps files for ever.
    passed_or(verdicts(completed), evidence_matches_target=NOT_APPLICABLE, failing_target=NOT_APPLICABLE,
              past_key_retention=NOT_APPLICABLE)  # fmt: skip
    checks = {check["name"]: check["evidence"] for check in json.loads(completed.stdout)["checks"]}
    assert checks["failing_target"].startswith("skipped: nothing makes the target fail"), checks["failing_target"]
    # Keys kept for ever: the clock moved on as far as the kit moves it, and a real second's wait.
    assert "(RECEIPTS_CLOCK) a minute, an hour, a day, 32 days" in checks["keys_kept"], checks["keys_kept"]
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
    passed_or(verdicts(completed), idempotency_key=NEEDS_A_PERSON, query_answers_truly=NEEDS_A_PERSON,
              keys_kept=NEEDS_A_PERSON, past_key_retention=NEEDS_A_PERSON, failing_target=NOT_APPLICABLE)  # fmt: skip


def test_the_table_names_each_check_and_its_verdict(tmp_path):
    completed = kit(tmp_path, "receipts.tools:SendMessage", "--trials", "0", "--concurrency", "3")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == (
        "send_message 1.0.0 (receipts.tools:SendMessage): not queryable (a call in doubt waits for a person)"
    )
    assert lines[1].startswith("effects counted by the adapter's evidence")
    rows = {line.split()[0]: line for line in lines[4 : 4 + len(CHECKS)]}
    assert list(rows) == list(CHECKS)
    assert rows["concurrency"].split()[1] == "PASS" and "3 processes at once" in rows["concurrency"]
    assert NEEDS_A_PERSON in rows["idempotency_key"]
    assert lines[-1] == "7 passed, 0 failed, 7 not applicable"


def test_a_tracker_that_keeps_the_promises_passes_through_a_factory(tmp_path):
    completed = kit(tmp_path, "tests.broken_adapters:tickets_factory", "--counter", COUNT_TICKETS, "--trials", "6",
                    "--concurrency", "4", "--key-wait", "2", "--json")  # fmt: skip
    assert completed.returncode == 0, completed.stdout
    # It declares no key retention: it keeps keys for ever (keys_kept waited to see).
    passed_or(verdicts(completed), past_key_retention=NOT_APPLICABLE)


@pytest.mark.parametrize(
    ("adapter", "failing"),
    [
        # Its query files the ticket again: the restart after a lost response makes a second one, and
        # every check that asks the query sees it.
        (
            "ReExecutesOnResume",
            {
                "restart_after_lost_response",
                "query_answers_truly",
                "resume_original_identity",
                "calls_kept_apart",
                "keys_kept",
            },
        ),
        # No idempotency key: the same call_id twice files two tickets, at once or after a wait.
        ("IgnoresCallId", {"idempotency_key", "keys_kept"}),
        # "Did not happen" without looking: nothing doubles (its execute dedupes), and still it is caught.
        ("NotDoneWithoutEvidence", {"query_answers_truly", "keys_kept"}),
        # Its normalise differs in each process: every process computes its own call_id for one intent.
        (
            "StampsTheArgs",
            {
                "restart_after_lost_response",
                "same_request_reuse",
                "identity_mismatch",
                "concurrency",
                "resume_original_identity",
                "calls_kept_apart",
                "normalise_in_general",
                # the call again once break_target() is gone commits, under a call_id of its own process
                "failing_target",
            },
        ),
        # "Done" when the tracker holds any ticket: right for the one call of a fresh run, wrong beside others.
        ("FoundIfAnyTicket", {"calls_kept_apart"}),
        # Keys cut to 16 characters: two call_ids that begin alike are one ticket.
        ("KeyedOnAPrefix", {"calls_kept_apart"}),
        # Evidence that says "present" without looking: the writer would reuse a commit the target lost.
        ("PresentWithoutLooking", {"evidence_matches_target"}),
        # The tracker refuses, and execute returns a result anyway: committed with no ticket.
        ("SwallowsFailure", {"failing_target"}),
        # The same, with no failing args named: the kit breaks the tracker by its break_target().
        ("SwallowsOutages", {"failing_target"}),
        # A query by a title's beginning: a call whose title begins another's finds that other's ticket.
        ("FindsByTitlePrefix", {"calls_kept_apart"}),
        # A key stamped with the hour: the kit moves the clock (RECEIPTS_CLOCK, fixed mid-hour here).
        ("KeyedByTheHour", {"keys_kept"}),
        # Idempotency keys forgotten after a second (the ticket stays), though it declares none forgotten.
        ("ForgetsKeys", {"keys_kept"}),
        # It declares keys kept an hour, and past that still takes "not found" for "not done".
        ("IgnoresItsRetention", {"past_key_retention"}),
        # Stable on the example ("Fix login"), not on "Fix login   2" (folds a run of spaces one at a time).
        ("NormalisesTwiceDifferently", {"normalise_in_general"}),
        ("DrawnNormalisesTwiceDifferently", {"normalise_in_general"}),
    ],
)
def test_each_broken_tracker_fails_the_check_that_names_its_fault(tmp_path, adapter, failing):
    # keys_kept sleeps the whole wait. Only ForgetsKeys's fault needs time to show (it forgets a key
    # FORGETS_AFTER after filing it); every other tracker keeps its keys, or never keys on the call_id.
    key_wait = 1.5 * FORGETS_AFTER if adapter == "ForgetsKeys" else 0.1
    # The writer's clock fixed for KeyedByTheHour: a kit run across the top of an hour would see its fault
    # in more checks than the one that moves the clock.
    env = {"RECEIPTS_CLOCK": mid_hour()} if adapter == "KeyedByTheHour" else {}
    completed = kit(tmp_path, f"tests.broken_adapters:{adapter}", "--counter", COUNT_TICKETS, "--trials", "0",
                    "--concurrency", "3", "--key-wait", str(key_wait), "--seed", "1", "--json", **env)  # fmt: skip
    assert completed.returncode == 6
    found = verdicts(completed)
    assert {name for name, verdict in found.items() if verdict == "fail"} == failing
    report = json.loads(completed.stdout)
    assert report["passed"] is False
    kept = Path(report["run_directories"])
    assert kept.parent == tmp_path and any(kept.iterdir()), "a failing kit keeps its run directories"


def test_a_dedupe_that_lags_is_caught_by_a_retry_at_once(tmp_path):
    """DedupeLags knows a key DEDUPE_LAG after the ticket is filed: less than a new process takes to
    start, so a retry from a new process finds the first ticket, and one at once in the same process
    files a second. (On a machine that starts a process faster than that, keys_kept, whose moves of the
    clock follow the effect in a new process, may catch it too.)"""
    completed = kit(tmp_path, "tests.broken_adapters:DedupeLags", "--counter", COUNT_TICKETS, "--trials", "0",
                    "--concurrency", "3", "--key-wait", "0", "--seed", "1", "--json")  # fmt: skip
    assert completed.returncode == 6
    found = verdicts(completed)
    failed = {name for name, verdict in found.items() if verdict == "fail"}
    assert "idempotency_key" in failed and failed <= {"idempotency_key", "keys_kept"}, failed
    [key] = [check for check in json.loads(completed.stdout)["checks"] if check["name"] == "idempotency_key"]
    assert "executed twice at once in one process" in key["evidence"] and "2 effects" in key["evidence"], key


def test_a_break_target_that_fails_is_said(tmp_path):
    """A break_target() that raises is the kit's finding, not a pass."""
    completed = kit(tmp_path, "tests.broken_adapters:UnbreakableTickets", "--counter", COUNT_TICKETS, "--trials",
                    "0", "--concurrency", "2", "--key-wait", "0", "--json")  # fmt: skip
    assert completed.returncode == 6
    failed = {name: verdict for name, verdict in verdicts(completed).items() if verdict == "fail"}
    assert failed == {"failing_target": "fail"}
    [failing] = [check for check in json.loads(completed.stdout)["checks"] if check["name"] == "failing_target"]
    assert "break_target() raised RuntimeError: no test tracker here" in failing["evidence"], failing


def test_a_broken_tracker_is_caught_by_random_kills_too(tmp_path):
    """A kill after the effect, then a resume that asks the query: it files a second ticket.
    (No wait for keys: keys_kept is not what this test is about, and the default waits 5 s.)"""
    completed = kit(tmp_path, "tests.broken_adapters:ReExecutesOnResume", "--counter", COUNT_TICKETS,
                    "--trials", "3", "--concurrency", "2", "--key-wait", "0", "--seed", "1", "--json")  # fmt: skip
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
        (
            ["tests.broken_adapters:unbuildable_factory"],
            "could not build the adapter: RuntimeError: TRACKER_URL is not set",
        ),
        (
            ["tests.broken_adapters:Tickets", "--failing-args", '{"title": 5}'],
            "file_ticket refuses the failing args {'title': 5} before the target sees them",
        ),
        (["tests.broken_adapters:Tickets", "--failing-args", "[]"], "--failing-args must be a JSON object"),
        (["tests.broken_adapters:NotAStrategy"], "args_strategy must be a hypothesis strategy, not a list"),
        (["receipts.tools:WriteFile", "--generated", "2"], "--generated must be from 3 to 1000"),
        (["receipts.tools:WriteFile", "--key-wait", "-1"], "--key-wait must be from 0 to 86400 seconds"),
        (["receipts.tools:WriteFile", "--key-wait", "nan"], "--key-wait must be from 0 to 86400 seconds"),
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
        [str(script), "conformance", "my_tool:make", "--trials", "0", "--concurrency", "2", "--key-wait", "0",
         "--json"],
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
            # No evidence to check against the counter; no key retention declared.
            assert completed.stdout.splitlines()[-1] == "12 passed, 0 failed, 2 not applicable"


def test_the_sql_row_adapter_passes_every_check(tmp_path):
    """The kit against receipts.adapters.sql on a real SQLite file, counted by its own evidence."""
    database = tmp_path / "rows.sqlite3"
    completed = subprocess.run(
        writer_command("conformance", "receipts.adapters.sql:sqlite_factory", "--trials", "4", "--key-wait", "1",
                       "--json", "--args", json.dumps({"title": "deploy", "body": "v2 is out"})),
        capture_output=True, text=True, cwd=PROJECT, check=False,
        env=writer_env(TMPDIR=str(tmp_path), CALLPROOF_SQL_SQLITE=str(database)),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # Its factory's break_target() takes the table away: the call fails, and is not committed.
    passed_or(verdicts(completed), evidence_matches_target=NOT_APPLICABLE, past_key_retention=NOT_APPLICABLE)
    [failing] = [check for check in json.loads(completed.stdout)["checks"] if check["name"] == "failing_target"]
    assert "no such table: notes" in failing["evidence"], failing


@pytest.mark.parametrize("lookup", [True, False], ids=["looked-up-by-key", "no-lookup"])
def test_the_http_adapter_passes_every_check_against_an_idempotent_service(tmp_path, lookup):
    """The kit against receipts.adapters.http and the Stripe-like service on 127.0.0.1, its charges
    counted by the service; with a lookup by key, and without one (a call in doubt waits for a person)."""
    from tests.idempotent_service import Service

    with Service() as service:
        env = {"CALLPROOF_HTTP_URL": f"{service.url}/v1/charges"}
        if lookup:
            env["CALLPROOF_HTTP_LOOKUP_URL"] = f"{service.url}/v1/charges?idempotency_key={{call_id}}"
        completed = subprocess.run(
            writer_command("conformance", "receipts.adapters.http:http_factory", "--trials", "4", "--json",
                           "--key-wait", "1", "--counter", "tests.idempotent_service:count_charges",
                           "--args", json.dumps({"amount": 4000, "currency": "eur"}),
                           "--failing-args", json.dumps({"amount": -5, "currency": "eur"})),
            capture_output=True, text=True, cwd=PROJECT, check=False, env=writer_env(TMPDIR=str(tmp_path), **env),
        )  # fmt: skip
        charged_keys = [charge["idempotency_key"] for charge in service.charges]
    assert completed.returncode == 0, completed.stdout + completed.stderr
    found = verdicts(completed)
    if lookup:
        # It declares the service's 24 h key retention: a call in doubt older than that waits for a person.
        passed_or(found)
        assert "(keys kept 24 h)" in completed.stdout
    else:
        passed_or(found, idempotency_key=NEEDS_A_PERSON, query_answers_truly=NEEDS_A_PERSON, keys_kept=NEEDS_A_PERSON,
                  past_key_retention=NEEDS_A_PERSON, evidence_matches_target=NOT_APPLICABLE)  # fmt: skip
    assert len(charged_keys) == len(set(charged_keys)), "one charge a call_id, whatever the kills"


def test_args_drawn_from_a_hypothesis_strategy_are_reported_as_such(tmp_path):
    completed = kit(tmp_path, "tests.broken_adapters:DrawnTickets", "--counter", COUNT_TICKETS, "--trials", "0",
                    "--concurrency", "2", "--key-wait", "0", "--generated", "20", "--json")  # fmt: skip
    assert completed.returncode == 0, completed.stdout
    report = json.loads(completed.stdout)
    [normalise] = [check for check in report["checks"] if check["name"] == "normalise_in_general"]
    assert normalise["evidence"].startswith("21 arg sets (the example's and drawn from the adapter's args_strategy)")


def test_args_that_begin_alike_begin_alike():
    from receipts.conformance.args import prefix_args

    example = {"title": "Fix login", "to": ["ops@example.com"], "amount": 4000, "refund": False}
    short, long = (prefix_args(example, 1, longer=longer) for longer in (False, True))
    assert short == {"title": "Fix login 1", "to": ["ops+1@example.com"], "amount": 4001, "refund": False}
    assert long == {"title": "Fix login 12", "to": ["ops+12@example.com"], "amount": 40012, "refund": False}


def test_derived_args_keep_an_e_mail_address_an_address_and_apart():
    from receipts.conformance import derive_args

    example = {"to": ["ops@example.com"], "subject": "Deployed"}
    derived = [derive_args(example, number) for number in range(1, 9)]
    addresses = [args["to"][0] for args in derived]
    assert all(re.fullmatch(r"[^\s@]+\+\d@[A-Za-z0-9.-]+", address) for address in addresses), addresses
    assert len({address.lower() for address in addresses}) == 8, "each set names its own mailbox"
    assert all(args["subject"] != "Deployed" for args in derived)
