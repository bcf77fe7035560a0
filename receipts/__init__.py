"""Callproof's writer and reader: what an agent runtime embeds. Standard library only.

- ``@receipts.receipted`` (``receipts.decorator``): a plain function as a receipted tool;
- the writer: ``protocol`` (the run directory's formulas), ``confined`` (every open below a
  run directory, the reader's too: no symlink followed), ``durable`` (durable writes, the
  ledger), ``runtime`` (calls, confirmations, the run's state), ``tasks``, ``tools``,
  ``recovery``, ``replay``, ``signing``, the ``cli`` (``python -m receipts``, ``callproof``);
- ``receipts.reader``: reading a run directory into records and findings, never raising on
  bad input, and ``receipts.reader.verify``, the offline verifier of evidence exports.

The dashboard that imports and shows runs is the ``evidence`` package (Django, the
``dashboard`` extra); nothing here imports it.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from receipts.decorator import CallInDoubt, NoRunBound, SettledWithoutAnswer, receipted, use_run

# The decorator loads the writer; it is loaded on first use, so that importing the reader alone stays light.
_DECORATOR_NAMES = ("CallInDoubt", "NoRunBound", "SettledWithoutAnswer", "receipted", "use_run")
__all__ = ["CallInDoubt", "NoRunBound", "SettledWithoutAnswer", "__version__", "receipted", "use_run"]


def __getattr__(name: str) -> object:
    if name in _DECORATOR_NAMES:
        from receipts import decorator

        return getattr(decorator, name)
    raise AttributeError(f"module 'receipts' has no attribute {name!r}")
