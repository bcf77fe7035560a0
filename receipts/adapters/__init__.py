"""Adapters for tools beyond the built-in ones, one module each (standard library only)."""
