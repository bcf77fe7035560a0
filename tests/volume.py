"""Big run directories, fast: chained ledger lines and receipts without an fsync per record.

The crash, concurrency and benchmark tests need volume that the real writer
(an fsync per record, by design) would take minutes to produce. Everything
written here follows the spec's formulas, so the reader finds nothing wrong.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

from receipts import durable, protocol

_FIRST_STAMP = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)


def _stamp(seq: int) -> str:
    """A second a line from noon: times only go forward (a ledger whose clock goes back is a
    finding, ``ledger_clock_back``), whatever the number of lines."""
    return (_FIRST_STAMP + dt.timedelta(seconds=seq)).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


def last_line(ledger: Path) -> bytes:
    """The ledger's last complete line without its newline (b"" when it is missing or empty), read
    from the end as the writer reads it (``durable._lines_backwards``): a ten-million-event ledger
    is not read whole for it."""
    try:
        fd = os.open(ledger, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return next(durable._lines_backwards(fd, os.fstat(fd).st_size), b"")
    finally:
        os.close(fd)


def _append_chained(ledger: Path, events: Iterator[dict]) -> None:
    """Append ``events`` to ``ledger``, each chained to the line before (canonical JSON sorts keys)."""
    last = last_line(ledger)
    previous = protocol.sha256_hex(last) if last else protocol.ZERO_HASH
    with ledger.open("ab") as handle:
        lines = []
        for event in events:
            line = protocol.canonical_json({**event, "prev_sha256": previous})
            previous = protocol.sha256_hex(line)
            lines.append(line + b"\n")
            if len(lines) == 10_000:
                handle.write(b"".join(lines))
                lines = []
        handle.write(b"".join(lines))


def synthetic_ledger(run_dir: Path, count: int, start_seq: int = 1) -> None:
    """Append ``count`` chained ``note`` events."""
    seqs = range(start_seq, start_seq + count)
    _append_chained(run_dir / "events.jsonl", ({"seq": seq, "ts": _stamp(seq), "type": "note"} for seq in seqs))


def synthetic_run(run_dir: Path, *, events: int, receipts: int, contract: str) -> None:
    """A run whose ledger has ``events`` lines, ``receipts`` of them naming a committed receipt."""
    (run_dir / "receipts").mkdir(parents=True, exist_ok=True)
    (run_dir / "steer.json").write_text(json.dumps({"contract_sha256": contract}))
    (run_dir / "state.json").write_text(json.dumps({"name": "finished", "attempts": 1}))
    (run_dir / "events.jsonl").write_bytes(b"")
    every = max(1, events // max(1, receipts))

    def ledger_events() -> Iterator[dict]:
        written = 0
        for seq in range(1, events + 1):
            if seq % every or written >= receipts:
                yield {"seq": seq, "ts": _stamp(seq), "type": "note"}
                continue
            args = {"path": f"file-{written}.txt", "content": f"content {written}"}
            call_id = protocol.make_call_id(contract, 1, "write_file", args, "1.0.0", protocol.IDENTITY_V2)
            result = {"path": f"workspace/{args['path']}"}
            receipt = {
                "call_id": call_id,
                "identity": protocol.IDENTITY_V2,
                "contract_sha256": contract,
                "attempt": 1,
                "tool": "write_file",
                "tool_version": "1.0.0",
                "args": args,
                "input_sha256": protocol.input_sha256(args),
                "status": "committed",
                "result": result,
                "output_sha256": protocol.input_sha256(result),
                "created_at": "2026-11-29T12:00:00.000000Z",
                "updated_at": "2026-11-29T12:00:01.000000Z",
            }
            (run_dir / "receipts" / f"{call_id}.json").write_bytes(protocol.canonical_json(receipt))
            written += 1
            yield {"seq": seq, "ts": _stamp(seq), "type": "receipt", "call_id": call_id, "tool": "write_file",
                   "attempt": 1, "status": "committed"}  # fmt: skip

    _append_chained(run_dir / "events.jsonl", ledger_events())
