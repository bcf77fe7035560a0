"""The Callproof dashboard (Django): models, importer, selectors, settle, retention, export,
pages and API. Installed with the ``dashboard`` extra; it reads run directories through
``receipts.reader`` and writes to them only through the writer (``receipts.runtime``)."""
