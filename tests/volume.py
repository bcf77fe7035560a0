"""Big run directories, fast: chained ledger lines and receipts without an fsync per record.

The crash, concurrency and benchmark tests need volume that the real writer
(an fsync per record, by design) would take minutes to produce. Everything
written here follows the spec's formulas, so the reader finds nothing wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from receipts import protocol


def synthetic_ledger(run_dir: Path, count: int, start_seq: int = 1) -> None:
    """Append ``count`` chained ``note`` events."""
    ledger = run_dir / "events.jsonl"
    data = ledger.read_bytes() if ledger.exists() else b""
    previous = protocol.sha256_hex(data.splitlines()[-1]) if data else protocol.ZERO_HASH
    with ledger.open("ab") as handle:
        lines = []
        for seq in range(start_seq, start_seq + count):
            line = protocol.canonical_json(
                {
                    "seq": seq,
                    "ts": f"2026-11-29T12:{seq // 60 % 60:02d}:{seq % 60:02d}.000000Z",
                    "type": "note",
                    "prev_sha256": previous,
                }
            )
            previous = protocol.sha256_hex(line)
            lines.append(line + b"\n")
            if len(lines) == 10_000:
                handle.write(b"".join(lines))
                lines = []
        handle.write(b"".join(lines))


def synthetic_run(run_dir: Path, *, events: int, receipts: int, contract: str) -> None:
    """A run whose ledger has ``events`` lines, ``receipts`` of them naming a committed receipt."""
    (run_dir / "receipts").mkdir(parents=True, exist_ok=True)
    (run_dir / "steer.json").write_text(json.dumps({"contract_sha256": contract}))
    (run_dir / "state.json").write_text(json.dumps({"name": "finished", "attempts": 1}))
    previous = protocol.ZERO_HASH
    every = max(1, events // max(1, receipts))
    written = 0
    with (run_dir / "events.jsonl").open("wb") as ledger:
        lines = []
        for seq in range(1, events + 1):
            event = {
                "seq": seq,
                "ts": f"2026-11-29T12:{seq // 60 % 60:02d}:{seq % 60:02d}.000000Z",
                "prev_sha256": previous,
            }
            if seq % every == 0 and written < receipts:
                args = {"path": f"file-{written}.txt", "content": f"content {written}"}
                call_id = protocol.make_call_id(contract, 1, "write_file", args, "1.0.0", protocol.IDENTITY_V2)
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
                    "result": {"path": f"workspace/{args['path']}"},
                    "created_at": "2026-11-29T12:00:00.000000Z",
                    "updated_at": "2026-11-29T12:00:01.000000Z",
                }
                (run_dir / "receipts" / f"{call_id}.json").write_bytes(protocol.canonical_json(receipt))
                event.update(type="receipt", call_id=call_id, tool="write_file", attempt=1, status="committed")
                written += 1
            else:
                event["type"] = "note"
            line = protocol.canonical_json(event)
            previous = protocol.sha256_hex(line)
            lines.append(line + b"\n")
            if len(lines) == 10_000:
                ledger.write(b"".join(lines))
                lines = []
        ledger.write(b"".join(lines))
