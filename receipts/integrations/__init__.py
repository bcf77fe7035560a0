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

import importlib
from types import ModuleType

__all__ = ["SETTLED_AS_DONE", "framework"]

SETTLED_AS_DONE = "Done: a person confirmed that this call took effect. Its answer was not recorded."


def framework(module: str, extra: str) -> ModuleType:
    """The framework's module, or ``ImportError`` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{module} is not installed: pip install 'callproof[{extra}]' ({error})") from error
