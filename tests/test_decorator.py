"""``@receipted``: a plain function as a receipted tool, through the writer's one code path."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import enum
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
from receipts.tools import NOT_DONE, OutcomeUnknown, Rejected
from tests import adapter_children
from tests.adapter_children import INVOICE, create_invoice, create_invoice_unqueried, effect_lines
from tests.helpers import CONTRACT, PROJECT, until


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


def test_a_call_a_person_settled_as_done_is_never_in_doubt_again(run_dir):
    """Settled committed, the call raised CallInDoubt for ever: an agent told "a person decides"
    about a call a person had decided. With no answer on record it now says that, and is not
    in doubt."""
    from receipts import SettledWithoutAnswer

    @receipted(version="1")
    def charge(amount: int, *, call_id: str) -> dict:
        adapter_children._bill("acme", amount, call_id)
        raise OutcomeUnknown("timed out after sending")

    with use_run(run_dir), pytest.raises(CallInDoubt) as in_doubt:
        charge(5)
    call_id = in_doubt.value.outcome.call_id
    receipt_sha256 = protocol.sha256_hex((run_dir / "receipts" / f"{call_id}.json").read_bytes())
    runtime.confirm_call(
        run_dir, call_id, resolution="committed", reason="the ledger shows it", actor="dana",
        receipt_sha256=receipt_sha256,
    )  # fmt: skip
    with use_run(run_dir):
        for _ in range(2):
            with pytest.raises(SettledWithoutAnswer) as settled:
                charge(5)
            assert not isinstance(settled.value, CallInDoubt)
            assert "settled as done by a person" in str(settled.value)
    assert len(effect_lines()) == 1


def test_a_function_that_calls_itself_with_the_same_arguments_gets_a_clear_error(run_dir):
    """It waited for ever on its own call's lock. The inner call is refused; the outer one's
    function raised after it began, so what it did is a person's to decide, with the reason."""
    calls = []

    @receipted(version="1")
    def again_and_again(amount: int, *, call_id: str) -> int:
        calls.append(call_id)
        return again_and_again(amount)

    with use_run(run_dir), pytest.raises(CallInDoubt, match="calls itself with the same arguments"):
        again_and_again(5)
    assert len(calls) == 1


@pytest.mark.parametrize("kind", ["generator", "async generator"])
def test_a_generator_is_refused_when_decorated(kind):
    """Its body would run after the receipt said committed, or never."""
    if kind == "generator":

        def numbers(*, call_id: str) -> typing.Iterator[int]:
            yield 1

        function: Any = numbers
    else:

        async def anumbers(*, call_id: str) -> typing.AsyncIterator[int]:
            yield 1

        function = anumbers
    with pytest.raises(TypeError, match="generator"):
        receipted(version="1")(function)


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


def test_an_async_function_is_awaited_inside_its_receipt_on_the_callers_loop(run_dir, tmp_path):
    """What agent frameworks call: an ``async def`` tool. Its coroutine runs on the caller's loop,
    after the prepared receipt and before the committed one; called again (at once, or later) it
    is not run again."""
    import asyncio

    outbox = tmp_path / "outbox.jsonl"
    seen: list[tuple[Any, str]] = []

    @receipted(version="1.0.0")
    async def send_note(to: str, body: str, *, call_id: str) -> dict[str, str]:
        receipt = json.loads((run_dir / "receipts" / f"{call_id}.json").read_text())
        seen.append((asyncio.get_running_loop(), receipt["status"]))
        await asyncio.sleep(0.05)  # another task may run meanwhile: the receipt's lock holds the call
        with outbox.open("a") as lines:
            lines.write(json.dumps({"to": to, "call_id": call_id}) + "\n")
        return {"sent_to": to, "call_id": call_id}

    assert inspect.iscoroutinefunction(send_note) and "call_id" not in inspect.signature(send_note).parameters

    async def agent() -> tuple[Any, list[Any]]:
        together = await asyncio.gather(*(send_note("ops", "deploy") for _ in range(3)))
        return asyncio.get_running_loop(), [*together, await send_note("ops", "deploy")]

    with use_run(run_dir):
        loop, answers = asyncio.run(agent())
    [line] = [json.loads(text) for text in outbox.read_text().splitlines()]
    assert all(answer == {"sent_to": "ops", "call_id": line["call_id"]} for answer in answers)
    assert seen == [(loop, "prepared")], "run once, on the caller's loop, inside a prepared receipt"
    receipt = json.loads((run_dir / "receipts" / f"{line['call_id']}.json").read_text())
    assert receipt["status"] == "committed" and receipt["result"] == {"returned": answers[0]}


def test_an_async_tool_keeps_rejections_and_asks_its_async_query_after_a_lost_answer(run_dir, tmp_path):
    import asyncio

    charges: dict[str, int] = {}
    lose_the_answer = [True]

    async def find_charge(amount: int, *, call_id: str) -> Any:
        await asyncio.sleep(0)
        return {"charged": charges[call_id]} if call_id in charges else NOT_DONE

    @receipted(version="1.0.0", query=find_charge)
    async def charge(amount: int, *, call_id: str) -> dict[str, int]:
        await asyncio.sleep(0)
        if amount < 1:
            raise Rejected("the amount must be positive")
        charges[call_id] = amount
        if lose_the_answer.pop() if lose_the_answer else False:
            raise OutcomeUnknown("the connection dropped after the charge")
        return {"charged": amount}

    async def agent() -> list[Any]:
        answers: list[Any] = []
        for amount in (0, 500, 500):
            try:
                answers.append(await charge(amount))
            except (Rejected, CallInDoubt) as error:
                answers.append(type(error).__name__)
        return answers

    with use_run(run_dir):
        answers = asyncio.run(agent())
    # Refused; then charged with its answer lost (in doubt); then the query finds the charge.
    assert answers == ["Rejected", "CallInDoubt", {"charged": 500}]
    assert list(charges.values()) == [500]


def test_an_async_tool_called_by_call_in_from_plain_code_runs_on_a_loop_of_its_own(run_dir):
    import asyncio

    @receipted(version="1.0.0")
    async def ping(host: str, *, call_id: str) -> str:
        await asyncio.sleep(0)
        return f"pong from {host}"

    outcome = ping.call_in(run_dir, "db-1")
    assert outcome.status == "committed" and outcome.result == {"returned": "pong from db-1"}


def test_a_caller_cancelled_while_awaiting_does_not_stop_the_call(run_dir):
    """The writer's thread cannot be cancelled: the call ends there, and its receipt says how."""
    import asyncio

    runs: list[str] = []

    @receipted(version="1.0.0")
    async def slow_send(body: str, *, call_id: str) -> str:
        await asyncio.sleep(0.3)
        runs.append(call_id)
        return "sent"

    async def agent() -> str:
        waiting = asyncio.create_task(slow_send("hello"))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0.6)  # the loop goes on: the call's coroutine ends on it
        return await slow_send("hello")

    with use_run(run_dir):
        answer = asyncio.run(agent())
    assert answer == "sent" and len(runs) == 1
    assert json.loads((run_dir / "receipts" / f"{runs[0]}.json").read_text())["status"] == "committed"


def test_asyncio_run_returns_once_a_call_whose_caller_was_cancelled_has_ended(run_dir):
    """A cancelled caller stops waiting, and the call goes on in the writer's thread; ``asyncio.run``
    still returns only once that thread has ended, as it does for its own pool's threads: then the
    receipts say how every call it started ended. Here the call waits on its lock, which another
    caller of the same arguments holds until ``release``."""
    release, inside = threading.Event(), threading.Event()

    @receipted(version="1")
    async def send(body: str, *, call_id: str) -> str:
        inside.set()
        await asyncio.to_thread(release.wait, 30)
        return "sent"

    holder = threading.Thread(target=send.call_in, args=(run_dir, "hello"))
    holder.start()
    inside.wait(30)

    async def agent() -> None:
        waiting = asyncio.create_task(send("hello"))
        await asyncio.sleep(0.1)
        waiting.cancel()
        threading.Timer(0.2, release.set).start()

    with use_run(run_dir):
        asyncio.run(agent())
    assert [thread for thread in threading.enumerate() if thread.name == "receipts-writer"] == []
    holder.join(30)


def test_objects_a_framework_hands_over_are_recorded_as_json_and_reach_the_function_as_given(run_dir):
    """Agent frameworks validate a model's arguments into objects (pydantic models, dataclasses,
    enums, dates): the receipt and the call_id take their JSON form, the same each time they are
    given again, and the function gets the objects themselves."""
    from pydantic import BaseModel  # the dashboard's API (django-ninja) brings it: always in the test venv

    class Colour(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Address:
        city: str
        since: datetime.date

    class Order(BaseModel):
        sku: str
        quantity: int
        ship_to: Address

    seen: list[tuple[Any, ...]] = []

    @receipted(version="1")
    def place(order: Order, colour: Colour, at: datetime.datetime, *, call_id: str) -> Order:
        seen.append((order, colour, at))
        return order  # a model as the answer: recorded as its JSON

    order = Order(sku="A-1", quantity=2, ship_to=Address("Lyon", datetime.date(2026, 1, 2)))
    at = datetime.datetime(2026, 12, 6, 9, 30, tzinfo=datetime.UTC)
    with use_run(run_dir):
        answer = place(order, Colour.RED, at)
        again = place(Order.model_validate(order.model_dump()), Colour("red"), at)  # equal objects, built anew
    assert seen == [(order, Colour.RED, at)] and isinstance(seen[0][0], Order), "the objects as given, once"
    recorded = {"sku": "A-1", "quantity": 2, "ship_to": {"city": "Lyon", "since": "2026-01-02"}}
    assert answer == again == recorded
    [receipt] = [json.loads(path.read_bytes()) for path in (run_dir / "receipts").glob("*.json")]
    assert receipt["args"] == {"order": recorded, "colour": "red", "at": "2026-12-06T09:30:00+00:00"}
    as_json = place.call_in(run_dir, recorded, "red", "2026-12-06T09:30:00+00:00")
    assert as_json.call_id == receipt["call_id"] and as_json.reused, "the JSON form is the same intent"
    with pytest.raises(ValueError, match="not JSON: Object of type frozenset"):
        place.call_in(run_dir, frozenset({1}), "red", "x")  # no stable JSON form: no receipt


def test_an_async_function_whose_loop_stops_before_it_ends_is_unknown_and_not_waited_for(run_dir):
    """An agent framework's ``run_sync`` stops its loop when the run raises, with another tool's
    coroutine unfinished on it: the writer's thread, waiting for that coroutine, must not wait for
    ever (the receipt stayed prepared and the process could not exit); nobody knows how far the
    coroutine went, so the call is unknown."""
    started = threading.Event()

    @receipted(version="1")
    async def stall(*, call_id: str) -> None:
        started.set()
        await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    with use_run(run_dir):
        task = loop.create_task(stall())
    loop.run_until_complete(asyncio.to_thread(started.wait, 30))  # then the loop stops, stall unfinished
    receipt_path = run_dir / "receipts"
    until(lambda: [json.loads(p.read_bytes())["status"] for p in receipt_path.glob("*.json")] == ["unknown"],
          "the receipt says unknown")  # fmt: skip
    with pytest.raises(CallInDoubt, match="event loop running the function stopped"):
        loop.run_until_complete(task)
    loop.close()
