"""The floor for bench_import.py: the same rows from the same files, the plainest way.

The standard `json` module, no checks, `executemany` into tables with the
importer's columns and one index each (the unique key: run and seq, run and
call_id), in one transaction. The importer's own tables carry five more
indexes on events and six on calls, which its import pays for and this does not.

    python tests/bench/floor_import.py RUN_DIR (SQLITE_FILE | postgres://...)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EVENT_COLUMNS = (
    "run_id, seq, line_no, ts, type, call_id, client_submission_id, disposition, request_digest, line_sha256, payload"
)
CALL_COLUMNS = (
    "run_id, call_id, receipt_present, file_sha256, declared_call_id, status, tool, tool_version, identity, "
    "contract_sha256, attempt, args, input_sha256, output_sha256, result, error, error_kind, queryable, "
    "created_at, updated_at, recomputed_call_id, verification, decision, decision_reason"
)
# Each floor table: the importer's columns, made from its table, with its one unique index.
FLOOR_TABLES = (
    ("floor_event", "receipts_event", EVENT_COLUMNS, "run_id, seq"),
    ("floor_call", "receipts_call", CALL_COLUMNS, "run_id, call_id"),
)


def sql_time(text: str) -> str:
    return text.replace("T", " ").rstrip("Z")


def main(run: Path, target: str) -> float:
    started = time.perf_counter()
    connection: Any  # a DB-API connection, of psycopg or of sqlite3
    if target.startswith("postgres"):
        import psycopg

        connection, mark = psycopg.connect(target), "%s"
    else:
        import sqlite3

        connection, mark = sqlite3.connect(target), "?"
    cursor = connection.cursor()
    for table, model_table, columns, key in FLOOR_TABLES:
        cursor.execute(f"DROP TABLE IF EXISTS {table}")
        empty = "WITH NO DATA" if mark == "%s" else "WHERE 0"
        cursor.execute(f"CREATE TABLE {table} AS SELECT {columns} FROM {model_table} {empty}")
        cursor.execute(f"CREATE UNIQUE INDEX {table}_key ON {table} ({key})")
    connection.commit()
    started = time.perf_counter()  # the tables are made: from here, what an import does
    run_pk = 1
    event_sql = f"INSERT INTO floor_event ({EVENT_COLUMNS}) VALUES ({', '.join([mark] * 11)})"
    batch: list[tuple[Any, ...]] = []
    with open(run / "events.jsonl", "rb") as ledger:
        for number, line in enumerate(ledger, 1):
            event = json.loads(line)
            row = (run_pk, event["seq"], number, sql_time(event["ts"]), event["type"], event.get("call_id", ""))
            batch.append((*row, "", "", "", "", line[:-1].decode()))
            if len(batch) == 5000:
                cursor.executemany(event_sql, batch)
                batch = []
    cursor.executemany(event_sql, batch)
    call_sql = f"INSERT INTO floor_call ({CALL_COLUMNS}) VALUES ({', '.join([mark] * 24)})"
    batch = []
    for entry in os.scandir(run / "receipts"):
        with open(entry.path, "rb") as handle:
            r = json.loads(handle.read())
        identity = (r.get("tool_version", ""), r.get("identity", ""), r.get("contract_sha256", ""), r.get("attempt"))
        head = (run_pk, r["call_id"], True, "", r["call_id"], r["status"], r["tool"], *identity)
        body = (json.dumps(r["args"]), r.get("input_sha256", ""), "", json.dumps(r.get("result")), None, "", False)
        batch.append((*head, *body, sql_time(r["created_at"]), sql_time(r["updated_at"]), "", "", "", ""))
        if len(batch) == 5000:
            cursor.executemany(call_sql, batch)
            batch = []
    cursor.executemany(call_sql, batch)
    connection.commit()
    return time.perf_counter() - started


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), sys.argv[2]))
