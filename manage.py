#!/usr/bin/env python
"""Django's command-line utility for the Callproof dashboard: ``python -m evidence`` in a checkout."""

from evidence.__main__ import main

if __name__ == "__main__":
    main()
