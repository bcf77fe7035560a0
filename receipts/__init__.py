"""Callproof's writer and reader: what an agent runtime embeds. Standard library only.

- the writer: ``protocol`` (the run directory's formulas), ``durable`` (confined, durable
  writes), ``runtime`` (calls, confirmations, the run's state), ``tasks``, ``tools``,
  ``recovery``, ``replay``, ``signing``, the ``cli`` (``python -m receipts``, ``callproof``);
- ``receipts.reader``: reading a run directory into records and findings, never raising on
  bad input, and ``receipts.reader.verify``, the offline verifier of evidence exports.

The dashboard that imports and shows runs is the ``evidence`` package (Django, the
``dashboard`` extra); nothing here imports it.
"""

__version__ = "0.1.0"
