#!/usr/bin/env python
"""Django's command-line utility for the Callproof dashboard."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evidence.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        # A missing or malformed setting is the operator's to fix: say which, not where Python was.
        sys.stderr.write(f"error: {error}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
