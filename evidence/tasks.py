"""What the worker (``manage.py db_worker``) runs: evidence exports, and maintenance on a schedule.

Tasks are queued in the database (django-tasks' database backend, settings ``TASKS``): a request
queues and returns; ``manage.py enqueue_maintenance NAME...``, started by a systemd timer or a
platform's scheduler, queues the maintenance. Each task is a thin call into the module that owns
the work, so the commands and the tasks run the same code.
"""

from __future__ import annotations

import logging

from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.http import HttpRequest
from django_tasks import task

from evidence import alerts, exports, retention
from receipts import protocol

log = logging.getLogger("callproof.tasks")

# The throttle's records of logins (django-axes' access logs) are kept this long.
LOGIN_LOG_KEEP_DAYS = 30


@task()
def make_export(export_id: int) -> dict[str, object]:
    export = exports.make(export_id)
    return {"export": export.pk, "size": export.size}


@task()
def apply_retention() -> dict[str, object]:
    results = retention.apply_due(now=protocol.utc_now(), apply=True)
    applied = [result for result in results if result.get("applied") not in (None, "nothing")]
    log.info("retention applied", extra={"event": "retention_applied", "count": len(applied)})
    return {"runs": len(results), "applied": applied}


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


@task()
def remove_expired_exports() -> dict[str, object]:
    return {"exports": exports.remove_expired(now=protocol.utc_now())}


@task()
def notify() -> dict[str, object]:
    """Tell the notification rules' destinations of the inbox's new items (evidence/alerts.py),
    then queue itself for the earliest retry still due."""
    done = alerts.run()
    later = alerts.next_due()
    if later is not None:
        alerts.queue(at=later)
    return done


@task()
def expire_claims() -> dict[str, object]:
    """ "I'm on it" claims that ran out: removed, each an audit entry (evidence/claims.py)."""
    from evidence import claims

    return {"claims": claims.expire(now=protocol.utc_now())}


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
