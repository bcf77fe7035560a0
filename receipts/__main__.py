"""Entry point of ``python -m receipts``."""

from receipts.cli import main

raise SystemExit(main())
