"""``receipts.integrations.langgraph``: what is LangGraph's own, on real graphs, in process.

Each graph is ``tests.framework_agents.langgraph``'s: a scripted LangChain chat model
(offline) and LangGraph's ``ToolNode``. The kill and the lost response are
``tests/test_frameworks.py``'s, in child processes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (pip install 'callproof[langgraph]')")

import langsmith
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import InjectedState, ToolRuntime
from langgraph.types import RetryPolicy, interrupt

from receipts import CallInDoubt, protocol, receipted, runtime
from receipts.integrations.langgraph import receipted_tool, runs_by_thread
from receipts.tools import OutcomeUnknown, Rejected
from tests.framework_agents import tools
from tests.framework_agents.langgraph import ASK, ScriptedModel, agent_graph, next_input
from tests.helpers import CONTRACT

MODES = ["sync", "async"]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch) -> Iterator[None]:
    """No trace leaves the machine (LangChain's LangSmith tracer), and the shop is a file."""
    monkeypatch.setenv("EFFECTS_FILE", str(tmp_path / "orders.jsonl"))
    langsmith.configure(enabled=False)
    yield
    langsmith.configure(enabled=None)


def invoke(graph: Any, thread_id: str | None, mode: str) -> dict[str, Any]:
    """One graph run of the thread (a new question, or the pending step resumed), sync or async."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}} if thread_id else {}
    pending = graph.get_state(config).next if graph.checkpointer else ()
    if mode == "async":
        return asyncio.run(graph.ainvoke(next_input(pending), config))
    return graph.invoke(next_input(pending), config)


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [message for message in state["messages"] if isinstance(message, ToolMessage)]


def receipts_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_bytes()) for path in (run_dir / "receipts").glob("*.json")]


def order_tool(mode: str, root: Path) -> Any:
    function = tools.place_order_async if mode == "async" else tools.place_order
    return receipted_tool(function, run_dir=runs_by_thread(root))


@pytest.mark.parametrize("mode", MODES)
def test_the_model_is_given_the_functions_name_docstring_and_parameters_and_never_call_id(mode, run_dir):
    model = ScriptedModel()
    state = invoke(agent_graph(model, [order_tool(mode, run_dir.parent)]).compile(), run_dir.name, mode)
    [given, _] = model.seen_tools  # the question, then the tool's answer: the same tools each time
    [schema] = given
    assert schema["function"]["name"] == "place_order", "the @receipted name, not place_order_async"
    assert schema["function"]["description"] == "Place an order with the shop. Returns the order's reference."
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["order"]
    assert set(parameters["properties"]) == {"order", "note"}, "call_id is the writer's"
    assert parameters["properties"]["order"]["properties"].keys() == {"sku", "quantity"}
    assert "call_id" not in json.dumps(schema)
    [answer] = tool_messages(state)
    assert answer.status == "success" and answer.text.startswith("order ")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("handling", [{}, {"handle_tool_errors": False}], ids=["default", "no_tool_node_handling"])
def test_a_rejection_is_an_error_tool_message_and_the_model_goes_on(mode, handling, run_dir):
    @receipted(name="reserve", version="1")
    def reserve(sku: str, *, call_id: str) -> str:
        """Reserve an item."""
        raise Rejected("out of stock", kind="retryable")

    @receipted(name="reserve", version="1")
    async def reserve_async(sku: str, *, call_id: str) -> str:
        """Reserve an item."""
        raise Rejected("out of stock", kind="retryable")

    tool = receipted_tool(reserve_async if mode == "async" else reserve, run_dir=runs_by_thread(run_dir.parent))
    model = ScriptedModel(tool="reserve", args={"sku": "A-1"})
    state = invoke(agent_graph(model, [tool], **handling).compile(), run_dir.name, mode)
    [refused] = tool_messages(state)
    assert refused.status == "error" and refused.text.endswith("out of stock"), refused
    assert state["messages"][-1].content == tools.final_text([refused.content]), "the model read it and answered"
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "rejected"


# A retry policy that retries every exception, at once.
RETRY_ALL = RetryPolicy(initial_interval=0.001, jitter=False, retry_on=Exception)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "handling", [{}, {"handle_tool_errors": True}, {"retry_policy": RETRY_ALL}],
    ids=["default", "handle_tool_errors", "retry_policy"],
)  # fmt: skip
def test_a_call_in_doubt_leaves_the_graph_run_and_stays_pending_whatever_tool_node_handles(mode, handling, run_dir):
    tries = []

    @receipted(name="charge", version="1")
    def charge(cents: int, *, call_id: str) -> str:
        """Charge a card."""
        tries.append(call_id)
        raise OutcomeUnknown("the bank did not answer")

    @receipted(name="charge", version="1")
    async def charge_async(cents: int, *, call_id: str) -> str:
        """Charge a card."""
        tries.append(call_id)
        raise OutcomeUnknown("the bank did not answer")

    tool_runs = []  # each time LangChain ran the tool: it asks for the run directory

    def counted_run_dir(config: Any) -> Path:
        tool_runs.append(config)
        return run_dir

    tool = receipted_tool(charge_async if mode == "async" else charge, run_dir=counted_run_dir)
    model = ScriptedModel(tool="charge", args={"cents": 1200})
    graph = agent_graph(model, [tool], **handling).compile(checkpointer=InMemorySaver())
    with pytest.raises(CallInDoubt) as first:
        invoke(graph, run_dir.name, mode)
    assert first.value.outcome.call_id == tries[0]
    assert len(tool_runs) == 1, "not retried"
    config: RunnableConfig = {"configurable": {"thread_id": run_dir.name}}
    assert graph.get_state(config).next == ("tools",), "the tool call is pending, no message was made of it"
    assert not tool_messages(graph.get_state(config).values)
    with pytest.raises(CallInDoubt) as again:  # resumed: the pending call again, answered from its receipt
        stream_all(graph, config, mode)
    assert again.value.outcome.call_id == tries[0] and len(tries) == 1, "never run again"
    assert len(tool_runs) == 2 and len(model.seen_tools) == 1, "the model was asked once, and never told"


def stream_all(graph: Any, config: RunnableConfig, mode: str) -> None:
    """Resume the thread with ``stream`` or ``astream``, to the end."""

    async def consume() -> None:
        async for _ in graph.astream(None, config):
            pass

    asyncio.run(consume()) if mode == "async" else list(graph.stream(None, config))


@pytest.mark.parametrize("mode", MODES)
def test_the_same_pydantic_arguments_validated_twice_give_one_call_id(mode, run_dir):
    orders = []

    @receipted(name="place_order", version="1")
    def place_order(order: tools.Order, note: str = "", *, call_id: str) -> str:
        """Place an order with the shop."""
        orders.append(order)
        return f"order {call_id[:12]}"

    tool = receipted_tool(place_order, run_dir=runs_by_thread(run_dir.parent))
    state = invoke(agent_graph(ScriptedModel(asks=2), [tool]).compile(), run_dir.name, mode)  # a sync tool, either way
    first, second = (message.content for message in tool_messages(state))
    assert first == second
    [placed] = orders
    assert isinstance(placed, tools.Order), "the function gets the model LangChain validated"
    [receipt] = receipts_of(run_dir)
    assert receipt["args"] == tools.ORDER_CALL and first == f"order {receipt['call_id'][:12]}"


def test_the_attempt_is_the_runs_own(run_dir):
    runtime.run_set_state(run_dir, state="retrying", attempts=1)
    invoke(agent_graph(ScriptedModel(), [order_tool("sync", run_dir.parent)]).compile(), run_dir.name, "sync")
    [receipt] = receipts_of(run_dir)
    assert receipt["attempt"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_two_graph_runs_at_once_write_each_in_its_own_run(mode, tmp_path):
    runs = {name: tmp_path / name for name in ("run-a", "run-b")}
    for name, path in runs.items():
        runtime.run_init(path, contract_sha256=protocol.sha256_hex(name.encode()))
    # Each call waits until the other one is in flight: both runs are inside their tool at once.
    both_in_tool = threading.Barrier(2, timeout=10)

    @receipted(name="note", version="1")
    def note(text: str, *, call_id: str) -> str:
        """Write a note."""
        both_in_tool.wait()
        return call_id

    @receipted(name="note", version="1")
    async def note_async(text: str, *, call_id: str) -> str:
        """Write a note."""
        await asyncio.to_thread(both_in_tool.wait)
        return call_id

    tool = receipted_tool(note_async if mode == "async" else note, run_dir=runs_by_thread(tmp_path))
    graph = agent_graph(ScriptedModel(tool="note", args={"text": "hi"}), [tool]).compile()
    if mode == "async":

        async def together() -> list[dict[str, Any]]:
            return await asyncio.gather(*(graph.ainvoke(next_input(()), {"configurable": {"thread_id": name}})
                                          for name in runs))  # fmt: skip

        states = asyncio.run(together())
    else:
        with ThreadPoolExecutor(2) as pool:
            states = list(pool.map(lambda name: invoke(graph, name, "sync"), runs))
    for (name, path), state in zip(runs.items(), states, strict=True):
        [receipt] = receipts_of(path)
        [answer] = tool_messages(state)
        assert receipt["status"] == "committed" and answer.content == receipt["call_id"], name
    assert len({receipts_of(path)[0]["call_id"] for path in runs.values()}) == 2


def not_a_path(config: Any) -> Any:
    return None


@pytest.mark.parametrize(
    ("thread_id", "run_dir", "error", "says"),
    [
        (None, None, ValueError, "the graph run has no thread_id"),
        ("../run-1", None, ValueError, "cannot name a run directory"),
        ("run-2", None, ValueError, r"run-2 is not a run directory \(no steer.json\)"),
        ("run-1", not_a_path, TypeError, "run_dir\\(config\\) gave None, not a path to a run directory"),
    ],
    ids=["no thread_id", "a thread_id out of the root", "not made by run_init", "not a path"],
)
def test_a_graph_run_without_a_run_directory_is_refused_clearly(thread_id, run_dir, error, says, tmp_path):
    runtime.run_init(tmp_path / "runs" / "run-1", contract_sha256=CONTRACT)
    choose: Callable[[Any], Any] = run_dir or runs_by_thread(tmp_path / "runs")
    graph = agent_graph(ScriptedModel(), [receipted_tool(tools.place_order, run_dir=choose)]).compile()
    with pytest.raises(error, match=says):
        invoke(graph, thread_id, "sync")
    assert not tools.effect_lines()
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["run-1"], "no run made"


def test_what_is_not_a_receipted_tool_is_refused_when_the_tool_is_made(tmp_path):
    def plain(sku: str) -> str:
        """Not receipted."""
        return sku

    @receipted(version="1")
    def undocumented(sku: str, *, call_id: str) -> str:
        return sku

    runs = runs_by_thread(tmp_path)
    with pytest.raises(TypeError, match="not a @receipted function"):
        receipted_tool(plain, run_dir=runs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="undocumented has no docstring"):
        receipted_tool(undocumented, run_dir=runs)
    with pytest.raises(TypeError, match="run_dir must be a function"):
        receipted_tool(tools.place_order, run_dir=tmp_path)


@receipted(version="1")
def with_tool_call_id(sku: str, tool_call_id: Annotated[str, InjectedToolCallId], *, call_id: str) -> str:
    """Its tool_call_id differs each time the model asks."""
    return sku


@receipted(version="1")
def with_state(sku: str, state: Annotated[dict, InjectedState], *, call_id: str) -> str:
    """Its state grows at each step."""
    return sku


@receipted(version="1")
def with_runtime(sku: str, runtime: ToolRuntime, *, call_id: str) -> str:
    """Its runtime is LangGraph's, for this call."""
    return sku


@pytest.mark.parametrize(
    ("function", "injected"),
    [(with_tool_call_id, "tool_call_id"), (with_state, "state"), (with_runtime, "runtime")],
    ids=["InjectedToolCallId", "InjectedState", "ToolRuntime"],
)
def test_parameters_the_framework_injects_are_refused_they_would_change_the_call_id(function, injected, tmp_path):
    with pytest.raises(TypeError, match=rf"injected parameters \['{injected}'\] differ from call to call"):
        receipted_tool(function, run_dir=runs_by_thread(tmp_path))


def test_an_async_tool_needs_an_async_graph_run(run_dir):
    graph = agent_graph(ScriptedModel(), [order_tool("async", run_dir.parent)]).compile()
    with pytest.raises(NotImplementedError, match="does not support sync invocation"):
        graph.invoke({"messages": [ASK]}, {"configurable": {"thread_id": run_dir.name}})
    assert not receipts_of(run_dir)


def test_interrupt_inside_a_receipted_function_puts_the_call_in_doubt_and_never_pauses_the_graph(run_dir):
    """LangGraph's ``interrupt()`` pauses a graph by raising, and on resume runs the node again from
    its start: inside a receipted function the writer sees an exception after the effect may have
    begun, so the call is in doubt (a person settles it), and the graph does not pause for a
    person's answer. Ask before the tool (a node of its own, or ``interrupt_before``)."""

    @receipted(name="place_order", version="1")
    def place_order_approved(order: tools.Order, note: str = "", *, call_id: str) -> str:
        """Place an order with the shop. Returns the order's reference."""
        if interrupt("approve this order?") != "yes":
            raise Rejected("not approved")
        return tools.place_order.__wrapped__(order, note, call_id=call_id)

    tool = receipted_tool(place_order_approved, run_dir=runs_by_thread(run_dir.parent))
    graph = agent_graph(ScriptedModel(), [tool]).compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": run_dir.name}}
    with pytest.raises(CallInDoubt, match="GraphInterrupt"):
        graph.invoke(next_input(()), config)
    assert [receipt["status"] for receipt in receipts_of(run_dir)] == ["unknown"]
    assert graph.get_state(config).interrupts == (), "no interrupt for a person to answer"
    assert tools.effect_lines() == []
