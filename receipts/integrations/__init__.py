"""Receipted tools inside the agent frameworks people write agents with.

One module a framework: ``receipts.integrations.pydantic_ai``,
``receipts.integrations.langgraph``, ``receipts.integrations.openai_agents``.
Each makes ``@receipted`` functions the framework's tools, with the run
directory taken from the framework's own per-run context and the attempt from
the run's state. Each needs its framework (``pip install 'callproof[EXTRA]'``);
importing the module does not import the framework, so the writer loads, and is
vendored, with the standard library alone.

What the model sees is the same in each (docs/runtime-authors.md, "Inside an
agent framework"): a committed call's answer, recorded once and given again for
the same call; a rejection, as the framework tells a model that a tool failed;
a call a person settled as done with no answer on record, ``SETTLED_AS_DONE``.
A call in doubt is never handed to the model, which might try again with other
arguments (a new call_id, a second effect): ``CallInDoubt`` stops the agent run
and reaches the code that started it, and a person settles it.
"""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from types import ModuleType

from receipts.decorator import CallInDoubt

__all__ = ["SETTLED_AS_DONE", "framework", "in_doubt_passing", "run_directory"]

SETTLED_AS_DONE = "Done: a person confirmed that this call took effect. Its answer was not recorded."


def framework(module: str, extra: str) -> ModuleType:
    """The framework's module, or ``ImportError`` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{module} is not installed: pip install 'callproof[{extra}]' ({error})") from error


def run_directory(tool: str, given: object, asked: str = "run_dir") -> Path:
    """The run directory that ``asked`` (the user's ``run_dir`` callable, as called) gave for a call
    of ``tool``: ``TypeError`` when it is not a path, ``ValueError`` when no run is there. Checked
    before the call, so that the error says what is wrong rather than what the writer finds missing."""
    if not isinstance(given, str | os.PathLike):
        raise TypeError(f"{tool}: {asked} gave {given!r}, not a path to a run directory")
    path = Path(given)
    if not (path / "steer.json").is_file():
        raise ValueError(
            f"{tool}: {path} is not a run directory (no steer.json): make it with `callproof init` "
            "or receipts.runtime.run_init before the agent runs"
        )
    return path


@functools.cache
def in_doubt_passing(framework_error: type[BaseException], name: str, module: str) -> type[CallInDoubt]:
    """``CallInDoubt`` that is also ``framework_error``, the exception a framework lets through its
    tool error handling as it is: ``except CallInDoubt`` around the agent run still catches it, and
    the model is never told. Made on first use (the framework is imported only then), named as if
    defined at the top of the integration's ``module``."""
    passing = type(name, (CallInDoubt, framework_error), {"__module__": module, "__doc__": CallInDoubt.__doc__})
    passing.__qualname__ = name
    return passing
