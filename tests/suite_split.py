"""Did every test that uses the database run on both databases? (`make test` asks after its two passes.)

    python -m tests.suite_split POSTGRESQL_RECORD SQLITE_RECORD

Each record is what one pass wrote with ``--suite-record`` (tests/suite_plugin.py). A test that
used the database must have run on both (or been skipped on both), but for a browser test and a test marked
``postgresql``, which run on PostgreSQL alone. A test that did not use the database must have run
once. Prints what is missing and exits 1; exits 0 with a line of counts when the split held.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def missing(postgresql: dict, sqlite: dict) -> list[str]:
    """What the two records say did not run where it must, one sentence each (empty: the split held)."""
    problems = []
    for name, record, expected in (("PostgreSQL", postgresql, "postgresql"), ("SQLite", sqlite, "sqlite")):
        if record.get("database") != expected:
            problems.append(f"the {name} record was written by a pass on {record.get('database')!r}")
    if problems:
        return problems
    on_postgresql, on_sqlite = postgresql["tests"], sqlite["tests"]
    for nodeid in sorted(on_postgresql.keys() | on_sqlite.keys()):
        there, here = on_postgresql.get(nodeid), on_sqlite.get(nodeid)
        test = there or here
        if not test["uses_database"]:
            if there is None:
                problems.append(f"{nodeid}: uses no database and did not run on PostgreSQL, the pass that runs it")
            elif here is not None:
                problems.append(f"{nodeid}: uses no database and ran twice")
            continue
        if there is None:
            problems.append(f"{nodeid}: uses the database and did not run on PostgreSQL")
        elif test["browser"] or test["postgresql_only"]:
            if here is not None and here["outcome"] != "skipped":
                problems.append(f"{nodeid}: runs on PostgreSQL alone and ran on SQLite too")
        elif here is None:
            problems.append(f"{nodeid}: uses the database and did not run on SQLite")
        elif (here["outcome"] == "skipped") != (there["outcome"] == "skipped"):
            ran, skipped = ("PostgreSQL", "SQLite") if here["outcome"] == "skipped" else ("SQLite", "PostgreSQL")
            problems.append(f"{nodeid}: uses the database, ran on {ran} and was skipped on {skipped}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    postgresql, sqlite = (json.loads(Path(path).read_text()) for path in argv)
    problems = missing(postgresql, sqlite)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"the split between the databases did not hold: {len(problems)} test(s)", file=sys.stderr)
        return 1
    both = sum(1 for test in sqlite["tests"].values() if test["outcome"] != "skipped")
    once = sum(1 for test in postgresql["tests"].values() if not test["uses_database"])
    print(f"the split held: {both} tests that use the database ran on both, {once} without it ran once")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
