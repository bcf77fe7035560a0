"""A set of call ids kept in a SQLite file (the standard library's ``sqlite3``), for the ledger's
sets of calls (``LedgerCursor.call_ids`` and the rest) when a run is read in child processes.

As Python sets, a million call ids took some 230 MiB, and the process that read the ledger,
the importer and the one that read the receipts each held a copy. On disk, a process holds
at most ``buffered`` ids waiting to be written, whatever the run's size. A ``DiskSet`` pickles
as its file and table: another process that unpickles it opens the same set (the writer's
pickling writes what waits first).

Ids are stored as their UTF-8 bytes (lone surrogates kept: a ledger's JSON can hold them), so
the file's order is the order of Python's ``sorted``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, MutableMapping, MutableSet
from typing import Any

# Ids waiting in memory before a write: what a DiskSet holds, beside the file's page cache.
DEFAULT_BUFFERED = 20_000

_connections: dict[str, sqlite3.Connection] = {}


def _connection(path: str) -> sqlite3.Connection:
    """One connection a file in a process: the sets of one file are compared in one query."""
    connection = _connections.get(path)
    if connection is None:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # A scratch file of this import: a crash loses nothing that a new import does not read again.
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-16384")  # 16 MiB of pages at most
        _connections[path] = connection
    return connection


def _key(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def _value(key: bytes) -> str:
    return key.decode("utf-8", "surrogatepass")


class DiskSet(MutableSet[str]):
    """A set of strings in table ``table`` of the SQLite file ``path`` (made if missing)."""

    def __init__(self, path: str, table: str, buffered: int = DEFAULT_BUFFERED) -> None:
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        self.path, self.table, self.buffered = path, table, max(buffered, 1)
        self._db = _connection(path)
        self._run("CREATE TABLE IF NOT EXISTS {table} (id BLOB PRIMARY KEY) WITHOUT ROWID")
        self._waiting: set[str] = set()

    def _run(self, statement: str, parameters: Any = (), other: str = "") -> sqlite3.Cursor:
        """``statement`` with ``{table}`` standing for this set's table, ``{other}`` for another
        set's (names checked when the sets were made)."""
        return self._db.execute(statement.format(table=self.table, other=other), parameters)

    def __reduce__(self) -> tuple[Any, ...]:
        self.flush()
        return (DiskSet, (self.path, self.table, self.buffered))

    @classmethod
    def _from_iterable(cls, values: Iterable[Any]) -> set[Any]:
        return set(values)  # what ``a - b`` and the like make: a set in memory, not another table

    def flush(self) -> None:
        """Write the ids that wait in memory."""
        if self._waiting:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    f"INSERT OR IGNORE INTO {self.table} VALUES (?)",  # noqa: S608 - a name checked when made
                    [(_key(value),) for value in self._waiting],
                )
            self._waiting = set()

    def add(self, value: str) -> None:
        self._waiting.add(value)
        if len(self._waiting) >= self.buffered:
            self.flush()

    def discard(self, value: str) -> None:
        self._waiting.discard(value)
        self._run("DELETE FROM {table} WHERE id = ?", (_key(value),))

    def clear(self) -> None:
        self._waiting = set()
        self._run("DELETE FROM {table}")

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, str):
            return False
        if value in self._waiting:
            return True
        found = self._run("SELECT 1 FROM {table} WHERE id = ?", (_key(value),))
        return found.fetchone() is not None

    def __len__(self) -> int:
        self.flush()
        return int(self._run("SELECT count(*) FROM {table}").fetchone()[0])

    def __iter__(self) -> Iterator[str]:
        """In sorted order, read a page at a time."""
        self.flush()
        for (key,) in self._run("SELECT id FROM {table} ORDER BY id"):
            yield _value(key)

    def among(self, values: Iterable[str]) -> set[str]:
        """Those of ``values`` in the set, asked of the file in one query."""
        self.flush()
        self._db.execute("CREATE TEMP TABLE IF NOT EXISTS asked (id BLOB PRIMARY KEY) WITHOUT ROWID")
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR IGNORE INTO temp.asked VALUES (?)", [(_key(value),) for value in values])
            found = {_value(key) for (key,) in self._run("SELECT id FROM {table} JOIN temp.asked USING (id)")}
            self._db.execute("DELETE FROM temp.asked")
        return found

    def sorted_without(self, other: DiskSet) -> Iterator[str]:
        """The ids of this set not in ``other`` (a set of the same file), in sorted order."""
        if other.path != self.path:
            raise ValueError("sets of two files are not compared on disk")
        self.flush()
        other.flush()
        rows = self._run(
            "SELECT id FROM {table} WHERE id NOT IN (SELECT id FROM {other}) ORDER BY id", other=other.table
        )
        for (key,) in rows:
            yield _value(key)


def among(values: Iterable[str], ids: MutableSet[str]) -> set[str]:
    """Those of ``values`` in ``ids``, a set in memory or on disk."""
    if isinstance(ids, DiskSet):
        return ids.among(values)
    return {value for value in values if value in ids}


def release(path: str) -> None:
    """Close this process's connection to ``path``, once its sets are no longer used (a watch
    imports run after run: each import's file must not stay open once removed)."""
    connection = _connections.pop(path, None)
    if connection is not None:
        connection.close()


class SpillingMap(MutableMapping[str, str]):
    """A map of names to text, in memory while it holds at most ``in_memory`` entries, then in a
    private SQLite database (removed by SQLite when it is closed: no name, nothing to clean up),
    a page cache of 16 MiB at most in memory; for a run's listing of receipts and their signatures.

    Iterated in Python's sorted order (``sorted_items`` reads names and values in one pass). On
    disk, entries are appended, and a name set again keeps its latest value: a listing of a million
    names is written in about 2 s, where keeping a sorted index as it is written took 13 s. The
    index (names and values: every read is answered from it alone) is made at the first read, in
    one sort, and serves every read after it.
    """

    def __init__(self, in_memory: int, buffered: int = DEFAULT_BUFFERED) -> None:
        self.in_memory, self.buffered = in_memory, max(buffered, 1)
        self._entries: dict[str, str] = {}  # every entry, or (once on disk) those waiting to be written
        self._db: sqlite3.Connection | None = None
        self._indexed = False

    @property
    def on_disk(self) -> bool:
        return self._db is not None

    def _spill(self) -> sqlite3.Connection:
        """The database, with every entry written to it."""
        if self._db is None:
            self._db = sqlite3.connect("", isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA cache_size=-16384")
            self._db.execute("CREATE TABLE entries (name BLOB NOT NULL, value TEXT NOT NULL)")
        if self._entries:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT INTO entries VALUES (?, ?)", [(_key(name), value) for name, value in self._entries.items()]
                )
            self._entries = {}
        return self._db

    def _indexed_db(self) -> sqlite3.Connection:
        db = self._spill()
        if not self._indexed:
            db.execute("CREATE INDEX by_name ON entries (name, value)")
            self._indexed = True
        return db

    def __setitem__(self, name: str, value: str) -> None:
        self._entries[name] = value
        if len(self._entries) > (self.buffered if self.on_disk else self.in_memory):
            self._spill()

    def update(self, *others: Any, **named: str) -> None:
        """``dict.update``'s, a chunk at a time rather than an entry."""
        self._entries.update(*others, **named)
        if len(self._entries) > (self.buffered if self.on_disk else self.in_memory):
            self._spill()

    def __getitem__(self, name: str) -> str:
        if name in self._entries or self._db is None:
            return self._entries[name]
        latest = "SELECT value FROM entries WHERE name = ? ORDER BY rowid DESC LIMIT 1"
        row = self._indexed_db().execute(latest, (_key(name),)).fetchone()
        if row is None:
            raise KeyError(name)
        return str(row[0])

    def __delitem__(self, name: str) -> None:
        found = self._entries.pop(name, None) is not None
        if self._db is not None:
            deleted = self._indexed_db().execute("DELETE FROM entries WHERE name = ?", (_key(name),))
            found = deleted.rowcount > 0 or found
        if not found:
            raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._entries or self._db is None:
            return name in self._entries
        return self._indexed_db().execute("SELECT 1 FROM entries WHERE name = ?", (_key(name),)).fetchone() is not None

    def __len__(self) -> int:
        if self._db is None:
            return len(self._entries)
        # Counted by groups of the index: count(DISTINCT name) sorted a million names again (5 s, not 0.3).
        distinct = "SELECT count(*) FROM (SELECT 1 FROM entries GROUP BY name)"
        return int(self._indexed_db().execute(distinct).fetchone()[0])

    def __iter__(self) -> Iterator[str]:
        for name, _ in self.sorted_items():
            yield name

    def sorted_items(self) -> Iterator[tuple[str, str]]:
        """Every name and its (latest) value, in the names' sorted order."""
        if self._db is None:
            yield from sorted(self._entries.items())
            return
        yield from self._latest(self._indexed_db().execute("SELECT name, value FROM entries ORDER BY name, rowid"))

    def items_from(self, prefix: str) -> Iterator[tuple[str, str]]:
        """The names that start with ``prefix`` and their values, in sorted order (on disk, a range
        of the index: a bucket of a million receipts' listing, not the whole of it)."""
        if self._db is None:
            yield from sorted(item for item in self._entries.items() if item[0].startswith(prefix))
            return
        low = _key(prefix)
        above = low.rstrip(b"\xff")  # the first key past every key that starts with ``low``
        select = "SELECT name, value FROM entries WHERE name >= ?"
        if above:
            above = above[:-1] + bytes([above[-1] + 1])
            rows = self._indexed_db().execute(f"{select} AND name < ? ORDER BY name, rowid", (low, above))
        else:
            rows = self._indexed_db().execute(f"{select} ORDER BY name, rowid", (low,))
        yield from self._latest(rows)

    @staticmethod
    def _latest(rows: sqlite3.Cursor) -> Iterator[tuple[str, str]]:
        """Rows of names and values, sorted by name and then as written: the last of each name."""
        previous_key, previous_value = None, ""
        while batch := rows.fetchmany(4096):
            for key, value in batch:
                if previous_key is not None and previous_key != key:
                    yield _value(previous_key), previous_value
                previous_key, previous_value = key, value
        if previous_key is not None:
            yield _value(previous_key), previous_value

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        self._entries, self._indexed = {}, False
