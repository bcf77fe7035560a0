"""The floor for bench_import.py: the same rows from the same files, the plainest way.

The standard `json` module, no checks, `executemany` into the importer's own
tables (same schema, same indexes), one transaction.

    python tests/bench/floor_import.py RUN_DIR (SQLITE_FILE | postgres://...)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

EVENT_COLUMNS = (
    "run_id, seq, line_no, ts, type, call_id, client_submission_id, disposition, request_digest, line_sha256, payload"
)
CALL_COLUMNS = (
    "run_id, call_id, receipt_present, file_sha256, declared_call_id, status, tool, tool_version, identity, "
    "contract_sha256, attempt, args, input_sha256, output_sha256, result, error, error_kind, queryable, "
    "created_at, updated_at, recomputed_call_id, verification, decision, decision_reason"
)
RUN_INSERT = (
    "INSERT INTO receipts_run (run_id, path, state, contract_sha256, ledger_offset, ledger_prefix_sha256, "
    "ledger_last_seq, ledger_last_line_sha256, ledger_line_no, fingerprint, event_count, archived) "
    "VALUES ('floor', '', '', '', 0, '', 0, '', 0, '', 0, false)"
)


def sql_time(text: str) -> str:
    return text.replace("T", " ").rstrip("Z")


def main(run: Path, target: str) -> float:
    started = time.perf_counter()
    if target.startswith("postgres"):
        import psycopg

        connection, mark = psycopg.connect(target), "%s"
    else:
        import sqlite3

        connection, mark = sqlite3.connect(target), "?"
    cursor = connection.cursor()
    cursor.execute(RUN_INSERT)
    cursor.execute("SELECT id FROM receipts_run WHERE run_id = 'floor'")
    run_pk = cursor.fetchone()[0]
    event_sql = f"INSERT INTO receipts_event ({EVENT_COLUMNS}) VALUES ({', '.join([mark] * 11)})"
    batch = []
    with open(run / "events.jsonl", "rb") as ledger:
        for number, line in enumerate(ledger, 1):
            event = json.loads(line)
            row = (run_pk, event["seq"], number, sql_time(event["ts"]), event["type"], event.get("call_id", ""))
            batch.append((*row, "", "", "", "", line[:-1].decode()))
            if len(batch) == 5000:
                cursor.executemany(event_sql, batch)
                batch = []
    cursor.executemany(event_sql, batch)
    call_sql = f"INSERT INTO receipts_call ({CALL_COLUMNS}) VALUES ({', '.join([mark] * 24)})"
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
