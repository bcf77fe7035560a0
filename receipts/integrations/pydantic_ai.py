"""Receipted tools inside PydanticAI: ``receipted_toolset``.

``receipted_toolset(functions, run_dir=...)`` makes ``@receipted`` functions a
PydanticAI toolset (``Agent(..., toolsets=[...])``). Each call runs in the run
directory that ``run_dir(ctx)`` picks from the agent run's ``RunContext``
(usually its deps), at the attempt the run's ``state.json`` says. The model
sees each function's receipted name, its docstring and its parameters (never
``call_id``); sync and ``async def`` functions both.

What the model sees, and what the caller gets (``receipts.integrations``):

- committed: the function's answer, the recorded one when the call is asked
  for again;
- rejected: ``pydantic_ai.ToolFailed`` with the rejection's message, a failed
  tool result the model reads and goes on from, spending none of the tool's
  retries (the same call in the same attempt is rejected again, from its
  receipt);
- settled as done by a person, with no answer on record: ``SETTLED_AS_DONE``;
- in doubt: ``receipts.CallInDoubt`` is raised out of ``agent.run`` (and
  ``run_sync``) as itself, never shown to the model: ``except CallInDoubt``
  around the run.

Needs PydanticAI (``pip install 'callproof[pydantic-ai]'``); importing this
module does not import it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from receipts.decorator import FunctionAdapter, ReceiptedTool, SettledWithoutAnswer, use_run
from receipts.integrations import SETTLED_AS_DONE, framework, run_directory
from receipts.tools import Rejected

if TYPE_CHECKING:
    from pydantic_ai import RunContext
    from pydantic_ai.toolsets import AbstractToolset, WrapperToolset

__all__ = ["receipted_toolset"]

RunDirOf = Callable[["RunContext[Any]"], "Path | str"]


def receipted_toolset(functions: Iterable[ReceiptedTool], *, run_dir: RunDirOf) -> AbstractToolset[Any]:
    """A PydanticAI toolset of ``@receipted`` functions, writing receipts to ``run_dir(ctx)``.

    ``run_dir`` takes the tool call's ``RunContext`` and returns the run
    directory (``lambda ctx: ctx.deps.run_dir``); it is asked at each call, so
    two agent runs at once, each with its own deps, write each to its own run.
    Each tool is named by its receipted name (``@receipted(name=...)``, the
    function's name by default). ``TypeError`` for a function that is not
    ``@receipted``, or that takes a ``RunContext`` (the context would be one of
    the arguments the call_id is computed from).

    A call whose run directory is not a run (``run_dir`` gave no path, or a
    folder without ``steer.json``) raises out of the agent run: ``TypeError``
    or ``ValueError``, saying which.
    """
    ai = framework("pydantic_ai", "pydantic-ai")
    return _toolset_class()(ai.FunctionToolset([_tool(ai, function) for function in functions]), run_dir)


def _tool(ai: Any, function: Callable[..., Any]) -> Any:
    """The function as a ``pydantic_ai.Tool`` under its receipted name (the receipt's ``tool``)."""
    adapter = getattr(function, "adapter", None)
    if not isinstance(adapter, FunctionAdapter):
        raise TypeError(f"{getattr(function, '__qualname__', function)!r} is not a @receipted function")
    tool = ai.Tool(function, name=adapter.name)
    if tool.takes_ctx:
        raise TypeError(
            f"{adapter.name} takes a RunContext: every argument of a receipted function goes into its call_id, "
            "and the context is new at each call; give the function what it needs another way (a closure)"
        )
    return tool


@functools.cache
def _toolset_class() -> Callable[[AbstractToolset[Any], RunDirOf], WrapperToolset[Any]]:
    """The toolset's class, made once and only when PydanticAI is there to subclass."""
    from pydantic_ai import ToolFailed
    from pydantic_ai.toolsets import WrapperToolset

    @dataclass
    class ReceiptedToolset(WrapperToolset[Any]):
        """Calls each tool inside ``use_run(run_dir(ctx))``, and says its outcome the PydanticAI way."""

        run_dir: RunDirOf

        async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: Any) -> Any:
            # use_run binds a context variable: PydanticAI's worker thread for a sync function
            # and the writer's thread for an async one both run in a copy of this context.
            with use_run(run_directory(name, self.run_dir(ctx), "run_dir(ctx)")):
                try:
                    return await super().call_tool(name, tool_args, ctx, tool)
                except Rejected as rejection:
                    raise ToolFailed(str(rejection)) from rejection
                except SettledWithoutAnswer:
                    return SETTLED_AS_DONE
                # CallInDoubt goes on up as itself: PydanticAI hands a plain exception to the run's caller.

    return ReceiptedToolset
