"""Tools of a runtime, run in child processes the tests kill or start together.

``python -m tests.adapter_children invoice RUN_DIR [--unqueried]``: one call of a
``@receipted`` function whose effect is a line in ``$EFFECTS_FILE`` (one line
per time the function runs). ``python -m tests.adapter_children sql RUN_DIR
DATABASE TABLE``: one ``SqlRow`` call into ``TABLE`` of ``DATABASE``
(``sqlite:PATH`` or a PostgreSQL URL). With ``$START_FILE`` set, a child
waits for that file before calling, so that several start together. Each
prints its outcome as JSON.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from receipts import receipted, runtime
from receipts.adapters.sql import SqlRow
from receipts.tools import NOT_DONE

INVOICE = {"customer": "acme", "amount_cents": 1200}
ROW = {"title": "deploy", "body": "it's done; DROP TABLE notes; --"}


def effects_file() -> Path:
    return Path(os.environ["EFFECTS_FILE"])


def effect_lines(call_id: str | None = None) -> list[dict[str, Any]]:
    """The lines the function wrote (for ``call_id``): each one a time it ran."""
    try:
        lines = [json.loads(line) for line in effects_file().read_text().splitlines()]
    except FileNotFoundError:
        return []
    return [line for line in lines if call_id is None or line["call_id"] == call_id]


def find_invoice(customer: str, amount_cents: int, *, call_id: str) -> Any:
    """The billing side's lookup by idempotency key."""
    found = effect_lines(call_id)
    return {"invoice": found[0]["invoice"], "amount_cents": amount_cents} if found else NOT_DONE


def _bill(customer: str, amount_cents: int, call_id: str) -> dict[str, Any]:
    invoice = f"inv-{call_id[:12]}"
    with effects_file().open("a") as effects:
        effects.write(json.dumps({"call_id": call_id, "invoice": invoice, "customer": customer}) + "\n")
        effects.flush()
        os.fsync(effects.fileno())
    return {"invoice": invoice, "amount_cents": amount_cents}


@receipted(name="create_invoice", version="1.0.0", query=find_invoice)
def create_invoice(customer: str, amount_cents: int, *, call_id: str) -> dict[str, Any]:
    """Bill a customer (the call_id is the billing side's idempotency key)."""
    return _bill(customer, amount_cents, call_id)


@receipted(name="create_invoice_unqueried", version="1.0.0")
def create_invoice_unqueried(customer: str, amount_cents: int, *, call_id: str) -> dict[str, Any]:
    """The same effect, from a tool that cannot ask the billing side."""
    return _bill(customer, amount_cents, call_id)


def sql_adapter(database: str, table: str) -> SqlRow:
    if database.startswith("sqlite:"):
        path = database.removeprefix("sqlite:")

        def connect() -> Any:
            return sqlite3.connect(path, timeout=60)
    else:
        import psycopg

        def connect() -> Any:
            return psycopg.connect(database)

    return SqlRow(name="insert_note", connect=connect, table=table, columns=("title", "body"))


def _wait_for_start() -> None:
    start = os.environ.get("START_FILE")
    while start and not os.path.exists(start):
        time.sleep(0.005)


def main(argv: list[str]) -> int:
    kind, run_dir = argv[0], Path(argv[1])
    _wait_for_start()
    if kind == "invoice":
        tool = create_invoice_unqueried if "--unqueried" in argv else create_invoice
        outcome = tool.call_in(run_dir, **INVOICE)
    else:
        adapter = sql_adapter(argv[2], argv[3])
        outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, ROW)
    print(json.dumps(outcome.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
