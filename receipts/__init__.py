"""Callproof receipts: the run directory protocol, its writer, and the dashboard's domain.

Importing this package imports nothing from Django: ``protocol``, ``runtime``
and ``replay`` are standard library only.
"""

__version__ = "0.1.0"
