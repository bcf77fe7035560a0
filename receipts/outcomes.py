"""What the writer answers with: a call's ``CallOutcome``, and ``ConfirmationRefused`` when a
person's decision is not written.

Below the runtime and the daemon's client alike: the client rebuilds them from the wire, the
runtime makes them (``receipts.runtime`` names both, as the interface docs do).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    call_id: str
    status: str | None  # None: the call was refused before it had a receipt
    reused: bool
    result: dict[str, Any] | None
    error: dict[str, Any] | None = None
    needs: str | None = None  # "confirmation" when a person must decide

    def as_dict(self) -> dict[str, Any]:
        document = {"call_id": self.call_id, "status": self.status, "reused": self.reused, "result": self.result}
        if self.error:
            document["error"] = self.error
        if self.needs:
            document["needs"] = self.needs
        return document


class ConfirmationRefused(ValueError):  # noqa: N818 - a verdict, said to the person who asked
    """The confirmation was not written; ``reason`` says why in a person's words."""

    def __init__(self, reason: str, *, current_receipt_sha256: str = "", existing: dict[str, Any] | None = None):
        super().__init__(reason)
        self.current_receipt_sha256 = current_receipt_sha256
        self.existing = existing
