"""The tool every framework agent calls: ``place_order``, an effect with no query.

Each run of its body appends a line to ``$EFFECTS_FILE`` (the shop's side, outside
the run directory). With no query, a call a kill left in doubt waits for a person.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel

from receipts import CallInDoubt, receipted

# What every scripted model asks for: the tool's name and its arguments as JSON.
ORDER_CALL: dict[str, Any] = {"order": {"sku": "A-1", "quantity": 2}, "note": "rush"}


class Order(BaseModel):
    sku: str
    quantity: int


def _ship(order: Order, note: str, call_id: str) -> str:
    if not isinstance(order, Order):  # the function gets the object the framework gave
        raise TypeError(f"place_order got {type(order).__name__}, not an Order")
    with Path(os.environ["EFFECTS_FILE"]).open("a") as effects:
        effects.write(json.dumps({"call_id": call_id, "sku": order.sku, "quantity": order.quantity}) + "\n")
        effects.flush()
        os.fsync(effects.fileno())
    return f"order {call_id[:12]}: {order.quantity} x {order.sku}"


@receipted(name="place_order", version="1")
def place_order(order: Order, note: str = "", *, call_id: str) -> str:
    """Place an order with the shop. Returns the order's reference."""
    return _ship(order, note, call_id)


@receipted(name="place_order", version="1")
async def place_order_async(order: Order, note: str = "", *, call_id: str) -> str:
    """Place an order with the shop. Returns the order's reference."""
    return _ship(order, note, call_id)


def effect_lines() -> list[dict[str, Any]]:
    path = Path(os.environ["EFFECTS_FILE"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--async", dest="use_async", action="store_true", help="the async def tool")
    parser.add_argument("--twice", action="store_true", help="the model asks for the same call again")
    return parser.parse_args()


def final_text(tool_results: list[Any]) -> str:
    """The scripted model's last answer: the tool results it was given, in order."""
    return json.dumps([str(result) for result in tool_results])


def finish(run: Callable[[], str]) -> NoReturn:
    """Run the agent; print its output, or the call in doubt that stopped it (exit 3)."""
    try:
        output = run()
    except CallInDoubt as doubt:
        print(json.dumps({"in_doubt": doubt.outcome.call_id}))
        sys.exit(3)
    print(json.dumps({"output": output}))
    sys.exit(0)
