"""Ingest: how a run gets into the database. Importing run directories (importer, and its parts:
storing, reading, crosschecks, rereading, watch; read_ahead), the shipper's endpoint (shipping) and
decisions travelling back to a run's host (delivery)."""
