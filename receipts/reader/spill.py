"""Batches of records kept on disk until they can be judged, so that memory holds one batch.

A run's receipts are read before the ledger that judges them may be known (a child reads
them while the importer still reads the ledger): each batch is pickled to an unnamed
temporary file as it fills, and read back one at a time once the ledger is there.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from typing import Any


class Spill:
    """Batches written in order and read back in the same order, one at a time; the file has
    no name (removed by the system when closed, or when the process dies)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close(), by whoever made the spill
        self.batches = 0

    def put(self, batch: Any) -> None:
        pickle.dump(batch, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self.batches += 1

    def __iter__(self) -> Iterator[Any]:
        self._file.seek(0)
        for _ in range(self.batches):
            yield pickle.load(self._file)  # noqa: S301 - our own unnamed file, written just above

    def close(self) -> None:
        self._file.close()
