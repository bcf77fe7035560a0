"""A reader of an ``apply_changes`` tree, run beside the kill harness (tests/torture.py) as its own process.

    python -m tests.tree_reader RUN_DIR TREE MODE LOG ALLOWED_DIGEST...

It looks at the visible tree again and again until its standard input closes, as a reader of
the workspace does: ``content`` opens ``workspace/<tree>`` once (the symlink followed once, to one
version's folder) and reads every file below that folder; ``git`` reads ``refs/heads/main`` once and
the files of that commit. Each look's digest (``receipts.changes.tree_digest``) must be one of the
allowed ones (the version before the call, the version it makes): any other, or a look that finds
no tree, is a line in LOG at once. At the end it prints ``{"reads": N, "seen": {digest: count}}``.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections import Counter
from pathlib import Path

from receipts.changes import _walk, open_tree, tree_digest


def look(run_dir: Path, tree: str, mode: str) -> str:
    if mode == "content":
        fd = os.open(run_dir / "workspace" / tree, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return tree_digest(dict(sorted(_walk(fd, ""))))
        finally:
            os.close(fd)
    versions = open_tree(run_dir, {"tree": tree, "mode": mode})
    current = versions.current()
    if current is None:
        raise FileNotFoundError(f"{tree}: no {mode} version is current")
    return tree_digest(versions.manifest(current))


def main(argv: list[str]) -> int:
    run_dir, tree, mode, log, *allowed = argv
    seen: Counter[str] = Counter()
    with open(log, "a", encoding="utf-8") as problems:
        while not select.select([sys.stdin], [], [], 0)[0]:  # readable: closed, the trial is over
            try:
                digest = look(Path(run_dir), tree, mode)
            except (OSError, ValueError) as error:
                digest = f"unreadable: {type(error).__name__}: {error}"
            seen[digest] += 1
            if digest not in allowed:
                problems.write(f"a reader saw {digest[:80]}, neither the version before nor the one the call makes\n")
                problems.flush()
            time.sleep(0.0005)  # let the writers run: two cores, and a reader per trial
    print(json.dumps({"reads": sum(seen.values()), "seen": dict(seen)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
