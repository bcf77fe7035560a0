"""Receipted tools inside the OpenAI Agents SDK: what the model is given and told, runs side by side,
configuration errors, and the guide's example. The real SDK and its own offline model
(``agents.testing.ScriptedModel``); the kill-and-settle scenario is tests/test_frameworks.py's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "agents", reason="the openai-agents extra is not installed (pip install 'callproof[openai-agents]')"
)

from agents import (
    Agent,
    AgentsException,
    FunctionTool,
    RunContextWrapper,
    Runner,
    UserError,
    set_tracing_disabled,
)
from agents.exceptions import ToolTimeoutError
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from receipts import CallInDoubt, receipted, runtime
from receipts.integrations.openai_agents import receipted_tool
from receipts.tools import OutcomeUnknown, Rejected
from tests.framework_agents import tools
from tests.framework_agents.openai_agents import Shop, tool_outputs
from tests.helpers import CONTRACT, PROJECT, until

set_tracing_disabled(True)


@pytest.fixture(autouse=True)
def effects(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "orders.jsonl"
    monkeypatch.setenv("EFFECTS_FILE", str(path))
    return path


def run_agent(agent: Agent[Any], context: Any) -> Any:
    """``Runner.run`` on a loop of its own, closed after: ``run_sync`` leaves the thread's loop open."""
    return asyncio.run(Runner.run(agent, "Go on.", context=context))


def in_run(function: Any, **options: Any) -> Any:
    return receipted_tool(function, run_dir=lambda wrapper: wrapper.context.run_dir, **options)


def model_asking(*calls: dict[str, Any], name: str = "place_order") -> ScriptedModel:
    """A model that asks for each call in turn, then answers with the tool results it was given (JSON)."""
    asks = [[function_call(name, arguments, call_id=f"call-{n}")] for n, arguments in enumerate(calls, 1)]
    final = ModelStep.respond(lambda call: [assistant_message(json.dumps(tool_outputs(call.input)))])
    return ScriptedModel([*asks, final])


def receipts_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_bytes()) for path in (run_dir / "receipts").glob("*.json")]


@pytest.mark.parametrize("function", [tools.place_order, tools.place_order_async], ids=["sync", "async"])
def test_the_model_is_given_the_functions_name_docstring_and_parameters_and_never_call_id(function, run_dir):
    model = ScriptedModel([[assistant_message("nothing to order")]])
    run_agent(Agent(name="shop", model=model, tools=[in_run(function)]), Shop(run_dir))
    [given] = model.calls[0].tools
    assert isinstance(given, FunctionTool)
    assert (given.name, given.description) == (
        "place_order",
        "Place an order with the shop. Returns the order's reference.",
    )
    schema = given.params_json_schema
    assert set(schema["properties"]) == {"order", "note"}
    assert "call_id" not in json.dumps(schema)
    order = schema["$defs"]["Order"] if "$ref" in schema["properties"]["order"] else schema["properties"]["order"]
    assert set(order["properties"]) == {"sku", "quantity"}, "the pydantic model's fields, for the model to fill"


def test_the_same_model_arguments_validated_twice_give_one_call_id_and_one_effect(run_dir):
    asked: list[Any] = []

    def run_dir_of(wrapper: RunContextWrapper[Shop]) -> Path:
        asked.append(wrapper.context)
        return wrapper.context.run_dir

    model = model_asking(tools.ORDER_CALL, tools.ORDER_CALL)  # two tool calls, two Order objects
    agent = Agent(name="shop", model=model, tools=[receipted_tool(tools.place_order, run_dir=run_dir_of)])
    shop = Shop(run_dir)
    result = run_agent(agent, shop)
    assert asked == [shop, shop], "run_dir: once per tool call, with the run's context object"
    [placed] = tools.effect_lines()
    assert json.loads(result.final_output) == [f"order {placed['call_id'][:12]}: 2 x A-1"] * 2
    [receipt] = receipts_of(run_dir)
    assert receipt["call_id"] == placed["call_id"]
    assert receipt["args"] == tools.ORDER_CALL, "the Order the SDK validated, recorded as its JSON"


def test_a_rejection_reaches_the_model_as_a_failed_tool_call_and_the_agent_goes_on(run_dir):
    @receipted(name="reserve_room", version="1")
    def reserve_room(room: str, *, call_id: str) -> str:
        """Reserve a meeting room."""
        raise Rejected(f"{room} is closed for works", kind="permanent")

    model = model_asking({"room": "Ada"}, name="reserve_room")
    result = run_agent(Agent(name="rooms", model=model, tools=[in_run(reserve_room)]), Shop(run_dir))
    [told] = json.loads(result.final_output)
    [receipt] = receipts_of(run_dir)
    assert (
        told == f"rejected (permanent), nothing was done: reserve_room ({receipt['call_id']}): Ada is closed for works"
    )
    assert receipt["status"] == "rejected"


def test_arguments_the_model_got_wrong_reach_it_as_the_sdks_tool_error_and_no_receipt_is_made(run_dir):
    model = model_asking({"order": {"sku": "A-1"}, "note": ""})  # no quantity
    result = run_agent(Agent(name="shop", model=model, tools=[in_run(tools.place_order)]), Shop(run_dir))
    assert json.loads(result.final_output) == ["An error occurred while running the tool. Please try again."]
    assert receipts_of(run_dir) == [] and tools.effect_lines() == []


@receipted(name="send_payment", version="1")
def send_payment(to: str, cents: int, *, call_id: str) -> str:
    """Send a payment."""
    raise OutcomeUnknown("the bank timed out after the request was sent")


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_call_in_doubt_stops_the_run_and_reaches_the_caller_as_call_in_doubt(streamed, run_dir):
    model = model_asking({"to": "acme", "cents": 1200}, name="send_payment")
    agent = Agent(name="payer", model=model, tools=[in_run(send_payment)])

    async def streamed_run() -> None:
        result = Runner.run_streamed(agent, "Pay acme", context=Shop(run_dir))
        async for _event in result.stream_events():
            pass

    with pytest.raises(CallInDoubt) as stopped:
        asyncio.run(streamed_run()) if streamed else run_agent(agent, Shop(run_dir))
    [receipt] = receipts_of(run_dir)
    assert stopped.value.outcome.call_id == receipt["call_id"]
    assert len(model.calls) == 1, "the model was never told of the call in doubt"
    assert isinstance(stopped.value, AgentsException) and stopped.value.run_data is not None, "the SDK's run data"
    assert type(stopped.value.__cause__) is CallInDoubt, "the function's own, as the cause"


def test_a_run_whose_state_refuses_calls_stops_with_the_sdks_user_error(run_dir):
    runtime.run_set_state(run_dir, state="paused", attempts=1)
    model = model_asking(tools.ORDER_CALL)
    with pytest.raises(UserError, match="Error running tool place_order") as stopped:
        run_agent(Agent(name="shop", model=model, tools=[in_run(tools.place_order)]), Shop(run_dir))
    assert isinstance(stopped.value.__cause__, ValueError), "the writer's error, as the SDK wraps it"
    assert tools.effect_lines() == [] and len(model.calls) == 1


def placed_together(barrier: Any, *, awaited: bool) -> Any:
    """An order tool whose calls wait for each other: both runs are inside their tool at once."""
    if awaited:

        @receipted(name="place_order", version="1")
        async def place_order_async(order: tools.Order, note: str = "", *, call_id: str) -> str:
            """Place an order with the shop."""
            await barrier.wait()
            return f"{order.sku} {call_id[:12]}"

        return place_order_async

    @receipted(name="place_order", version="1")
    def place_order(order: tools.Order, note: str = "", *, call_id: str) -> str:
        """Place an order with the shop."""
        barrier.wait()
        return f"{order.sku} {call_id[:12]}"

    return place_order


@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_two_agent_runs_at_once_write_each_its_own_receipt(mode, tmp_path):
    run_dirs = [tmp_path / "run-a", tmp_path / "run-b"]
    for path in run_dirs:
        runtime.run_init(path, contract_sha256=CONTRACT)
    orders: list[dict[str, Any]] = [{"order": {"sku": sku, "quantity": 1}, "note": ""} for sku in ("A-1", "B-2")]

    def agent(tool: Any, arguments: dict[str, Any]) -> Agent[Shop]:
        return Agent(name="shop", model=model_asking(arguments), tools=[in_run(tool)])

    if mode == "threads":
        tool = placed_together(threading.Barrier(2, timeout=30), awaited=False)
        outputs: dict[int, Any] = {}

        def one(index: int) -> None:
            result = run_agent(agent(tool, orders[index]), Shop(run_dirs[index]))
            outputs[index] = result.final_output

        threads = [threading.Thread(target=one, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        finals: list[Any] = [outputs.get(index) for index in range(2)]
    else:

        async def both() -> list[Any]:
            tool = placed_together(asyncio.Barrier(2), awaited=True)
            runs = [Runner.run(agent(tool, orders[i]), "Order", context=Shop(run_dirs[i])) for i in range(2)]
            return [result.final_output for result in await asyncio.wait_for(asyncio.gather(*runs), timeout=60)]

        finals = asyncio.run(both())

    for path, arguments, final in zip(run_dirs, orders, finals, strict=True):
        [receipt] = receipts_of(path)
        assert (receipt["status"], receipt["args"]) == ("committed", arguments), "each run's own call, in its own run"
        assert json.loads(final) == [f"{arguments['order']['sku']} {receipt['call_id'][:12]}"]


def beside_one_in_doubt(release: threading.Event) -> Agent[Shop]:
    """An agent whose model asks for three calls in one response, run at once by the SDK: ``pay`` ends in
    doubt once all three are inside their functions; ``ship`` (``def``) returns once ``release`` is set;
    ``notify`` (``async def``) waits until it is cancelled."""
    inside = threading.Barrier(3, timeout=30)

    @receipted(name="pay", version="1")
    def pay(to: str, *, call_id: str) -> str:
        """Pay."""
        inside.wait()
        raise OutcomeUnknown("the bank timed out after the request was sent")

    @receipted(name="ship", version="1")
    def ship(sku: str, *, call_id: str) -> str:
        """Ship."""
        inside.wait()
        release.wait(timeout=30)
        return "shipped"

    @receipted(name="notify", version="1")
    async def notify(to: str, *, call_id: str) -> str:
        """Notify."""
        await asyncio.to_thread(inside.wait)
        await asyncio.Event().wait()
        return "notified"

    calls = [("pay", {"to": "acme"}), ("ship", {"sku": "A-1"}), ("notify", {"to": "acme"})]
    model = ScriptedModel([[function_call(name, arguments, call_id=name) for name, arguments in calls]])
    return Agent(name="shop", model=model, tools=[in_run(function) for function in (pay, ship, notify)])


def statuses(run_dir: Path) -> dict[str, str]:
    return {receipt["tool"]: receipt["status"] for receipt in receipts_of(run_dir)}


def call_ids(run_dir: Path) -> dict[str, str]:
    return {receipt["tool"]: receipt["call_id"] for receipt in receipts_of(run_dir)}


def test_tool_calls_beside_one_in_doubt_end_as_their_functions_let_them_under_runner_run(run_dir):
    release = threading.Event()

    async def main() -> None:
        with pytest.raises(CallInDoubt):
            await Runner.run(beside_one_in_doubt(release), "Go on.", context=Shop(run_dir))
        release.set()  # ship goes on in its thread after the SDK cancelled the task awaiting it

    asyncio.run(main())  # closing its loop cancels notify's coroutine: nobody knows how far it went
    assert statuses(run_dir) == {"pay": "unknown", "ship": "committed", "notify": "unknown"}


RUN_SYNC_BESIDE_ONE_IN_DOUBT = """
import threading
from pathlib import Path
from agents import Runner
from receipts import CallInDoubt, runtime
from tests.helpers import CONTRACT, PROJECT
from tests.test_integration_openai_agents import Shop, beside_one_in_doubt, call_ids

runtime.run_init(Path("run"), contract_sha256=CONTRACT)
release = threading.Event()
release.set()
try:
    Runner.run_sync(beside_one_in_doubt(release), "Go on.", context=Shop(Path("run")))
except CallInDoubt as doubt:
    print(doubt.outcome.call_id == call_ids(Path("run"))["pay"])
"""


def test_under_run_sync_an_async_call_beside_one_in_doubt_ends_unknown_and_the_process_exits(tmp_path):
    """``run_sync`` stops its loop when the run raises, with ``notify``'s coroutine unfinished on it:
    the writer's thread, waiting for it, sees the loop stop and records the call unknown, rather
    than wait for ever (the call stayed prepared, and the process could not exit)."""
    environment = {"PYTHONPATH": str(PROJECT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    completed = subprocess.run([sys.executable, "-c", RUN_SYNC_BESIDE_ONE_IN_DOUBT], cwd=tmp_path, env=environment,
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert completed.returncode == 0 and completed.stdout == "True\n", completed.stderr[-3000:]
    said = statuses(tmp_path / "run")  # once the process ended: its writer threads had ended
    assert said == {"pay": "unknown", "ship": "committed", "notify": "unknown"}, said
    [notify] = [receipt for receipt in receipts_of(tmp_path / "run") if receipt["tool"] == "notify"]
    assert "event loop running the function stopped" in notify["error"]["message"]


@pytest.mark.parametrize(
    ("run_dir_of", "context", "said"),
    [
        (
            lambda wrapper: wrapper.context.run_dir,
            Shop(Path("nowhere")),
            "nowhere is not a run directory (no steer.json)",
        ),
        (lambda wrapper: wrapper.context.run_dir, None, "the run was started without context=..."),
        (lambda wrapper: 42, Shop(Path("nowhere")), "run_dir gave 42, not a path to a run directory"),
    ],
    ids=["missing", "no context", "not a path"],
)
def test_a_missing_or_invalid_run_directory_stops_the_run_with_a_clear_error(run_dir_of, context, said):
    model = model_asking(tools.ORDER_CALL)
    agent = Agent(name="shop", model=model, tools=[receipted_tool(tools.place_order, run_dir=run_dir_of)])
    with pytest.raises(UserError) as stopped:
        run_agent(agent, context)
    assert str(stopped.value).startswith("place_order: ") and said in str(stopped.value)
    assert tools.effect_lines() == [] and len(model.calls) == 1, "nothing ran, and the model was not told"


def test_receipted_tool_passes_function_tool_options_on_and_refuses_what_would_break_it_saying_why():
    assert in_run(tools.place_order, description_override="Order.").description == "Order."

    def plain(sku: str, *, call_id: str) -> str:
        return sku

    with pytest.raises(TypeError, match="not a receipted function: decorate it with @receipted"):
        in_run(plain)
    with pytest.raises(TypeError, match="sets failure_error_function itself"):
        in_run(tools.place_order, failure_error_function=lambda wrapper, error: "no")

    @receipted(name="with_context", version="1")
    def with_context(wrapper: RunContextWrapper[Any], sku: str, *, call_id: str) -> str:
        return sku

    @receipted(name="with_tool_context", version="1")
    def with_tool_context(sku: str, wrapper: ToolContext[Any] | None = None, *, call_id: str) -> str:
        return sku

    for function in (with_context, with_tool_context):
        with pytest.raises(TypeError, match="takes the SDK's run context"):
            in_run(function)


def test_a_tool_call_the_sdk_times_out_is_never_told_to_the_model_the_run_stops(run_dir):
    """The SDK's ``timeout`` (``async def`` tools) stops waiting for the tool and, by default, tells
    the model that it timed out: but the call goes on (its coroutine, the writer's thread) and may
    take effect, and the model, told it failed, may ask again with other arguments (a new call_id,
    a second effect). A call in doubt is never the model's to know: only ``raise_exception``, which
    stops the run, is taken; the call ends as it ends, and its receipt says how."""
    release = threading.Event()

    @receipted(name="pay", version="1")
    async def pay(to: str, *, call_id: str) -> str:
        """Pay."""
        await asyncio.to_thread(release.wait, 30)
        return "paid"

    for told in ({}, {"timeout_behavior": "error_as_result"}, {"timeout_error_function": lambda *_: "later"}):
        with pytest.raises(TypeError, match="timeout_behavior='raise_exception'"):
            in_run(pay, timeout=0.2, **told)
    model = model_asking({"to": "acme"}, name="pay")
    agent = Agent(name="shop", model=model, tools=[in_run(pay, timeout=0.2, timeout_behavior="raise_exception")])

    async def stopped_then_released() -> None:
        with pytest.raises(ToolTimeoutError):
            await Runner.run(agent, "Go on.", context=Shop(run_dir))
        release.set()
        await asyncio.to_thread(until, lambda: [r["status"] for r in receipts_of(run_dir)] == ["committed"],
                                "the call ended")  # fmt: skip

    asyncio.run(stopped_then_released())
    assert len(model.calls) == 1, "the run stopped: the model was not told"
    [receipt] = receipts_of(run_dir)
    assert (receipt["status"], receipt["result"]) == ("committed", {"returned": "paid"}), "the call went on"
