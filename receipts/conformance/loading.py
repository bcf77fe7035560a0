"""Loading what the user names: ``MODULE:NAME``, an adapter or a counter, imported as
``python -m`` would from the current folder."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from receipts.conformance.report import KitError


def load_object(spec: str, what: str) -> Any:
    """``MODULE:NAME`` (NAME may be dotted), imported as ``python -m`` would from the current folder."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise KitError(f"{what} must be MODULE:NAME, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script's path starts at its own folder
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - the user's module may fail in any way as it loads
        raise KitError(f"{what}: cannot import {module_name!r}: {type(error).__name__}: {error}") from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise KitError(f"{what}: {module_name!r} has no {attribute!r}") from None
    return found


def load_adapter(spec: str) -> Any:
    """The adapter ``spec`` names: an instance as it is, a class or zero-argument factory called."""
    found = load_object(spec, "the adapter")
    if not _is_adapter(found) and callable(found):
        try:
            inspect.signature(found).bind()
        except (TypeError, ValueError):
            raise KitError(f"{spec} needs arguments: name an instance or a zero-argument factory") from None
        try:
            found = found()
        except Exception as error:  # noqa: BLE001 - the user's factory may fail in any way
            raise KitError(f"{spec} could not build the adapter: {type(error).__name__}: {error}") from None
    if not _is_adapter(found):
        raise KitError(
            f"{spec} is not an adapter: it needs name and version (text), normalise and execute "
            "(receipts/tools.py, Adapter)"
        )
    return found


def _is_adapter(value: Any) -> bool:
    if isinstance(value, type):
        return False
    names = [getattr(value, attribute, None) for attribute in ("name", "version")]
    methods = [getattr(value, attribute, None) for attribute in ("normalise", "execute")]
    return all(isinstance(name, str) and name for name in names) and all(callable(method) for method in methods)
