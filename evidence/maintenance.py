"""What the worker (``manage.py db_worker``) runs on a schedule, by the name a timer gives it.

Tasks are queued in the database (django-tasks' database backend, settings ``TASKS``): a request
queues and returns; ``manage.py enqueue_maintenance NAME...``, started by a systemd timer or a
platform's scheduler, queues the maintenance. Each room keeps its own tasks beside the code they
call (exports in evidence/export/jobs.py, alerts and claims in evidence/review/, retention in
evidence/retention/actions.py), so the commands and the tasks run the same code; this module holds
the schedule's names and the housekeeping of Django's own records (sessions, login throttling).
"""

from __future__ import annotations

import logging

from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.http import HttpRequest
from django_tasks import task

from evidence.export.jobs import remove_expired_exports
from evidence.retention.actions import apply_retention
from evidence.review.alerts import notify
from evidence.review.claims import expire_claims

log = logging.getLogger("callproof.tasks")

# The throttle's records of logins (django-axes' access logs) are kept this long.
LOGIN_LOG_KEEP_DAYS = 30


@task()
def clear_sessions() -> dict[str, object]:
    before = Session.objects.count()
    call_command("clearsessions")  # Django's own, for whichever session engine is configured
    count = before - Session.objects.count()
    log.info("expired sessions removed", extra={"event": "sessions_cleared", "count": count})
    return {"sessions": count}


@task()
def clean_login_records() -> dict[str, object]:
    """django-axes' records: failed attempts past the cool-off (they lock nobody out any more),
    and access logs older than ``LOGIN_LOG_KEEP_DAYS``."""
    from axes.handlers.database import AxesDatabaseHandler

    handler = AxesDatabaseHandler()
    # Axes reckons the cool-off from the moment a request carries; a request with none is now.
    request = HttpRequest()
    request.axes_attempt_time = None  # type: ignore[attr-defined]
    attempts = handler.clean_expired_user_attempts(request)
    logs = handler.reset_logs(age_days=LOGIN_LOG_KEEP_DAYS)
    log.info("login records cleaned", extra={"event": "login_records_cleaned", "count": attempts + logs})
    return {"attempts": attempts, "logs": logs}


# What ``enqueue_maintenance`` may queue, by the name a timer gives it.
MAINTENANCE = {
    "retention": apply_retention,
    "sessions": clear_sessions,
    "logins": clean_login_records,
    "exports": remove_expired_exports,
    # Every minute or so: silent hosts and snoozes that end are found by time, not by an import pass.
    "alerts": notify,
    "claims": expire_claims,
}
