"""The one settings file. Everything that varies comes from the environment.

Variables (documented in docs/reference.md, "Settings"): DATABASE_URL, DATABASE_CONN_MAX_AGE,
DJANGO_DEBUG, DJANGO_SECRET_KEY, DJANGO_ALLOWED_HOSTS, DJANGO_HTTPS,
EVIDENCE_RUNS_ROOT, EVIDENCE_ARCHIVE_ROOT, EVIDENCE_MIRROR_ROOT, EVIDENCE_READ_ONLY, EVIDENCE_STRIP_AFTER_DAYS,
EVIDENCE_ARCHIVE_AFTER_DAYS, EVIDENCE_PROXY_COUNT,
EVIDENCE_METRICS_TOKEN, EVIDENCE_SIGNING_KEY_FILES, EVIDENCE_SIGNED_RUNS_ONLY, EVIDENCE_ADAPTERS, EVIDENCE_HOST_NAME,
EVIDENCE_HOST_SILENT_AFTER_SECONDS, EVIDENCE_SHIP_PUSHES_PER_MINUTE, EVIDENCE_SHIP_NEW_RUNS_PER_HOUR,
EVIDENCE_SHIP_QUOTA_MIB, EVIDENCE_SHIP_PARTS_KEEP_SECONDS, EVIDENCE_SHIP_STUCK_AFTER_SECONDS,
EVIDENCE_HOST_CLOCK_SKEW_SECONDS, EVIDENCE_ABANDONED_AFTER_SECONDS, EVIDENCE_COLD_SWEEP_SECONDS, EVIDENCE_EXPORT_ROOT,
EVIDENCE_EXPORT_KEEP_HOURS, EVIDENCE_EXPORT_LEASE_SECONDS, EVIDENCE_EXPORTS_PER_HOUR, EVIDENCE_EXPORT_DISK_BUDGET_BYTES,
EVIDENCE_WATCH_RETENTION_SECONDS, EVIDENCE_IMPORT_READ_AHEAD, EVIDENCE_IMPORT_CALLS_BATCH,
EVIDENCE_PUBLIC_URL, EVIDENCE_WEBHOOK_ALLOWED_HOSTS,
EVIDENCE_WEBHOOK_TIMEOUT_SECONDS, EVIDENCE_ALERTS_RETRY_SECONDS, EVIDENCE_ALERTS_MAX_ATTEMPTS,
EVIDENCE_ALERTS_LOG_KEEP_DAYS, EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS,
EMAIL_USE_SSL, DEFAULT_FROM_EMAIL, EVIDENCE_CLAIM_MINUTES. Parsers are strict: a
malformed value stops start-up. What is unset is what a deployment needs: debugging off, HTTPS on.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import re
import socket
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from receipts.protocol import FINISHED_STATES, RUN_ID_RE

# In a checkout the site's templates/ and static/ sit beside the packages, with manage.py; a
# wheel carries them inside the evidence package (pyproject.toml maps them there).
_CHECKOUT = Path(__file__).resolve().parent.parent
INSTALLED_FROM_WHEEL = not (_CHECKOUT / "manage.py").is_file()
SITE_FILES = Path(__file__).resolve().parent if INSTALLED_FROM_WHEEL else _CHECKOUT
# Where the site keeps its own files by default (a SQLite database, var/): the checkout, or for
# an installed wheel the working directory. A deployment names each one (docs/reference.md, "Settings").
BASE_DIR = Path.cwd() if INSTALLED_FROM_WHEEL else _CHECKOUT


def env_bool(name: str, default: str) -> bool:
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ImproperlyConfigured(f"{name} must be 0 or 1, not {value!r}")
    return value == "1"


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit() or int(value) < 1:
        raise ImproperlyConfigured(f"{name} must be a whole number of days from 1, not {value!r}")
    return int(value)


def env_hours(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit() or int(value) < 1:
        raise ImproperlyConfigured(f"{name} must be a whole number of hours from 1, not {value!r}")
    return int(value)


def env_count(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name} must be a whole number from 0, not {value!r}")
    return int(value)


def env_path(name: str, default: Path) -> Path:
    return Path(os.environ.get(name) or default).expanduser().resolve()


# Secure by default: development turns debugging on explicitly (DJANGO_DEBUG=1).
# Without it a real secret key and host list are required.
DEBUG = env_bool("DJANGO_DEBUG", "0")
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set, and the dashboard needs one unless DJANGO_DEBUG=1; make one, kept "
            "secret and the same on every start, with: python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
        )
    SECRET_KEY = "django-insecure-development-only-key-never-used-in-production"  # noqa: S105 - DEBUG only
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost" if DEBUG else "")

# Where import_runs looks when it is given no ROOT.
EVIDENCE_RUNS_ROOT = env_path("EVIDENCE_RUNS_ROOT", BASE_DIR / "var" / "runs")
# Where retention puts the archives of whole runs.
EVIDENCE_ARCHIVE_ROOT = env_path("EVIDENCE_ARCHIVE_ROOT", BASE_DIR / "var" / "archive")
# Where the runs agent hosts ship (``callproof ship``) are kept, one folder per host, for
# ``import_mirrors`` to import: the server's copy of each shipped run directory.
EVIDENCE_MIRROR_ROOT = env_path("EVIDENCE_MIRROR_ROOT", BASE_DIR / "var" / "mirror")
# Where the worker writes the evidence zips people ask for on a run's page, and how long each
# is kept there before the maintenance task removes it (it is a copy: the run can be exported again).
EVIDENCE_EXPORT_ROOT = env_path("EVIDENCE_EXPORT_ROOT", BASE_DIR / "var" / "exports")
EVIDENCE_EXPORT_KEEP_HOURS = env_hours("EVIDENCE_EXPORT_KEEP_HOURS", 24)
# What one person may ask for (docs/operations.md, "Evidence exports"): exports in an hour
# (0: no limit), and how many bytes the export root may hold before new exports are refused
# (0: no budget). One export of a run per person is in flight at a time, whatever these say.
EVIDENCE_EXPORTS_PER_HOUR = env_count("EVIDENCE_EXPORTS_PER_HOUR", 20)
EVIDENCE_EXPORT_DISK_BUDGET_BYTES = env_count("EVIDENCE_EXPORT_DISK_BUDGET_BYTES", 2 * 1024**3)
# Retention: days after a run's last event (or a person's later decision) until its
# bodies are stripped, and until the whole run is archived. Only a finished run is (its state
# one of the protocol's FINISHED_STATES: the one rule, which pages and /metrics follow too).
RETENTION_STRIP_AFTER_DAYS = env_int("EVIDENCE_STRIP_AFTER_DAYS", 30)
RETENTION_ARCHIVE_AFTER_DAYS = env_int("EVIDENCE_ARCHIVE_AFTER_DAYS", 365)
if "EVIDENCE_FINISHED_STATES" in os.environ:
    raise ImproperlyConfigured(
        "EVIDENCE_FINISHED_STATES is no longer read: a run is finished when its state is one of the "
        f"protocol's finished states ({', '.join(FINISHED_STATES)}), for retention as for every page. "
        "Unset it (docs/RUN_DIRECTORY.md, run states)."
    )
# /metrics answers a request with "Authorization: Bearer <this>", or, when it is unset,
# only a request made on this machine (docs/operations.md, "Metrics").
EVIDENCE_METRICS_TOKEN = os.environ.get("EVIDENCE_METRICS_TOKEN", "")
# A deployment that only browses: no write action is shown or accepted.
EVIDENCE_READ_ONLY = env_bool("EVIDENCE_READ_ONLY", "0")
# Signed runs (docs/RUN_DIRECTORY.md, "Signatures"): the key files the importer checks them with,
# and whether an unsigned run is a finding. Settling in a signed run signs the decision with the
# writer's key, so the web process then needs RECEIPTS_SIGNING_KEY too.
EVIDENCE_SIGNING_KEY_FILES = env_list("EVIDENCE_SIGNING_KEY_FILES", "")
EVIDENCE_SIGNED_RUNS_ONLY = env_bool("EVIDENCE_SIGNED_RUNS_ONLY", "0")
# A big import reads the run in child processes while it stores (evidence/ingest/read_ahead.py); 0 reads
# in the importer's own process, as it did before (the same rows either way).
EVIDENCE_IMPORT_READ_AHEAD = env_bool("EVIDENCE_IMPORT_READ_AHEAD", "1")
# How many receipts that child reads, cross-checks and hands over at a time (the rest wait on disk):
# what it and the importer hold of a run's calls, whatever the run's size; and how many receipts'
# signatures a run's listing holds in memory before it writes them to a private SQLite file.
EVIDENCE_IMPORT_CALLS_BATCH = env_count("EVIDENCE_IMPORT_CALLS_BATCH", 10_000)

# Adapters whose evidence the doubt panel shows (docs/runtime-authors.md, "The doubt panel"):
# module:factory callables, each building adapters with targets this deployment configures;
# never an address read from a run directory. Built once at start-up (evidence/apps.py).
EVIDENCE_ADAPTERS = env_list("EVIDENCE_ADAPTERS", "")
_bad_adapters = [spec for spec in EVIDENCE_ADAPTERS if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec)]
if _bad_adapters:
    raise ImproperlyConfigured(f"EVIDENCE_ADAPTERS names module:factory callables, not {', '.join(_bad_adapters)}")
# Which host this process is (docs/operations.md, "Beyond one machine"). An importer registers
# under this name and owns the runs it imports; a person's decision is written into a run
# directory by its owner's importer, or at once by a web process of the same host.
EVIDENCE_HOST_NAME = os.environ.get("EVIDENCE_HOST_NAME") or socket.gethostname()
if not RUN_ID_RE.fullmatch(EVIDENCE_HOST_NAME) or EVIDENCE_HOST_NAME.startswith("."):
    raise ImproperlyConfigured(
        f"EVIDENCE_HOST_NAME must be 1-128 of A-Z a-z 0-9 . _ - (not starting with a dot), not {EVIDENCE_HOST_NAME!r}"
    )
# A host whose importer has not finished a pass for this long is silent: an inbox item, down on /metrics.
EVIDENCE_HOST_SILENT_AFTER_SECONDS = env_count("EVIDENCE_HOST_SILENT_AFTER_SECONDS", 120)
if EVIDENCE_HOST_SILENT_AFTER_SECONDS < 1:
    raise ImproperlyConfigured("EVIDENCE_HOST_SILENT_AFTER_SECONDS must be a whole number of seconds from 1")

# An "I'm on it" claim on an inbox item lasts this long unless its person acts or lets it go
# (evidence/review/claims.py): a minute to a day, so that a forgotten claim never hides an item for long.
EVIDENCE_CLAIM_MINUTES = env_count("EVIDENCE_CLAIM_MINUTES", 30)
if not 1 <= EVIDENCE_CLAIM_MINUTES <= 1440:
    raise ImproperlyConfigured("EVIDENCE_CLAIM_MINUTES must be a whole number of minutes from 1 to 1440")


def env_seconds(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit() or int(value) < 1:
        raise ImproperlyConfigured(f"{name} must be a whole number of seconds from 1, not {value!r}")
    return int(value)


# A running export's worker beats its heart a quarter of this often: a running export with no
# heartbeat for this long lost its worker (killed, restarted) and is shown, then marked, failed.
EVIDENCE_EXPORT_LEASE_SECONDS = env_seconds("EVIDENCE_EXPORT_LEASE_SECONDS", 120)
# What agent hosts that ship (``callproof ship``) may do, and when a path from one is stuck
# (docs/operations.md, "How the shipper and the server agree"). A host's pushes a minute (a
# bucket: a minute's worth at once), the runs it may start shipping in an hour, and what its
# folder of the mirror may hold (0: no limit); a refusal says which and when to try again.
EVIDENCE_SHIP_PUSHES_PER_MINUTE = env_count("EVIDENCE_SHIP_PUSHES_PER_MINUTE", 1200)
EVIDENCE_SHIP_NEW_RUNS_PER_HOUR = env_count("EVIDENCE_SHIP_NEW_RUNS_PER_HOUR", 1000)
EVIDENCE_SHIP_QUOTA_MIB = env_count("EVIDENCE_SHIP_QUOTA_MIB", 50 * 1024)
# A file shipped in chunks whose last chunk has not come for this long is removed (its shipper
# died, or moved on): it starts again from its first chunk.
EVIDENCE_SHIP_PARTS_KEEP_SECONDS = env_seconds("EVIDENCE_SHIP_PARTS_KEEP_SECONDS", 86400)
# A run short of its host's ledger with nothing of it arriving, a run its shipper cannot send,
# a host whose every push is refused, or whose decisions wait, for this long: stuck (an inbox
# item, /metrics, an alert rule). Minutes: a decision reaches a host in seconds when it works.
EVIDENCE_SHIP_STUCK_AFTER_SECONDS = env_seconds("EVIDENCE_SHIP_STUCK_AFTER_SECONDS", 300)
# A host whose clock differs from the server's by more than this is said to be off (the Hosts
# page, a finding); its times are then checked against the server's, not taken as they are.
EVIDENCE_HOST_CLOCK_SKEW_SECONDS = env_seconds("EVIDENCE_HOST_CLOCK_SKEW_SECONDS", 60)
# A host's watch applies retention to its own runs this often (0: never; the worker's retention
# task then archives only the runs of the host it runs on). Only a run's own host touches its files.
EVIDENCE_WATCH_RETENTION_SECONDS = env_count("EVIDENCE_WATCH_RETENTION_SECONDS", 3600)

# Alerts (evidence/review/alerts.py, docs/operations.md "Alerts that reach a person"). The dashboard's
# address as its people reach it, for the links a notification carries (without it: a path).
EVIDENCE_PUBLIC_URL = os.environ.get("EVIDENCE_PUBLIC_URL", "").rstrip("/")
if EVIDENCE_PUBLIC_URL and not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", EVIDENCE_PUBLIC_URL):
    raise ImproperlyConfigured(f"EVIDENCE_PUBLIC_URL must be an http or https address, not {EVIDENCE_PUBLIC_URL!r}")
# A webhook is a request this server makes: unset, any public address (never loopback, private or
# link-local ones); set, only these host names (any address: a receiver inside the network).
EVIDENCE_WEBHOOK_ALLOWED_HOSTS = [host.lower() for host in env_list("EVIDENCE_WEBHOOK_ALLOWED_HOSTS", "")]
# A receiver that answers slowly is given up on after this (the try is retried later).
EVIDENCE_WEBHOOK_TIMEOUT_SECONDS = env_seconds("EVIDENCE_WEBHOOK_TIMEOUT_SECONDS", 5)
# A failed notification is tried again after this, doubling each time up to 60 times it (1 min .. 1 h),
# and given up after EVIDENCE_ALERTS_MAX_ATTEMPTS tries (recorded in the delivery log).
EVIDENCE_ALERTS_RETRY_SECONDS = env_seconds("EVIDENCE_ALERTS_RETRY_SECONDS", 60)
EVIDENCE_ALERTS_MAX_ATTEMPTS = env_count("EVIDENCE_ALERTS_MAX_ATTEMPTS", 10)
if EVIDENCE_ALERTS_MAX_ATTEMPTS < 1:
    raise ImproperlyConfigured("EVIDENCE_ALERTS_MAX_ATTEMPTS must be a whole number of tries from 1")
EVIDENCE_ALERTS_LOG_KEEP_DAYS = env_int("EVIDENCE_ALERTS_LOG_KEEP_DAYS", 30)
# E-mail notifications go through Django's mail (SMTP): these are Django's own settings.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = env_count("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", "0")
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", "0")
EMAIL_TIMEOUT = 10  # a mail server that does not answer does not hold the worker
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "callproof@localhost")

# The watch's hot set (docs/operations.md, "How a pass chooses what to check"). A run not finished
# with no event for a day is abandoned: an agent's run lasts minutes to hours, a runtime that
# resumes after a crash does so within hours, and a day still lets a run paused overnight go on
# without a finding; its run_abandoned finding closes by itself when it writes again.
EVIDENCE_ABANDONED_AFTER_SECONDS = env_seconds("EVIDENCE_ABANDONED_AFTER_SECONDS", 86400)
# Every cold run (finished, or abandoned) is checked again at least this often: a change there
# (a late receipt, a tampered file, an abandoned run resuming) is found within an hour, and a
# sweep of 20,000 runs costs a few seconds of every hour (docs/benchmarks.md, "The watch").
EVIDENCE_COLD_SWEEP_SECONDS = env_seconds("EVIDENCE_COLD_SWEEP_SECONDS", 3600)

INSTALLED_APPS = [
    "evidence.web.admin_apps.RoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",  # intcomma: a million events reads as 1,000,000
    "django_htmx",
    "template_partials",
    "axes",
    # Django's tasks API (the backport) and its database backend: the queue is a table.
    "django_tasks",
    "django_tasks_db",
    # The dashboard (its app label is still "receipts": evidence/apps.py says why).
    "evidence",
]

MIDDLEWARE = [
    # Outermost, so that every answer carries them: a foreign Host is refused (400) inside
    # SecurityMiddleware or CommonMiddleware, and that page passes only the middleware around it.
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "evidence.web.middleware.NoStoreMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    # After LocaleMiddleware, so that its 400 speaks this request's language (before, the
    # thread's language was the previous request's).
    "evidence.web.middleware.RefuseNulMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "evidence.web.middleware.RoleRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout page.
    "axes.middleware.AxesMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "evidence.web.urls"
WSGI_APPLICATION = "evidence.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [SITE_FILES / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
                "evidence.web.context_processors.inbox",
                "evidence.web.context_processors.version",
                "evidence.web.context_processors.language_next",
            ],
            "builtins": ["template_partials.templatetags.partials"],
        },
    }
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "0")),
        # A kept connection that PostgreSQL ended (a restart, a failover, pg_terminate_backend)
        # is found before it is used and opened again: no 500, no worker or watch left dead.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the importer; IMMEDIATE takes the write lock
    # at BEGIN, so two writers queue on busy_timeout instead of deadlocking. A
    # 64 MiB page cache (the default is 2) keeps a million-row import's index
    # pages in memory; it is allocated only as pages are read.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }

# Background work (evidence exports, maintenance) is queued in the same database and run by
# `manage.py db_worker`: no broker to deploy, on SQLite as on PostgreSQL.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Argon2 first: new and changed passwords are hashed with it, older hashes still verify.
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]

# Login throttling (django-axes): five failed logins for one user name from one address
# lock that pair out for 15 minutes (429 and a page that says so); a success resets it.
# Behind a reverse proxy every request comes from the proxy's address: set
# EVIDENCE_PROXY_COUNT to the number of proxies in front, and the address is the one the
# outermost proxy appended to X-Forwarded-For (evidence/lib/proxy.py: what a client writes
# there itself is never read). Clients must not reach the server around the proxies.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = dt.timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
PROXY_COUNT = env_count("EVIDENCE_PROXY_COUNT", 0)
AXES_CLIENT_IP_CALLABLE = "evidence.lib.proxy.client_address"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs"
LOGOUT_REDIRECT_URL = "login"

# English and Simplified Chinese (docs/glossary.md holds the terms): the browser's
# Accept-Language chooses, and the switcher in the header overrides it with a cookie.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
USE_I18N = True
# The catalogue travels inside the evidence package, so an installed wheel has it too.
LOCALE_PATHS = [Path(__file__).resolve().parent / "locale"]
# Our own formats beside Django's (evidence/formats/): times to the second, as the ledger
# holds them, and digits grouped in threes in both languages.
FORMAT_MODULE_PATH = ["evidence.formats"]
LANGUAGE_COOKIE_NAME = "callproof_language"
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_HTTPONLY = True
LANGUAGE_COOKIE_SAMESITE = "Lax"
TIME_ZONE = "UTC"
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT") or BASE_DIR / "var" / "staticfiles")


def package_folder(name: str) -> Path:
    """An installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImproperlyConfigured(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


# django-ninja's own Swagger UI files (its static/ninja/), served from here: the API docs need no CDN.
# Its folder rather than the package as an app: an app is imported by every process that starts
# Django, and django-ninja with pydantic costs one 0.2 s (a third of what Django's start imports),
# where only the web pages use it.
STATICFILES_DIRS = [SITE_FILES / "static", package_folder("ninja") / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# HTTPS-only cookies, HSTS and the redirect, unless debugging. DJANGO_HTTPS=0 is
# only for serving plain HTTP on loopback (`make demo`): browsers will not send a
# secure cookie over http://127.0.0.1.
HTTPS = env_bool("DJANGO_HTTPS", "0" if DEBUG else "1")
if HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    LANGUAGE_COOKIE_SECURE = True

# Hardened pages: no inline script or style and no eval anywhere (htmx is served from our
# static files, its own styles and eval turned off in base.html), no framing, no referrer
# beyond this site, and cookies that scripts cannot read.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # forms carry the token; htmx reads it from the page, not the cookie
CSRF_FAILURE_VIEW = "evidence.web.views.errors.csrf_failure"  # the site's page, keeping what was typed
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"  # no cookie of its own

# One JSON object a line (evidence/lib/logs.py): what the importer, settlements, exports and
# retention do, at INFO, each with its run_id and call_id; everything else from WARNING.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "evidence.lib.logs.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"callproof": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
