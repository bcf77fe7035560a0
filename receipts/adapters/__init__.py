"""Adapters for tools outside the built-ins, one module each.

Each module's adapter takes its target (a connection factory, a URL) from the
code that builds it, never from a call's args or a receipt, and each has a
zero-argument factory that reads its target from the environment (for the
conformance kit and the dashboard's ``EVIDENCE_ADAPTERS``). A module here may
need a third-party package: it is then an optional extra of ``callproof``
(pyproject.toml) and the module is imported only when it is used, so the
writer itself stays standard library only.
"""
