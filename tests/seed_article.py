"""The seed article's own writer, as the article prints it, to make a run the way its readers' runtimes do.

``make_call_id`` and ``write_receipt`` are the article's code (the first article of the series,
section one) with its formatting restored and nothing changed: a runtime written to the article
computes these ids and writes these files. ``write_seed_run`` lays out a run as the article's
series does: steer.json with the contract alone, state.json with a state name and attempts, and
receipts with only ``call_id``, ``status``, ``tool`` and ``args``.

    python -m tests.seed_article DIR     writes the run tests/data/seed-run/ holds into DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def make_call_id(contract_sha: str, attempt: int, tool: str, args: dict[str, Any]) -> str:
    identity = {
        "contract_sha256": contract_sha,
        "attempt": attempt,
        "tool": tool,
        "args": args,
    }
    return hashlib.sha256(canonical(identity)).hexdigest()


def write_receipt(path: Path, receipt: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    encoded = json.dumps(receipt, ensure_ascii=False, indent=2)
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(encoded)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


# --- the run, as the article's series lays it out -------------------------------------------------

CONTRACT = hashlib.sha256(b"the seed article's task contract").hexdigest()
PATCH_ARGS = {"path": "workspace/src/price.py", "patch_sha256": "5c61e2"}  # the article's own call
MESSAGE_ARGS = {"to": "ops@example.com", "body": "deployed"}


def write_seed_run(root: Path) -> Path:
    """A run after attempt 1 failed: retrying, its calls at attempt 2, two of them committed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "steer.json").write_text(json.dumps({"contract_sha256": CONTRACT}, indent=2), encoding="utf-8")
    state: dict[str, Any] = {"name": "retrying", "attempts": 1}
    (root / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
    for tool, args in (("apply_patch", PATCH_ARGS), ("send_message", MESSAGE_ARGS)):
        call_id = make_call_id(CONTRACT, state["attempts"] + 1, tool, args)
        write_receipt(
            root / "receipts" / f"{call_id}.json",
            {"call_id": call_id, "status": "committed", "tool": tool, "args": args},
        )
    return root


if __name__ == "__main__":
    write_seed_run(Path(sys.argv[1]))
