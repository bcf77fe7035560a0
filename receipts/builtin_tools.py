"""The tools every writer knows without being told: ``write_file`` and ``send_message``
(receipts.tools) and ``apply_changes`` (receipts.changes), by name.

Above both modules, so that neither imports the other to register it.
"""

from __future__ import annotations

from receipts.changes import ApplyChanges
from receipts.tools import Adapter, SendMessage, WriteFile

BUILTIN_ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter for adapter in (WriteFile(), SendMessage(), ApplyChanges())
}
