"""``python -m evidence``: the dashboard's commands (``manage.py``'s), also where a wheel is installed.

An installed wheel has no ``manage.py``: this sets the settings module itself, and a missing or
malformed setting (DJANGO_SECRET_KEY above all, on a first start) is named in one line, where
``django-admin`` would print Django's traceback around it.
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evidence.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    # Django names itself "python -m django" when run as a __main__.py: its help would show the wrong command.
    argv = ["python -m evidence", *sys.argv[1:]] if sys.argv[0].endswith("__main__.py") else sys.argv
    try:
        execute_from_command_line(argv)
    except ImproperlyConfigured as error:
        # A missing or malformed setting is the operator's to fix: say which, not where Python was.
        sys.stderr.write(f"error: {error}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
