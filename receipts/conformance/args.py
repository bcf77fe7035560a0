"""The argument sets the checks try beside the example's: derived from it, or drawn from the
adapter's hypothesis strategy."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from receipts.conformance.report import KitError

# Text a target or a normalise may treat unlike the example's: runs of spaces, tabs, accents,
# another script, an emoji, another case. Each generated set carries its number too, so that
# the sets differ from each other and from the example.
_TEXT_VARIANTS: tuple[Callable[[str, int], str], ...] = (
    lambda text, n: f"{text} {n}",
    lambda text, n: f"  {text}   {n}  ",
    lambda text, n: f"{text}\t{n}",
    lambda text, n: f"{text} é{n}",
    lambda text, n: f"{text} 日本 {n}",
    lambda text, n: f"{text.upper()} {n}",
    lambda text, n: f"{text} 🙂 {n}",
    lambda text, n: f"{text}    x    {n}",
)


# An e-mail address stays one: a target that validates addresses (the SMTP adapter) would refuse
# every set derived the text way, and the checks that need other sets would learn nothing.
_ADDRESS_SHAPE = re.compile(r"([^\s@]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)")
_ADDRESS_VARIANTS: tuple[Callable[[str, str, int], str], ...] = (
    lambda local, domain, n: f"{local}+{n}@{domain}",
    lambda local, domain, n: f"{local.upper()}+{n}@{domain}",
    lambda local, domain, n: f"{local}+{n}@{domain.upper()}",
)


def derive_args(example: Any, number: int) -> Any:
    """The example's args made the ``number``-th other way: every text and number changed, the shape kept.

    Text shaped like an e-mail address stays an address (``ops@example.com`` becomes
    ``ops+1@example.com``); other text gets spaces, accents, another script, another case.
    """
    if isinstance(example, dict):
        return {key: derive_args(value, number) for key, value in example.items()}
    if isinstance(example, list):
        return [derive_args(value, number) for value in example]
    if isinstance(example, str):
        if address := _ADDRESS_SHAPE.fullmatch(example):
            variant = _ADDRESS_VARIANTS[(number - 1) % len(_ADDRESS_VARIANTS)]
            return variant(address.group(1), address.group(2), number)
        return _TEXT_VARIANTS[(number - 1) % len(_TEXT_VARIANTS)](example, number)
    if isinstance(example, bool) or example is None:
        return example
    if isinstance(example, int):
        return example + number if example >= 0 else example - number
    if isinstance(example, float):
        return example + number / 8
    return example


def draw_args(strategy: Any, count: int, seed: int) -> list[Any]:
    """``count`` examples of a hypothesis strategy (the adapter's ``args_strategy``), reproducible by ``seed``."""
    try:
        import hypothesis
        from hypothesis import strategies
    except ImportError:
        raise KitError("the adapter's args_strategy is a hypothesis strategy: pip install hypothesis") from None
    if not isinstance(strategy, strategies.SearchStrategy):
        raise KitError(f"args_strategy must be a hypothesis strategy, not a {type(strategy).__name__}")
    drawn: list[Any] = []

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=count, database=None, deadline=None, phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
    @hypothesis.given(strategy)
    def collect(args: Any) -> None:
        drawn.append(json.loads(json.dumps(args)))

    try:
        collect()
    except Exception as error:  # noqa: BLE001 - the user's strategy may fail in any way
        raise KitError(f"args_strategy could not draw args: {type(error).__name__}: {error}") from None
    return drawn[:count]


def prefix_args(example: Any, number: int, *, longer: bool) -> Any:
    """The example's args made so that two calls begin alike: every text ends in `` {number}``, and
    with ``longer`` one digit more (``Fix login 1``, ``Fix login 12``); a number is ``n`` or ``n``
    and one digit more (``4001``, ``40012``); an e-mail address keeps its shape (``ops+1@...``,
    ``ops+12@...``). Each text of the shorter call is the beginning of the longer's."""
    if isinstance(example, dict):
        return {key: prefix_args(value, number, longer=longer) for key, value in example.items()}
    if isinstance(example, list):
        return [prefix_args(value, number, longer=longer) for value in example]
    tail = f"{number}{number + 1}" if longer else f"{number}"
    if isinstance(example, str):
        if address := _ADDRESS_SHAPE.fullmatch(example):
            return f"{address.group(1)}+{tail}@{address.group(2)}"
        return f"{example} {tail}"
    if isinstance(example, bool) or example is None:
        return example
    if isinstance(example, int):
        shorter = example + number if example >= 0 else example - number
        return int(f"{shorter}{number + 1}") if longer else shorter
    if isinstance(example, float):
        return example + number / 8 + (1 / 1024 if longer else 0)
    return example
