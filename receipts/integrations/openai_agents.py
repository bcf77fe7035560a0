"""Receipted tools inside the OpenAI Agents SDK (``pip install 'callproof[openai-agents]'``).

``receipted_tool(fn, run_dir=...)`` makes an ``@receipted`` function the SDK's
``FunctionTool``, built by the SDK's own ``function_tool``: the model sees the
tool's name (``@receipted``'s ``name``), its docstring and its parameters, never
``call_id``. The run directory comes from the run's context object
(``Runner.run(agent, input, context=...)``) through the ``run_dir`` callable, once
per tool call; the attempt from the run's ``state.json``.

What the model sees, and what the code that started the run sees:

- committed: the function's answer (recorded once, given again for the same call);
- rejected: a failed tool call, through the SDK's ``failure_error_function``
  channel: the text says the call was rejected, its kind and reason; the model
  goes on;
- settled by a person as done, no answer on record: ``SETTLED_AS_DONE``;
- in doubt: nothing. The run stops and ``Runner.run`` (``run_sync``,
  ``run_streamed``'s events) raises ``receipts.CallInDoubt``: an instance of a
  subclass that is also the SDK's ``AgentsException``, which the SDK lets through
  as it is (it wraps a tool's other exceptions in its ``UserError``) and gives the
  run's items as ``run_data``. Catch it with ``except CallInDoubt``.

Arguments the model got wrong (the SDK's ``ModelBehaviorError``) reach the model
as the SDK's default tool error, so it may try again. Any other error stops the
run: a ``run_dir`` that gives no run directory is the SDK's ``UserError``; the
writer's own errors (a run whose state refuses calls) come out as the SDK wraps
them, a ``UserError`` with the original as ``__cause__``.

Importing this module does not import the SDK: ``receipted_tool`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

from receipts.decorator import CallInDoubt, ReceiptedTool, SettledWithoutAnswer, use_run
from receipts.integrations import SETTLED_AS_DONE, framework, in_doubt_passing, run_directory
from receipts.tools import Rejected

if TYPE_CHECKING:
    from agents import FunctionTool, RunContextWrapper

__all__ = ["receipted_tool"]


def _sdk() -> Any:
    return framework("agents", "openai-agents")


def receipted_tool(
    tool: ReceiptedTool,
    *,
    run_dir: Callable[[RunContextWrapper[Any]], Path | str],
    **function_tool_options: Any,
) -> FunctionTool:
    """The ``@receipted`` function ``tool`` as a ``FunctionTool`` for ``Agent(tools=[...])``.

    ``run_dir(wrapper)`` gets the SDK's ``RunContextWrapper`` of the call (a
    ``ToolContext``) and returns the run directory (made by ``runtime.run_init``)
    that the call's receipt goes to, e.g. ``lambda wrapper: wrapper.context.run_dir``.
    ``tool`` may be ``def`` or ``async def``; it must not take the SDK's context
    (its arguments are what the call_id is computed from). Other keyword
    arguments go to the SDK's ``function_tool`` (``description_override``,
    ``needs_approval``, ...), except ``failure_error_function``: this integration
    decides what reaches the model; and ``timeout`` only with
    ``timeout_behavior="raise_exception"``: a timed-out call may still take
    effect, so the run stops rather than the model be told it failed.

    When one of several tool calls of a model response stops the run, the SDK
    cancels the others: an ``async def`` function's coroutine, cancelled or
    left on a loop that stopped, ends its call ``unknown``, for a person
    (docs/runtime-authors.md, "The OpenAI Agents SDK").
    """
    sdk = _sdk()
    adapter = getattr(tool, "adapter", None)
    if adapter is None:
        raise TypeError(f"{getattr(tool, '__name__', tool)!r} is not a receipted function: decorate it with @receipted")
    if "failure_error_function" in function_tool_options:
        raise TypeError("receipted_tool sets failure_error_function itself: rejections reach the model, doubt never")
    if "timeout" in function_tool_options and function_tool_options.get("timeout_behavior") != "raise_exception":
        # The SDK stops waiting and tells the model it timed out, while the call goes on and may take
        # effect: the model, told it failed, may ask again otherwise (a new call_id, a second effect).
        raise TypeError(
            "a timed-out call may still take effect, which the model must not be told it did not: "
            "give timeout_behavior='raise_exception' with timeout, so that a timeout stops the run"
        )
    if not callable(run_dir):
        raise TypeError(f"run_dir must be a callable of the run's context, not {run_dir!r}")
    signature = inspect.signature(tool)
    for parameter in signature.parameters.values():
        if _mentions(parameter.annotation, sdk.RunContextWrapper):  # a ToolContext is one too
            raise TypeError(
                f"{adapter.name} takes the SDK's run context ({parameter.name}): its arguments make its call_id, "
                "and the context is not an argument of the call; read what you need in run_dir or outside the tool"
            )

    name = adapter.name
    # The SDK's own exception: it raises that as it is, where it wraps any other in UserError.
    in_doubt = in_doubt_passing(sdk.AgentsException, "AgentRunInDoubt", __name__)

    if inspect.iscoroutinefunction(tool):

        async def invoke(wrapper: Any, /, *args: Any, **kwargs: Any) -> Any:
            with use_run(_run_directory(run_dir, wrapper, name)):
                try:
                    return await tool(*args, **kwargs)
                except SettledWithoutAnswer:
                    return SETTLED_AS_DONE
                except CallInDoubt as doubt:
                    raise in_doubt(str(doubt), doubt.outcome) from doubt

    else:

        def invoke(wrapper: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            with use_run(_run_directory(run_dir, wrapper, name)):
                try:
                    return tool(*args, **kwargs)
                except SettledWithoutAnswer:
                    return SETTLED_AS_DONE
                except CallInDoubt as doubt:
                    raise in_doubt(str(doubt), doubt.outcome) from doubt

    # What function_tool reads: the tool's name, docstring and parameters, after the run's context.
    context = "run_context"
    while context in signature.parameters:
        context = f"_{context}"
    invoke.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[
            inspect.Parameter(context, inspect.Parameter.POSITIONAL_ONLY, annotation=sdk.RunContextWrapper[Any]),
            *signature.parameters.values(),
        ]
    )
    invoke.__annotations__ = {context: sdk.RunContextWrapper[Any], **tool.__annotations__}
    invoke.__name__ = invoke.__qualname__ = name
    invoke.__doc__ = tool.__doc__
    invoke.__module__ = tool.__module__
    invoke.__wrapped__ = tool  # type: ignore[attr-defined]  # get_type_hints finds the tool's module there
    return sdk.function_tool(invoke, failure_error_function=_tell_the_model, **function_tool_options)


def _mentions(annotation: Any, kind: type) -> bool:
    """Whether ``annotation`` is ``kind`` or a subclass, alone or inside ``Optional``, ``Annotated``, ..."""
    origin = get_origin(annotation) or annotation
    if isinstance(origin, type) and issubclass(origin, kind):
        return True
    return any(_mentions(argument, kind) for argument in get_args(annotation))


def _tell_the_model(wrapper: RunContextWrapper[Any], error: Exception) -> str:
    """The SDK's failure_error_function: what reaches the model when the tool call failed, or a raise
    that stops the run."""
    sdk = _sdk()
    if isinstance(error, Rejected):
        return f"rejected ({error.kind}), nothing was done: {error}"
    if isinstance(error, sdk.ModelBehaviorError):  # arguments the model can correct
        return sdk.default_tool_error_function(wrapper, error)
    raise error


def _run_directory(run_dir: Callable[[Any], Path | str], wrapper: Any, name: str) -> Path:
    """The run directory ``run_dir`` gives for this call, or the SDK's ``UserError`` saying what is wrong."""
    sdk = _sdk()
    try:
        given = run_dir(wrapper)
    except Exception as error:
        hint = " (the run was started without context=...)" if wrapper.context is None else ""
        raise sdk.UserError(f"{name}: run_dir could not give the run directory{hint}: {error!r}") from error
    try:
        return run_directory(name, given)
    except (TypeError, ValueError) as error:
        raise sdk.UserError(str(error)) from None
