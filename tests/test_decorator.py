"""``@receipted``: a plain function as a receipted tool, through the writer's one code path."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import threading
import typing
from pathlib import Path
from typing import Any

import pytest

from receipts import CallInDoubt, NoRunBound, protocol, receipted, runtime, use_run
from receipts.demo import writer_env
from receipts.tools import OutcomeUnknown, Rejected
from tests import adapter_children
from tests.adapter_children import INVOICE, create_invoice, create_invoice_unqueried, effect_lines
from tests.helpers import CONTRACT, PROJECT


@pytest.fixture(autouse=True)
def effects(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "billing.jsonl"  # the billing side: outside the run directory
    monkeypatch.setenv("EFFECTS_FILE", str(path))
    return path


def test_the_call_id_is_the_executors_for_the_same_tool_version_and_args(run_dir):
    class HandWritten:
        name, version = "create_invoice", "1.0.0"

        def normalise(self, args):
            return dict(args)

        def execute(self, run_dir, args, call_id):
            return {"returned": None}

    outcome = create_invoice.call_in(run_dir, "acme", amount_cents=1200)
    expected = protocol.make_call_id(CONTRACT, 1, "create_invoice", INVOICE, "1.0.0", protocol.IDENTITY_V2)
    assert outcome.call_id == expected
    assert create_invoice.arguments("acme", 1200) == INVOICE  # positional or by name: one identity
    other_run = run_dir.parent / "run-2"
    runtime.run_init(other_run, contract_sha256=CONTRACT)
    assert (
        runtime.Executor(other_run, {"create_invoice": HandWritten()}).call("create_invoice", INVOICE).call_id
        == expected
    )
    receipt = json.loads((run_dir / "receipts" / f"{expected}.json").read_text())
    assert (receipt["tool"], receipt["tool_version"], receipt["args"]) == ("create_invoice", "1.0.0", INVOICE)
    assert receipt["result"] == {"returned": {"invoice": f"inv-{expected[:12]}", "amount_cents": 1200}}
    [line] = effect_lines()
    assert line["call_id"] == expected, "the function got the call_id to pass on as its idempotency key"


def test_defaults_are_part_of_the_identity(run_dir):
    @receipted(version="2")
    def notify(to: str, urgent: bool = False, *, call_id: str) -> str:
        return f"{to}:{urgent}"

    with use_run(run_dir):
        assert notify("ops") == "ops:False"
    assert notify.call_in(run_dir, "ops", urgent=False).reused
    assert not notify.call_in(run_dir, "ops", urgent=True).reused


def test_frameworks_see_the_function_without_call_id():
    """What an agent framework introspects to build a function tool's schema and description."""
    signature = inspect.signature(create_invoice)  # its module postpones annotations: evaluated for the framework
    assert str(signature) == "(customer: str, amount_cents: int) -> dict[str, typing.Any]"
    assert typing.get_type_hints(create_invoice) == {"customer": str, "amount_cents": int, "return": dict[str, Any]}
    assert inspect.isfunction(create_invoice) and create_invoice.__name__ == "create_invoice"
    assert create_invoice.__doc__ == "Bill a customer (the call_id is the billing side's idempotency key)."
    assert "call_id" in inspect.signature(create_invoice.__wrapped__).parameters
    assert create_invoice.__module__ == "tests.adapter_children"


def test_a_second_call_returns_the_recorded_answer_and_never_runs_the_function_again(run_dir):
    with use_run(run_dir):
        first = create_invoice("acme", 1200)
        again = create_invoice(customer="acme", amount_cents=1200)
    assert first == again == {"invoice": first["invoice"], "amount_cents": 1200}
    assert len(effect_lines()) == 1


def test_a_retry_after_a_lost_answer_asks_the_target_and_reuses(run_dir, effects):
    lost = {"once": True}

    @receipted(name="create_invoice", version="1.0.0", query=adapter_children.find_invoice)
    def flaky(customer: str, amount_cents: int, *, call_id: str) -> dict:
        answer = adapter_children._bill(customer, amount_cents, call_id)
        if lost.pop("once", False):
            raise TimeoutError("the billing side's answer never came")
        return answer

    with use_run(run_dir), pytest.raises(CallInDoubt) as in_doubt:
        flaky("acme", 1200)
    assert in_doubt.value.outcome.status == "unknown" and isinstance(in_doubt.value, OutcomeUnknown)
    with use_run(run_dir):
        answer = flaky("acme", 1200)
    [line] = effect_lines()
    assert answer == {"invoice": line["invoice"], "amount_cents": 1200}
    outcome = flaky.call_in(run_dir, "acme", 1200)
    assert outcome.reused and outcome.status == "committed"


def test_without_a_query_a_lost_answer_waits_for_a_person(run_dir):
    @receipted(version="1")
    def charge(amount: int, *, call_id: str) -> dict:
        adapter_children._bill("acme", amount, call_id)
        raise OutcomeUnknown("timed out after sending")

    with use_run(run_dir):
        for _ in range(2):
            with pytest.raises(CallInDoubt) as in_doubt:
                charge(5)
            assert in_doubt.value.outcome.needs == "confirmation"
    assert len(effect_lines()) == 1


def test_rejected_keeps_its_meaning_and_its_kind(run_dir):
    @receipted(version="1")
    def refuse(amount: int, *, call_id: str) -> None:
        raise Rejected("over the limit", kind="retryable")

    with use_run(run_dir), pytest.raises(Rejected) as rejected:
        refuse(10**9)
    assert rejected.value.kind == "retryable" and "over the limit" in str(rejected.value)
    outcome = refuse.call_in(run_dir, 10**9)
    assert outcome.status == "rejected" and outcome.error == {"kind": "retryable", "message": "over the limit"}


def test_args_and_answers_that_are_not_json_are_refused_or_in_doubt(run_dir):
    @receipted(version="1")
    def store(value: Any, *, call_id: str) -> Any:
        return object() if value == "odd" else value

    with pytest.raises(ValueError, match="an argument of store is not JSON"):
        store.call_in(run_dir, {1, 2})  # no call_id can be computed: no receipt
    assert not list((run_dir / "receipts").glob("*.json"))
    odd = store.call_in(run_dir, "odd")
    assert odd.status == "unknown" and "not JSON" in (odd.error or {})["message"]
    assert store.call_in(run_dir, (1, 2)).result == {"returned": [1, 2]}


def test_a_function_must_take_call_id_by_keyword_and_name_its_arguments():
    with pytest.raises(TypeError, match="keyword-only argument `call_id`"):
        receipted(version="1")(lambda amount: None)
    with pytest.raises(TypeError, match="recorded by name"):

        @receipted(version="1")
        def positional(amount: int, /, *, call_id: str) -> None: ...


def test_a_call_with_no_run_bound_says_so():
    with pytest.raises(NoRunBound, match="use_run"):
        create_invoice("acme", 1200)


def test_concurrent_runs_in_threads_do_not_mix(tmp_path):
    runs = [tmp_path / f"run-{n}" for n in range(4)]
    for n, run in enumerate(runs):
        runtime.run_init(run, contract_sha256=protocol.sha256_hex(f"contract {n}".encode()))
    barrier, seen, errors = threading.Barrier(len(runs) + 1), {}, []

    def agent(run: Path) -> None:
        with use_run(run):
            barrier.wait()
            try:
                seen[run] = create_invoice("acme", 1200)
                inner = threading.Thread(target=lambda: errors.append(_no_binding()))
                inner.start()
                inner.join()
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

    threads = [threading.Thread(target=agent, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    barrier.wait()
    for thread in threads:
        thread.join()
    assert all(isinstance(error, NoRunBound) for error in errors) and len(errors) == len(runs)
    for run in runs:
        [receipt] = (run / "receipts").glob("*.json")
        assert seen[run]["invoice"] == f"inv-{receipt.stem[:12]}", "each thread's call went to its own run"
    assert len({line["call_id"] for line in effect_lines()}) == len(runs)


def test_asyncio_tasks_and_to_thread_carry_the_binding(run_dir):
    """What an async agent framework does with a sync tool: run it in the loop, or in asyncio.to_thread."""
    import asyncio

    async def agent() -> list:
        in_task = await asyncio.create_task(asyncio.to_thread(create_invoice, "acme", 1200))
        return [create_invoice("acme", 1200), in_task]

    with use_run(run_dir):
        answers = asyncio.run(agent())
    assert answers[0] == answers[1] and len(effect_lines()) == 1


def _no_binding() -> Exception | None:
    """A new thread starts with no run bound, whatever its parent had."""
    try:
        create_invoice("acme", 1200)
    except NoRunBound as error:
        return error
    return None


def child(run_dir: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.adapter_children", "invoice", str(run_dir), *extra]
    environment = writer_env(**env)
    environment["PYTHONPATH"] = f"{PROJECT}:{environment['PYTHONPATH']}"
    return subprocess.run(command, env=environment, capture_output=True, text=True, check=False, cwd=PROJECT)


FAILPOINTS = ["after_prepared_temp", "after_prepared", "after_effect", "after_temp_receipt", "after_commit_rename"]


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_killed_at_a_failpoint_and_resumed_the_function_runs_once(run_dir, effects, failpoint):
    killed = child(run_dir, EFFECTS_FILE=str(effects), RECEIPTS_FAILPOINT=failpoint)
    assert killed.returncode == 137, killed.stderr
    resumed = child(run_dir, EFFECTS_FILE=str(effects))
    assert resumed.returncode == 0, resumed.stderr
    outcome = json.loads(resumed.stdout)
    assert outcome["status"] == "committed" and not outcome.get("needs")
    [line] = effect_lines()  # the function ran exactly once, whether the kill came before or after it
    assert outcome["result"] == {"returned": {"invoice": line["invoice"], "amount_cents": 1200}}
    assert json.loads(child(run_dir, EFFECTS_FILE=str(effects)).stdout)["reused"] is True
    assert len(effect_lines()) == 1


@pytest.mark.parametrize(("failpoint", "runs", "needs"), [("after_prepared", 0, "confirmation"),
                                                          ("after_effect", 1, "confirmation"),
                                                          ("after_temp_receipt", 1, None)])  # fmt: skip
def test_killed_without_a_query_it_runs_at_most_once(run_dir, effects, failpoint, runs, needs):
    """No query: a call the kill left in doubt waits for a person rather than run the function again."""
    assert child(run_dir, "--unqueried", EFFECTS_FILE=str(effects), RECEIPTS_FAILPOINT=failpoint).returncode == 137
    resumed = child(run_dir, "--unqueried", EFFECTS_FILE=str(effects))
    assert json.loads(resumed.stdout).get("needs") == needs, resumed.stdout
    assert len(effect_lines()) == runs
    assert create_invoice_unqueried.adapter.query is None
