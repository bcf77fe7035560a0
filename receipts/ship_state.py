"""What a shipper (``callproof ship``) knows between its passes, in one SQLite file (standard
library): a host of a million record files holds none of them in memory, and a push's progress
is saved without writing the rest again.

Per run: its generation (the SHA-256 of its steer.json: which run the directory holds), how much
of its ledger the dashboard holds, the ledger's size the dashboard was last told, why the run
cannot be sent and what was last said of it, and until when a refused run waits. Per record
file: its size, time and inode when the dashboard took it. Per folder: its time and inode when
a listing last saw every file of it taken, so that a pass lists only the folders that changed.

A state file of an earlier shipper (JSON) is read once and replaced by this one; what it knew of
each ledger and file is kept, its runs' generations learnt at their next pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    generation TEXT,
    ledger INTEGER NOT NULL DEFAULT 0,
    reported INTEGER NOT NULL DEFAULT -1,
    problem TEXT NOT NULL DEFAULT '',
    problem_said TEXT NOT NULL DEFAULT '',
    held_until REAL NOT NULL DEFAULT 0,
    held_for TEXT NOT NULL DEFAULT '',
    ledger_ino INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS files (
    run_id TEXT NOT NULL, path TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL, PRIMARY KEY (run_id, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS folders (
    run_id TEXT NOT NULL, folder TEXT NOT NULL, mark TEXT NOT NULL, listed_at REAL NOT NULL,
    PRIMARY KEY (run_id, folder)
) WITHOUT ROWID;
"""

# A run a refusal holds back until its directory changes: archived on the dashboard, or a ledger
# that is not the one the dashboard holds. ``held_for`` says which, with what it was then.
ARCHIVED, DIVERGED, REFUSED = "archived", "diverged", "refused"


@dataclasses.dataclass(frozen=True)
class RunState:
    run_id: str
    generation: str | None  # None: not known yet (a state file from before generations)
    ledger: int  # the ledger's bytes the dashboard holds
    reported: int  # the ledger's size the dashboard was last told (-1: never)
    problem: str  # why the run cannot be sent now ("" when it can)
    problem_said: str  # what the dashboard was last told of that
    held_until: float  # a refused run is not sent again before this (time.time())
    held_for: str  # what holds it back until its directory changes ("" when nothing)
    ledger_ino: int  # the ledger file's inode when the dashboard took its bytes (0: not known)


Mark = tuple[int, int, int]  # a file's size, mtime_ns and inode


class ShipState:
    """The shipper's state file (``path``). One shipper holds it at a time (``receipts.ship``
    locks a file beside it)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        legacy = _legacy_state(self.path)
        if legacy is not None:
            _replace_legacy(self.path, legacy)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # WAL with NORMAL: a write is one append, and a power cut can lose the last ones only: a
        # state older than the dashboard's is what the protocol heals (a push sent again is taken).
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """One transaction: what a push acknowledged is saved whole, or not at all."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- the shipper -------------------------------------------------------------------

    def instance(self) -> str:
        """Who this shipper is to the dashboard: made once, kept, so that the same shipper
        started again after a crash is still itself."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()
        if row is not None:
            return str(row[0])
        made = secrets.token_hex(16)
        self.db.execute("INSERT INTO meta (key, value) VALUES ('instance', ?)", (made,))
        return made

    # --- runs --------------------------------------------------------------------------

    def run(self, run_id: str) -> RunState | None:
        row = self.db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return RunState(*row) if row is not None else None

    def begin_run(self, run_id: str, generation: str) -> RunState:
        """The run as the state knows it, for a directory holding ``generation``: a run never
        seen, or another run under its id (a new generation), starts from nothing; a run of an
        earlier state file takes the generation it holds now."""
        known = self.run(run_id)
        # A steer.json that cannot be read now ("") says nothing of which run is there: what the
        # state knows stands until one can be read.
        if known is not None and (known.generation == generation or (generation == "" and known.generation)):
            return known
        with self.saving():
            if known is not None and known.generation is None:
                self.db.execute("UPDATE runs SET generation = ? WHERE run_id = ?", (generation, run_id))
            else:
                self._forget(run_id)
                self.db.execute("INSERT INTO runs (run_id, generation) VALUES (?, ?)", (run_id, generation))
        found = self.run(run_id)
        assert found is not None
        return found

    def acknowledged(
        self, run_id: str, *, ledger: int | None, files: Iterable[tuple[str, Mark]], ledger_ino: int = 0
    ) -> None:
        """What the dashboard took of one push: the ledger up to ``ledger`` (of the file whose inode
        is ``ledger_ino``), these files as marked."""
        with self.saving():
            if ledger is not None:
                self.db.execute(
                    "UPDATE runs SET ledger = ?, ledger_ino = ? WHERE run_id = ?", (ledger, ledger_ino, run_id)
                )
            self.db.executemany(
                "INSERT INTO files (run_id, path, size, mtime_ns, ino) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, path) DO UPDATE SET size = excluded.size, mtime_ns = excluded.mtime_ns, "
                "ino = excluded.ino",
                [(run_id, path, *mark) for path, mark in files],
            )

    def resume_ledger_at(self, run_id: str, offset: int) -> None:
        """The dashboard holds the ledger's first ``offset`` bytes, as this host has them. When
        that is less than the state said, the dashboard lost some of the run (its mirror restored
        from an older copy): every file of it goes again, not only the ledger."""
        with self.saving():
            known = self.run(run_id)
            if known is not None and offset < known.ledger:
                self.db.execute("DELETE FROM files WHERE run_id = ?", (run_id,))
                self.db.execute("DELETE FROM folders WHERE run_id = ?", (run_id,))
            self.db.execute("UPDATE runs SET ledger = ? WHERE run_id = ?", (offset, run_id))

    def reported(self, run_id: str, size: int) -> None:
        self.db.execute("UPDATE runs SET reported = ? WHERE run_id = ?", (size, run_id))

    def set_problem(self, run_id: str, problem: str) -> None:
        # A path in an error that is not UTF-8 (surrogates) is kept as escapes: SQLite and the
        # dashboard take text.
        said = problem[:2000].encode("utf-8", "backslashreplace").decode("utf-8")
        self.db.execute("UPDATE runs SET problem = ? WHERE run_id = ?", (said, run_id))

    def problem_said(self, run_id: str, problem: str) -> None:
        self.db.execute("UPDATE runs SET problem_said = ? WHERE run_id = ?", (problem, run_id))

    def problems_to_say(self) -> list[RunState]:
        """The runs whose problem the dashboard has not been told as it is now (a new one, or one gone)."""
        rows = self.db.execute("SELECT * FROM runs WHERE problem != problem_said ORDER BY run_id")
        return [RunState(*row) for row in rows]

    def hold(self, run_id: str, *, until: float = 0.0, held_for: str = "") -> None:
        """Send this run no more before ``until``, or, with ``held_for``, until its directory
        differs from what that says (``ARCHIVED``, or ``DIVERGED`` with the ledger's mark)."""
        self.db.execute("UPDATE runs SET held_until = ?, held_for = ? WHERE run_id = ?", (until, held_for, run_id))

    def forget(self, run_id: str) -> None:
        """Everything of a run: its directory is gone from the host (removed after its archive)."""
        with self.saving():
            self._forget(run_id)

    def _forget(self, run_id: str) -> None:
        for table in ("runs", "files", "folders"):
            self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))  # noqa: S608 - the three names above

    def forget_all_but(self, run_ids: Iterable[str]) -> list[str]:
        """The runs no longer under the root (removed by hand, or moved away): forgotten, so that
        the state does not grow with every run the host ever had; their ids. One that comes back
        is sent again from its start, which the dashboard takes without writing it twice."""
        with self.saving():
            self.db.execute("CREATE TEMP TABLE IF NOT EXISTS present (run_id TEXT PRIMARY KEY) WITHOUT ROWID")
            self.db.execute("DELETE FROM present")
            self.db.executemany("INSERT OR IGNORE INTO present VALUES (?)", ((run_id,) for run_id in run_ids))
            gone = "run_id NOT IN (SELECT run_id FROM present)"
            forgotten = [row[0] for row in self.db.execute(f"SELECT run_id FROM runs WHERE {gone}")]  # noqa: S608
            for table in ("runs", "files", "folders"):
                self.db.execute(f"DELETE FROM {table} WHERE {gone}")  # noqa: S608 - the three names above
        return forgotten

    # --- files and folders -------------------------------------------------------------

    def file_mark(self, run_id: str, path: str) -> Mark | None:
        row = self.db.execute(
            "SELECT size, mtime_ns, ino FROM files WHERE run_id = ? AND path = ?", (run_id, path)
        ).fetchone()
        return (row[0], row[1], row[2]) if row is not None else None

    def folder(self, run_id: str, folder: str) -> tuple[str, float] | None:
        row = self.db.execute(
            "SELECT mark, listed_at FROM folders WHERE run_id = ? AND folder = ?", (run_id, folder)
        ).fetchone()
        return (row[0], row[1]) if row is not None else None

    def folder_listed(self, run_id: str, folder: str, mark: str, listed_at: float) -> None:
        self.db.execute(
            "INSERT INTO folders (run_id, folder, mark, listed_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (run_id, folder) DO UPDATE SET mark = excluded.mark, listed_at = excluded.listed_at",
            (run_id, folder, mark, listed_at),
        )


def _legacy_state(path: Path) -> dict | None:
    """An earlier shipper's JSON state at ``path``, or None (none there, or a SQLite file)."""
    try:
        with open(path, "rb") as stream:
            if stream.read(1) != b"{":
                return None
            stream.seek(0)
            state = json.load(stream)
    except (FileNotFoundError, ValueError):
        return None
    return state if isinstance(state, dict) else {}


def _replace_legacy(path: Path, legacy: dict) -> None:
    """Write the legacy state's facts into a new SQLite file, then put it in the JSON's place."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.migrating")
    temp.unlink(missing_ok=True)
    db = sqlite3.connect(temp, isolation_level=None)
    try:
        db.executescript(_SCHEMA)
        db.execute("BEGIN")
        if isinstance(legacy.get("instance"), str):
            db.execute("INSERT INTO meta (key, value) VALUES ('instance', ?)", (legacy["instance"],))
        files = legacy.get("files")
        for key, mark in (files if isinstance(files, dict) else {}).items():
            run_id, _, relative = str(key).partition("/")
            db.execute("INSERT OR IGNORE INTO runs (run_id, generation) VALUES (?, NULL)", (run_id,))
            if relative == "events.jsonl" and isinstance(mark, int):
                db.execute("UPDATE runs SET ledger = ? WHERE run_id = ?", (mark, run_id))
            elif isinstance(mark, list) and len(mark) == 3 and all(isinstance(n, int) for n in mark):
                db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)", (run_id, relative, *mark))
        db.execute("COMMIT")
    finally:
        db.close()
    os.replace(temp, path)
