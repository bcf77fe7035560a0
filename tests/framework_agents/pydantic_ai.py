"""The PydanticAI agent (``tests/framework_agents/__init__.py``): a ``FunctionModel`` scripted to order, and
the run directory in the run's deps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from receipts.integrations.pydantic_ai import receipted_toolset
from tests.framework_agents import tools


@dataclass
class Deps:
    run_dir: Path


def scripted_model(calls: int) -> FunctionModel:
    """Asks for ``place_order`` until it has had ``calls`` answers, then says them all."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart) and part.tool_name == "place_order"
        ]
        if len(results) < calls:
            return ModelResponse(parts=[ToolCallPart("place_order", dict(tools.ORDER_CALL))])
        return ModelResponse(parts=[TextPart(tools.final_text(results))])

    return FunctionModel(respond)


def main() -> None:
    options = tools.arguments()
    Agent.instrument_all(False)  # no tracing, whatever the environment
    tool = tools.place_order_async if options.use_async else tools.place_order
    agent = Agent(
        scripted_model(2 if options.twice else 1),
        deps_type=Deps,
        toolsets=[receipted_toolset([tool], run_dir=lambda ctx: ctx.deps.run_dir)],
    )
    tools.finish(lambda: agent.run_sync("Order two A-1, rush.", deps=Deps(options.run_dir)).output)


if __name__ == "__main__":
    main()
