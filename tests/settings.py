"""The test suite's environment. evidence/settings.py stays the one settings file.

It reads the environment, and its defaults are a deployment's (debugging off,
HTTPS on). A test run is development: this module supplies that environment,
as `make demo` supplies its own, takes the settings whole, and adds one speed-up.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

os.environ["DJANGO_DEBUG"] = "1"

from evidence.settings import *  # noqa: F403

# Hashing passwords slowly is the point in production and a waste in tests.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

_database = DATABASES["default"]  # noqa: F405 - from the settings taken whole above
if _database["ENGINE"] == "django.db.backends.sqlite3":
    # A file rather than memory: threads in one test then share one database, with its real locks.
    _database["TEST"] = {"NAME": os.path.join(tempfile.gettempdir(), f"callproof-test-{os.getpid()}.sqlite3")}
else:
    # One test database per checkout (pytest-django adds each xdist worker's name to it): a
    # developer's run and CI's, in another folder, never drop each other's database. A run killed
    # before its end leaves its database behind, and the next run in that checkout replaces it.
    # CALLPROOF_TEST_DATABASE names another, for a run of pytest inside a test (test_suite_split).
    _checkout = hashlib.sha256(os.path.dirname(os.path.dirname(os.path.abspath(__file__))).encode()).hexdigest()
    _database["TEST"] = {"NAME": os.environ.get("CALLPROOF_TEST_DATABASE", f"test_callproof_{_checkout[:12]}")}
