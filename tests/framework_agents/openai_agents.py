"""The OpenAI Agents SDK's agent for tests/test_frameworks.py (the contract: tests/framework_agents/__init__.py).

The model is the SDK's own offline ``agents.testing.ScriptedModel``; the run directory reaches
the tool through the run's context object (``Runner.run(..., context=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from receipts.integrations.openai_agents import receipted_tool
from tests.framework_agents import tools


@dataclass
class Shop:
    run_dir: Path


def tool_outputs(model_input: Any) -> list[Any]:
    """The tool results the model was given, in order: the function_call_output items of its input."""
    return [item["output"] for item in model_input if item.get("type") == "function_call_output"]


def scripted_model(twice: bool) -> ScriptedModel:
    """Asks for place_order, with ``twice`` again for the same call (a new tool call id, the same
    arguments: a lost tool response), then answers with the results it was given."""
    asks = [[function_call("place_order", tools.ORDER_CALL, call_id=f"call-{n}")] for n in range(1, 2 + twice)]
    final = ModelStep.respond(lambda call: [assistant_message(tools.final_text(tool_outputs(call.input)))])
    return ScriptedModel([*asks, final])


def main() -> None:
    set_tracing_disabled(True)  # no trace export: the run stays offline
    options = tools.arguments()
    function = tools.place_order_async if options.use_async else tools.place_order
    agent = Agent(
        name="shop",
        model=scripted_model(options.twice),
        tools=[receipted_tool(function, run_dir=lambda wrapper: wrapper.context.run_dir)],
    )
    shop = Shop(options.run_dir)
    tools.finish(lambda: str(Runner.run_sync(agent, "Order two A-1, rush.", context=shop).final_output))


if __name__ == "__main__":
    main()
