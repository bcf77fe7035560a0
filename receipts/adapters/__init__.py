"""Adapters for tools outside the built-ins, one module each.

A module here may need a third-party package: it is then an optional extra of
``callproof`` (pyproject.toml) and the module is imported only when it is used,
so the writer itself stays standard library only.
"""
