"""Receipted tools inside PydanticAI (``receipts.integrations.pydantic_ai``), in process, with the real
framework and its scripted ``FunctionModel``: what the model is given, what it is told, the run's deps.

The kill and the restart are ``tests/test_frameworks.py``'s; the docs example is run here."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "pydantic_ai", reason="the pydantic-ai extra is not installed (pip install 'callproof[pydantic-ai]')"
)

from pydantic import BaseModel, Field, SecretStr
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from receipts import CallInDoubt, receipted, runtime
from receipts.decorator import ReceiptedTool
from receipts.integrations.pydantic_ai import receipted_toolset
from receipts.tools import Rejected
from tests.helpers import CONTRACT


class Order(BaseModel):
    sku: str
    quantity: int


shipped: list[tuple[str, str]] = []  # (sku, call_id), each time a body ran: the shop's side


@receipted(name="place_order", version="1")
def place_order(order: Order, note: str = "", *, call_id: str) -> str:
    """Place an order with the shop. Returns the order's reference."""
    if not isinstance(order, Order):
        raise TypeError(f"got {type(order).__name__}, not an Order")
    if order.sku == "NONE":
        raise Rejected("the shop has no such article")
    if order.sku == "RETRY":
        raise ModelRetry("ask for another article")
    shipped.append((order.sku, call_id))
    return f"order {call_id[:12]}: {order.quantity} x {order.sku}"


@receipted(name="place_order", version="1")
async def place_order_async(order: Order, note: str = "", *, call_id: str) -> str:
    """Place an order with the shop. Returns the order's reference."""
    await asyncio.sleep(0)
    return place_order.__wrapped__(order, note, call_id=call_id)


TOOLS = {"sync": place_order, "async": place_order_async}


@dataclass
class Deps:
    run_dir: Any


@pytest.fixture(autouse=True)
def nothing_shipped():
    shipped.clear()


def scripted(*calls: Any) -> tuple[FunctionModel, list[list[ModelMessage]]]:
    """A model that asks for ``place_order`` with each of ``calls`` in turn (a callable is given the prompt),
    then answers with the tool results it was given, as JSON; and every request it got. It reads where
    it is from the run's messages, so two runs at once each get the whole script."""
    requests: list[list[ModelMessage]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(list(messages))
        asked = sum(isinstance(message, ModelResponse) for message in messages)
        if asked < len(calls):
            args = calls[asked]
            if callable(args):
                [prompt] = [part.content for part in messages[0].parts if isinstance(part, UserPromptPart)]
                args = args(prompt)
            return ModelResponse(parts=[ToolCallPart("place_order", args)])
        return ModelResponse(parts=[TextPart(json.dumps([[part.outcome, part.content] for part in returns(messages)]))])

    return FunctionModel(respond), requests


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in messages if isinstance(message, ModelRequest) for part in message.parts
            if isinstance(part, ToolReturnPart)]  # fmt: skip


def agent_of(model: FunctionModel, tool: ReceiptedTool = place_order, **options: Any) -> Agent[Deps, str]:
    toolset = receipted_toolset([tool], run_dir=lambda ctx: ctx.deps.run_dir)
    return Agent(model, deps_type=Deps, toolsets=[toolset], **options)


def output_of(agent: Agent[Deps, str], prompt: str, run_dir: Any) -> str:
    # Not run_sync: it keeps an event loop set in this thread, which a later asyncio.run leaves unclosed.
    return asyncio.run(agent.run(prompt, deps=Deps(run_dir))).output


def receipts_in(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_bytes()) for path in sorted((run_dir / "receipts").glob("*.json"))]


ORDER = {"order": {"sku": "A-1", "quantity": 2}, "note": "rush"}


@pytest.mark.parametrize("mode", list(TOOLS))
def test_the_model_is_given_the_functions_name_docstring_and_parameters_never_call_id(mode, run_dir):
    given: list[Any] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        given.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("nothing to do")])

    output_of(agent_of(FunctionModel(respond), TOOLS[mode]), "hello", run_dir)
    [tool] = given
    assert tool.name == "place_order"
    assert tool.description == "Place an order with the shop. Returns the order's reference."
    schema = tool.parameters_json_schema
    assert set(schema["properties"]) == {"order", "note"} and schema["required"] == ["order"]
    assert schema["$defs"]["Order"]["required"] == ["sku", "quantity"], "the pydantic model's own schema"
    assert "call_id" not in json.dumps(schema)


@pytest.mark.parametrize("mode", list(TOOLS))
def test_committed_the_model_gets_the_answer_and_the_same_call_again_gets_it_from_the_receipt(mode, run_dir):
    model, _ = scripted(ORDER, ORDER)
    output = json.loads(output_of(agent_of(model, TOOLS[mode]), "order", run_dir))
    [(_, call_id)] = shipped
    assert output == [["success", f"order {call_id[:12]}: 2 x A-1"]] * 2
    [receipt] = receipts_in(run_dir)
    assert (receipt["call_id"], receipt["status"], receipt["tool"]) == (call_id, "committed", "place_order")


def test_a_rejection_is_a_failed_tool_result_the_model_reads_and_goes_on_without_spending_retries(run_dir):
    refused = {"order": {"sku": "NONE", "quantity": 1}}
    model, _ = scripted(refused, refused, refused, ORDER)
    output = json.loads(output_of(agent_of(model, retries=0), "order", run_dir))
    assert [outcome for outcome, _ in output] == ["failed", "failed", "failed", "success"]
    assert all("the shop has no such article" in text for _, text in output[:3])
    assert [sku for sku, _ in shipped] == ["A-1"]
    assert sorted(receipt["status"] for receipt in receipts_in(run_dir)) == ["committed", "rejected"]


def test_the_same_pydantic_model_arguments_validated_twice_are_one_call_id(run_dir):
    # The first as a model sends JSON text, its quantity a string and keys in another order; the second
    # as a dict with the default note written out. Both validate to the same Order.
    as_text = json.dumps({"order": {"quantity": "2", "sku": "A-1"}})
    as_dict = {"order": {"sku": "A-1", "quantity": 2}, "note": ""}
    model, _ = scripted(as_text, as_dict)
    output = json.loads(output_of(agent_of(model), "order", run_dir))
    [(_, call_id)] = shipped
    assert output == [["success", f"order {call_id[:12]}: 2 x A-1"]] * 2
    [receipt] = receipts_in(run_dir)
    assert receipt["args"] == {"order": {"sku": "A-1", "quantity": 2}, "note": ""}


@pytest.mark.parametrize("mode", list(TOOLS))
def test_two_agent_runs_at_once_write_each_to_the_run_directory_of_its_deps(mode, tmp_path):
    runs = {sku: tmp_path / f"run-{sku}" for sku in ("A-1", "B-2")}
    for path in runs.values():
        runtime.run_init(path, contract_sha256=CONTRACT)
    # Each body waits for the other's: the two calls are under way at once, each in its own run.
    threads_inside, tasks_inside = threading.Barrier(2, timeout=30), asyncio.Barrier(2)

    @receipted(name="place_order", version="1")
    def place_order_together(order: Order, note: str = "", *, call_id: str) -> str:
        """Place an order with the shop. Returns the order's reference."""
        threads_inside.wait()  # a sync function runs in PydanticAI's worker thread
        return place_order.__wrapped__(order, note, call_id=call_id)

    @receipted(name="place_order", version="1")
    async def place_order_together_async(order: Order, note: str = "", *, call_id: str) -> str:
        """Place an order with the shop. Returns the order's reference."""
        await asyncio.wait_for(tasks_inside.wait(), timeout=30)
        return place_order.__wrapped__(order, note, call_id=call_id)

    tool = place_order_together_async if mode == "async" else place_order_together
    model, _ = scripted(lambda prompt: {"order": {"sku": prompt, "quantity": 1}})
    agent = agent_of(model, tool)

    async def both() -> list[Any]:
        return await asyncio.gather(*(agent.run(sku, deps=Deps(path)) for sku, path in runs.items()))

    results = asyncio.run(both())
    assert [json.loads(result.output)[0][0] for result in results] == ["success", "success"]
    for sku, path in runs.items():
        [receipt] = receipts_in(path)
        assert (receipt["status"], receipt["args"]["order"]["sku"]) == ("committed", sku)
    assert sorted(sku for sku, _ in shipped) == ["A-1", "B-2"]


def test_more_parallel_async_calls_than_the_loops_thread_pool_all_finish(run_dir):
    """A model response may ask for many tool calls, which PydanticAI runs at once. Each ``async def``
    call's receipt is written from a thread while its coroutine runs on the run's loop; a coroutine
    that needs the loop's default thread pool (``asyncio.to_thread``, or asyncio's own
    ``getaddrinfo`` when it opens a connection) must get a thread, however many calls wait on theirs."""
    pool = min(32, (os.cpu_count() or 1) + 4)  # the default executor's size (concurrent.futures)

    @receipted(name="place_order", version="1")
    async def place_order_resolving(order: Order, note: str = "", *, call_id: str) -> str:
        """Place an order with the shop. Returns the order's reference."""
        await asyncio.to_thread(lambda: None)  # as a connection's name lookup does
        return place_order.__wrapped__(order, note, call_id=call_id)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            return ModelResponse(parts=[TextPart(json.dumps([part.outcome for part in returns(messages)]))])
        return ModelResponse(parts=[ToolCallPart("place_order", {"order": {"sku": f"A-{n}", "quantity": 1}})
                                    for n in range(pool + 1)])  # fmt: skip

    agent = agent_of(FunctionModel(respond), place_order_resolving)

    async def bounded() -> str:  # a hang fails the test rather than stall the suite
        return (await asyncio.wait_for(agent.run("order", deps=Deps(run_dir)), timeout=60)).output

    assert json.loads(asyncio.run(bounded())) == ["success"] * (pool + 1)
    assert sorted(receipt["status"] for receipt in receipts_in(run_dir)) == ["committed"] * (pool + 1)
    assert len(shipped) == pool + 1


def test_a_call_in_doubt_reaches_the_caller_as_itself_and_once_settled_not_done_the_model_is_told(run_dir):
    # ModelRetry inside a receipted function is an exception like any other: the writer cannot know
    # that nothing was done, so the call is in doubt (Rejected is the way to say nothing was done).
    retry = {"order": {"sku": "RETRY", "quantity": 1}}
    model, requests = scripted(retry)
    with pytest.raises(CallInDoubt) as doubt:
        output_of(agent_of(model), "order", run_dir)
    assert type(doubt.value) is CallInDoubt and "ModelRetry: ask for another article" in str(doubt.value)
    [receipt_path] = (run_dir / "receipts").glob("*.json")
    assert receipt_path.stem == doubt.value.outcome.call_id
    assert json.loads(receipt_path.read_bytes())["status"] == "unknown"
    assert len(requests) == 1, "no request after the call: the model never saw it"

    runtime.confirm_call(run_dir, receipt_path.stem, resolution="rejected", reason="the shop shows no such order",
                         actor="ops", receipt_sha256=hashlib.sha256(receipt_path.read_bytes()).hexdigest())  # fmt: skip
    model, _ = scripted(retry)
    [(outcome, text)] = json.loads(output_of(agent_of(model), "order", run_dir))
    assert (outcome, "confirmed not done: the shop shows no such order" in text) == ("failed", True)


def test_arguments_that_do_not_validate_go_back_to_the_model_before_any_receipt(run_dir):
    model, _ = scripted({"order": {"sku": "A-1"}}, ORDER)
    [(retried, errors), (success, _)] = json.loads(output_of(agent_of(model, retries=1), "order", run_dir))
    assert (retried, errors[0]["loc"], success) == ("retried", ["order", "quantity"], "success")
    assert [receipt["args"] for receipt in receipts_in(run_dir)] == [ORDER]


@pytest.mark.parametrize(
    ("given", "error", "said"),
    [
        (None, TypeError, "place_order: run_dir(ctx) gave None, not a path to a run directory"),
        ("missing", ValueError, "is not a run directory (no steer.json)"),
        ("empty", ValueError, "is not a run directory (no steer.json)"),
    ],
)
def test_a_run_directory_that_is_not_a_run_stops_the_agent_run_saying_so(given, error, said, tmp_path):
    (tmp_path / "empty").mkdir()
    model, requests = scripted(ORDER)
    run_dir = None if given is None else tmp_path / given
    with pytest.raises(error, match=re.escape(said)):
        output_of(agent_of(model), "order", run_dir)
    assert shipped == [] and not (tmp_path / "missing").exists() and list((tmp_path / "empty").iterdir()) == []
    assert len(requests) == 1


def test_a_function_that_is_not_receipted_or_takes_the_run_context_is_refused():
    def plain(sku: str) -> str:
        return sku

    @receipted(version="1")
    def with_context(ctx: RunContext[Deps], sku: str, *, call_id: str) -> str:
        return sku

    with pytest.raises(TypeError, match="is not a @receipted function"):
        receipted_toolset([plain], run_dir=lambda ctx: ctx.deps.run_dir)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="with_context takes a RunContext: every argument"):
        receipted_toolset([with_context], run_dir=lambda ctx: ctx.deps.run_dir)


class Login(BaseModel):
    user: str
    password: SecretStr  # its JSON dump is "**********", whatever the password


class Transfer(BaseModel):
    amount_cents: int
    reference: str = Field(default="", exclude=True)  # left out of the dump


@receipted(name="apply", version="1")
def log_in(change: Login, *, call_id: str) -> str:
    """Log in."""
    shipped.append(("log_in", call_id))
    return f"done {len(shipped)}"


@receipted(name="apply", version="1")
def transfer(change: Transfer, *, call_id: str) -> str:
    """Transfer money."""
    shipped.append(("transfer", call_id))
    return f"done {len(shipped)}"


@pytest.mark.parametrize(
    ("tool", "first", "second"),
    [
        (log_in, {"user": "ops", "password": "old-one"}, {"user": "ops", "password": "new-one"}),
        (transfer, {"amount_cents": 100, "reference": "rent"}, {"amount_cents": 100, "reference": "gift"}),
    ],
    ids=["secret", "excluded field"],
)
def test_two_intents_whose_models_dump_to_the_same_json_are_never_one_call(tool, first, second, run_dir):
    """The call_id is computed from the arguments' JSON: a model whose dump leaves something out
    (``exclude=True``, a secret shown as stars) would make two different intents one call, and the
    second would get the first one's answer without its effect. Such an argument is refused before
    any receipt: the run stops, saying why, and nothing ran."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(isinstance(message, ModelResponse) for message in messages)
        if asked < 2:
            return ModelResponse(parts=[ToolCallPart("apply", {"change": [first, second][asked]})])
        return ModelResponse(parts=[TextPart(json.dumps([part.content for part in returns(messages)]))])

    toolset = receipted_toolset([tool], run_dir=lambda ctx: ctx.deps.run_dir)
    agent = Agent(FunctionModel(respond), deps_type=Deps, toolsets=[toolset])
    with pytest.raises(ValueError, match="its JSON form leaves out what makes it this object"):
        output_of(agent, "change", run_dir)
    assert shipped == [] and receipts_in(run_dir) == []
