"""Receipted tools in LangGraph: ``@receipted`` functions as LangChain tools, for ``ToolNode``.

::

    from receipts.integrations.langgraph import receipted_tool, runs_by_thread

    order_tool = receipted_tool(place_order, run_dir=runs_by_thread("runs"))
    builder.add_node("tools", ToolNode([order_tool]))
    graph.invoke(inputs, {"configurable": {"thread_id": "run-1"}})  # its receipts: runs/run-1

The tool is a ``langchain_core.tools.StructuredTool``: the model is given the
function's name, docstring and parameters (never ``call_id``). Each time it
runs, ``run_dir(config)`` picks the run directory from the graph run's
``RunnableConfig``; the attempt is the run's own (``state.json``). Outcomes are
as ``receipts.integrations`` says: a rejection becomes LangChain's error
``ToolMessage`` (``status="error"``) and the model goes on; a call in doubt
raises ``CallInDoubt`` out of ``invoke``, ``ainvoke``, ``stream`` or
``astream``, never a message to the model. Needs the ``langgraph`` extra; importing this module
imports neither LangGraph nor LangChain.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from receipts import protocol
from receipts.decorator import CallInDoubt, FunctionAdapter, SettledWithoutAnswer, use_run
from receipts.integrations import SETTLED_AS_DONE, framework, in_doubt_passing, run_directory
from receipts.tools import Rejected

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import StructuredTool

    from receipts.decorator import ReceiptedTool

__all__ = ["receipted_tool", "runs_by_thread"]

EXTRA = "langgraph"


def runs_by_thread(root: Path | str) -> Callable[[RunnableConfig], Path]:
    """A ``run_dir`` for ``receipted_tool``: ``root / thread_id``, from the graph run's
    ``config["configurable"]["thread_id"]`` (LangGraph's name for one run, which a checkpointer
    resumes). The thread_id names a folder, so it must be a run id: 1 to 128 of ``A-Za-z0-9._-``,
    not starting with a dot; a run without one, or with another, is refused (``ValueError``)."""

    def run_dir(config: RunnableConfig) -> Path:
        thread_id = (config.get("configurable") or {}).get("thread_id")
        if thread_id is None:
            raise ValueError(
                "the graph run has no thread_id, which names its run directory: "
                "invoke it with config={'configurable': {'thread_id': ...}}"
            )
        if not protocol.valid_run_id(str(thread_id)):
            raise ValueError(
                f"thread_id {str(thread_id)!r} cannot name a run directory: "
                "1 to 128 of A-Za-z0-9._-, not starting with a dot"
            )
        return Path(root) / str(thread_id)

    return run_dir


def receipted_tool(function: ReceiptedTool, *, run_dir: Callable[[RunnableConfig], Path | str]) -> StructuredTool:
    """The LangChain tool (a ``StructuredTool``) of a ``@receipted`` function, for LangGraph's ``ToolNode``.

    The model sees the ``@receipted`` name, the docstring (required) and the
    parameters. ``run_dir(config)`` gives the run directory of the graph run
    (``runs_by_thread(root)``, or your own function of the ``RunnableConfig``);
    it must be a run made with ``runtime.run_init`` before the graph runs.

    - Committed: the function's answer; asked for again, the recorded answer.
    - Rejected: LangChain's error ``ToolMessage`` (``status="error"``) with the
      reason; the model may go on.
    - Settled as done by a person, no answer recorded: ``SETTLED_AS_DONE``.
    - In doubt: ``CallInDoubt`` leaves the graph run, to the code that started
      it (``except receipts.CallInDoubt``). It is also LangGraph's
      ``GraphBubbleUp``, so no ``handle_tool_errors`` of ``ToolNode`` makes it a
      message, and a node's retry policy does not run the tool again. With a
      checkpointer the tool call stays pending, and runs again (answered from
      its receipt) when the thread is resumed (``invoke(None, config)``).

    An ``async def`` function makes a tool for ``ainvoke`` and ``astream`` only.
    Parameters that LangChain or LangGraph inject (``InjectedToolCallId``,
    ``InjectedState``, ``ToolRuntime``, ...) are refused (``TypeError``): they
    differ between calls, and in the call_id they would make a call asked for
    again a new one, run again.
    """
    adapter = getattr(function, "adapter", None)
    if not isinstance(adapter, FunctionAdapter):
        raise TypeError(f"{function!r} is not a @receipted function: decorate it with receipts.receipted first")
    if not callable(run_dir):
        raise TypeError("run_dir must be a function of the graph run's config, e.g. runs_by_thread(root)")
    tools = framework("langchain_core.tools", EXTRA)
    runnables = framework("langchain_core.runnables", EXTRA)
    description = inspect.getdoc(function)
    if not description:
        raise TypeError(f"{adapter.name} has no docstring: it is what tells the model what the tool does")
    inferred = tools.StructuredTool.from_function(function, name=adapter.name, description=description)
    injected = sorted(set(inferred.get_input_schema().model_fields) - set(inferred.tool_call_schema.model_fields))
    if injected:
        raise TypeError(
            f"{adapter.name}: injected parameters {injected} differ from call to call, and the call_id is computed "
            "from every parameter: a call asked for again would be a new call, and run again"
        )

    def bound_run() -> Path:
        return run_directory(adapter.name, run_dir(runnables.ensure_config()), "run_dir(config)")

    if inspect.iscoroutinefunction(function):

        async def awaited(**arguments: Any) -> Any:
            with use_run(bound_run()):
                try:
                    return await function(**arguments)
                except (SettledWithoutAnswer, Rejected, CallInDoubt) as outcome:
                    return _told(outcome)

        return tools.StructuredTool.from_function(
            coroutine=awaited, name=adapter.name, description=description, args_schema=inferred.args_schema,
            handle_tool_error=True,
        )  # fmt: skip

    def called(**arguments: Any) -> Any:
        with use_run(bound_run()):
            try:
                return function(**arguments)
            except (SettledWithoutAnswer, Rejected, CallInDoubt) as outcome:
                return _told(outcome)

    return tools.StructuredTool.from_function(
        func=called, name=adapter.name, description=description, args_schema=inferred.args_schema,
        handle_tool_error=True,
    )  # fmt: skip


def _told(outcome: Exception) -> str:
    """What the model is told of an outcome the function raised, or what stops the graph run."""
    if isinstance(outcome, SettledWithoutAnswer):
        return SETTLED_AS_DONE
    if isinstance(outcome, Rejected):
        # LangChain's channel for a failed tool: the tool (handle_tool_error) makes it an error ToolMessage.
        raise framework("langchain_core.tools", EXTRA).ToolException(str(outcome)) from outcome
    assert isinstance(outcome, CallInDoubt)
    # A GraphBubbleUp: ToolNode re-raises it whatever its handle_tool_errors, and no retry policy catches it.
    graph_bubble_up = framework("langgraph.errors", EXTRA).GraphBubbleUp
    in_doubt = in_doubt_passing(graph_bubble_up, "CallInDoubtInGraph", __name__)
    raise in_doubt(str(outcome), outcome.outcome) from outcome
