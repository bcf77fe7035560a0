"""Rows imported from run directories (filled by the importer)."""
