"""Counting a call's effects on its target: by a counter the user gives, else the adapter's
evidence, else its query; and the counter of the built-in ``send_message``'s outbox."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts.conformance.report import KitError
from receipts.tools import ABSENT, NOT_DONE, PRESENT, adapter_can_query

Counter_ = Callable[[Path, Mapping[str, Any], str], int]


class Effects:
    """How many effects of one call the target holds: ``None`` when it cannot be told."""

    def __init__(self, adapter: Any, args: dict[str, Any], counter: Counter_ | None, counter_spec: str | None):
        self.adapter, self.args, self.counter = adapter, args, counter
        if counter is not None:
            self.by = f"the counter {counter_spec}"
        elif callable(getattr(adapter, "evidence", None)) and getattr(adapter, "checks_commits", True) is not False:
            self.by = "the adapter's evidence (present or absent: a counter would tell one effect from two)"
        elif adapter_can_query(adapter):
            self.by = "the adapter's query (happened or not: a counter would tell one effect from two)"
        else:
            raise KitError(
                f"nothing counts {adapter.name}'s effects: it has neither a query nor evidence that looks at its "
                "target (checks_commits = False); "
                "give --counter MODULE:FUNC, FUNC(run_dir, args, call_id) -> int"
            )

    def count(self, run_dir: Path, call_id: str, args: Mapping[str, Any] | None = None) -> int | None:
        """The effects of the call ``call_id`` (of ``args``, normalised; the example's by default)."""
        args = json.loads(json.dumps(self.args if args is None else args))  # each look gets its own copy
        try:
            if self.counter is not None:
                found = self.counter(run_dir, args, call_id)
                return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else None
            if self.by.startswith("the adapter's evidence"):
                verdict = getattr(self.adapter.evidence(run_dir, args, call_id), "verdict", None)
                return {PRESENT: 1, ABSENT: 0}.get(str(verdict))
            answer = self.adapter.query(run_dir, args, call_id)
        except Exception:  # noqa: BLE001 - a count that fails is a count nobody has
            return None
        if answer is NOT_DONE:
            return 0
        return 1 if isinstance(answer, dict) else None


def count_text(count: int | None) -> str:
    if count is None:
        return "effects not countable"
    return f"{count} effect" + ("" if count == 1 else "s")


# --- counters for the built-in targets ------------------------------------------------------


def count_outbox_lines(run_dir: Path, args: Mapping[str, Any], call_id: str) -> int:
    """``send_message``'s effects: the lines of outbox.jsonl that carry the call_id (torn ones too)."""
    try:
        data = (Path(run_dir) / "outbox.jsonl").read_bytes()
    except FileNotFoundError:
        return 0
    return sum(call_id.encode() in line for line in data.splitlines())
