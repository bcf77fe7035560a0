"""Adapters for targets outside the run directory, one module each. Standard library only.

Each module's adapter takes its target (a connection factory, a URL) from the
code that builds it, never from a call's args or a receipt, and each has a
zero-argument factory that reads its target from the environment (for the
conformance kit and the dashboard's ``EVIDENCE_ADAPTERS``).
"""
