"""The LangGraph agent: a model node and LangGraph's ``ToolNode``, checkpointed on disk.

The graph's checkpoints (``SqliteSaver``) are a file beside the run directory, keyed by
the thread_id, which is the run directory's name: started again, the agent resumes its
thread. A tool call left pending (the kill, a call in doubt) runs again; a thread that
ended is asked again. The model is ``ScriptedModel``, a LangChain chat model that needs
no network. ``tests/test_integration_langgraph.py`` builds its graphs here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import langsmith
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy
from pydantic import Field

from receipts.integrations.langgraph import receipted_tool, runs_by_thread
from tests.framework_agents import tools

ASK = "Place the order."


class ScriptedModel(BaseChatModel):
    """A chat model that runs offline: since the last person's message, it asks for ``tool``
    with ``args`` until it has been given ``asks`` tool results, then answers with them
    (``tools.final_text``). It reads only the messages, so a resumed thread goes on where it
    was. ``bind_tools`` gives it the tools as a provider's API gets them (``seen_tools``)."""

    tool: str = "place_order"
    args: dict[str, Any] = Field(default_factory=lambda: dict(tools.ORDER_CALL))
    asks: int = 1
    seen_tools: list[list[dict[str, Any]]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, Any]:
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:  # fmt: skip
        self.seen_tools.append(kwargs.get("tools", []))
        last_ask = max(index for index, message in enumerate(messages) if isinstance(message, HumanMessage))
        results = [message.content for message in messages[last_ask:] if isinstance(message, ToolMessage)]
        if len(results) < self.asks:
            number = sum(isinstance(message, ToolMessage) for message in messages) + 1
            call = {"name": self.tool, "args": self.args, "id": f"call-{number}", "type": "tool_call"}
            answer = AIMessage(content="", tool_calls=[call])
        else:
            answer = AIMessage(content=tools.final_text(results))
        return ChatResult(generations=[ChatGeneration(message=answer)])


def agent_graph(model: BaseChatModel, agent_tools: Sequence[BaseTool], *, retry_policy: RetryPolicy | None = None,
                **tool_node: Any) -> StateGraph:  # fmt: skip
    """The ReAct loop: the model, then ``ToolNode(agent_tools, **tool_node)`` while the model asks for tools."""
    bound = model.bind_tools(agent_tools)

    def think(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", think)
    builder.add_node("tools", ToolNode(agent_tools, **tool_node), retry_policy=retry_policy)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder


def next_input(pending: tuple[str, ...]) -> dict[str, Any] | None:
    """The thread's next input: nothing while a step is pending (it resumes), else the question."""
    return None if pending else {"messages": [HumanMessage(ASK)]}


def main() -> None:
    options = tools.arguments()
    langsmith.configure(enabled=False)  # LangChain's tracer: nothing leaves the machine
    run_dir: Path = options.run_dir
    order_tool = receipted_tool(tools.place_order_async if options.use_async else tools.place_order,
                                run_dir=runs_by_thread(run_dir.parent))  # fmt: skip
    builder = agent_graph(ScriptedModel(asks=2 if options.twice else 1), [order_tool])
    config: RunnableConfig = {"configurable": {"thread_id": run_dir.name}}
    checkpoints = str(run_dir.parent / f"{run_dir.name}.checkpoints.sqlite")

    def run() -> str:
        with SqliteSaver.from_conn_string(checkpoints) as saver:
            graph = builder.compile(checkpointer=saver)
            # durability="sync": each step's checkpoint is on disk before the next step runs.
            output = graph.invoke(next_input(graph.get_state(config).next), config, durability="sync")
        return str(output["messages"][-1].content)

    async def run_async() -> str:
        async with AsyncSqliteSaver.from_conn_string(checkpoints) as saver:
            graph = builder.compile(checkpointer=saver)
            state = await graph.aget_state(config)
            output = await graph.ainvoke(next_input(state.next), config, durability="sync")
        return str(output["messages"][-1].content)

    tools.finish(lambda: asyncio.run(run_async()) if options.use_async else run())


if __name__ == "__main__":
    main()
