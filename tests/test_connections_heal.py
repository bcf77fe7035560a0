"""Connections that heal: PostgreSQL ends a process's connection (a restart, a failover, an
administrator's ``pg_terminate_backend``) and the process carries on with a new one.

Real processes on the test's PostgreSQL database, their connections ended from outside as
PostgreSQL ends them; each is kept open as deploy/ keeps them (``DATABASE_CONN_MAX_AGE=60``).
"""

from __future__ import annotations

import http.client
import shutil
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from tests.helpers import PROJECT, until
from tests.serving import free_port, stop, wait_for
from tests.subprocess_db import child_env, manage, manage_command, start_worker, this_database_url

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

KEPT_OPEN = {"DATABASE_CONN_MAX_AGE": "60"}


def end_the_other_connections() -> int:
    """``pg_terminate_backend`` on every other connection to the test's database: how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def one_value(query: str) -> object:
    with connection.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchone()[0]


def test_the_web_answers_the_first_request_after_its_connection_was_ended(tmp_path):
    url = this_database_url()
    port = free_port()
    # One worker, so that the request after the kill is answered by the process whose connection died.
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "evidence.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=PROJECT, env=child_env(url) | KEPT_OPEN | {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "heal-" + "k" * 50,
                                                     "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "DJANGO_HTTPS": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(port, web)

        def healthz() -> int:
            client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            client.request("GET", "/healthz")
            return client.getresponse().status

        assert healthz() == 200
        assert end_the_other_connections() >= 1, "the web process kept its connection open"
        assert [healthz() for _ in range(3)] == [200, 200, 200]
    finally:
        stop(web)


@pytest.mark.parametrize("ended", ["in its first pass", "after its first run"])
def test_a_watch_whose_connection_was_ended_goes_on_importing(demo_source, tmp_path, ended):
    url = this_database_url()
    root = tmp_path / "runs"
    root.mkdir()
    first, later = sorted(demo_source.iterdir())[:2]
    shutil.copytree(first, root / first.name, symlinks=True)
    watch = subprocess.Popen(
        manage_command("import_runs", str(root), "--watch", "--interval", "0.2"),
        cwd=PROJECT, env=child_env(url) | KEPT_OPEN | {"EVIDENCE_HOST_NAME": "healing"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        if ended == "in its first pass":  # registered, its first pass under way
            until(lambda: one_value("SELECT count(*) FROM receipts_host WHERE name = 'healing'"), "the host row")
        else:
            until(
                lambda: one_value(f"SELECT count(*) FROM receipts_run WHERE run_id = '{first.name}'"), "the first run"
            )
        # Ended inside a pass or between two (a pass is about as long as the interval here).
        assert end_the_other_connections() >= 1, "the watch kept its connection open"
        for _ in range(4):
            time.sleep(0.3)
            end_the_other_connections()
        shutil.copytree(later, root / later.name, symlinks=True)
        for run in (first, later):
            until(lambda: one_value(f"SELECT count(*) FROM receipts_run WHERE run_id = '{run.name}'"),  # noqa: B023
                  f"{run.name}, imported after the connection was ended")  # fmt: skip
        assert watch.poll() is None, "the watch is still watching"
    finally:
        watch.send_signal(signal.SIGTERM)
        _, said = watch.communicate(timeout=30)
        print(said[-20_000:])  # what the watch said, in the report of a failure
    assert watch.returncode == 0, said
    assert one_value("SELECT stopped_at IS NOT NULL FROM receipts_host WHERE name = 'healing'") is True


def test_a_worker_whose_connection_was_ended_makes_the_next_task(tmp_path):
    url = this_database_url()
    log = tmp_path / "worker.log"
    worker = start_worker(url, log, **KEPT_OPEN)
    enqueue = "from evidence.maintenance import clear_sessions; print(clear_sessions.enqueue().id)"
    try:
        first = manage(url, "shell", "-v", "0", "-c", enqueue, check=True).stdout.strip()
        status = f"SELECT status FROM django_tasks_database_dbtaskresult WHERE id = '{first}'"
        until(lambda: one_value(status) == "SUCCESSFUL", "the first task made")
        assert end_the_other_connections() >= 1, "the worker kept its connection open"
        second = manage(url, "shell", "-v", "0", "-c", enqueue, check=True).stdout.strip()
        status = f"SELECT status FROM django_tasks_database_dbtaskresult WHERE id = '{second}'"
        until(lambda: one_value(status) == "SUCCESSFUL", "the task queued after the connection was ended")
        assert worker.poll() is None, log.read_text()
    finally:
        stop(worker)


def test_a_stop_that_cuts_a_query_short_is_found_behind_the_error_it_leaves():
    """A SIGTERM becomes an interrupt inside a query (the watch's handler); what leaves the
    transaction is the interrupt, or a database error raised while it unwound (a cursor or a
    rollback on a connection left mid-statement). Either way ``stopping.interrupted`` finds it,
    so the watch stops instead of taking the error for a database gone and going on."""
    from django.db import Error as DatabaseFailure
    from django.db import transaction

    from evidence.lib import stopping

    previous = signal.signal(signal.SIGALRM, stopping.raise_interrupt)
    left: BaseException | None = None
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(20)")
    except (KeyboardInterrupt, DatabaseFailure) as error:
        left = error
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        connection.close()
    assert left is not None, "the query ran to its end: the interrupt never came"
    assert stopping.interrupted(left), repr(left)
    assert not stopping.interrupted(DatabaseFailure("the database went away")), "an error of its own is not a stop"
    # What the watch met once: the rollback's own error, raised while the interrupt unwound.
    with pytest.raises(DatabaseFailure) as during:
        _rollback_failing_while_interrupted()
    assert stopping.interrupted(during.value)


def _rollback_failing_while_interrupted() -> None:
    from django.db import Error as DatabaseFailure

    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise DatabaseFailure("can't rollback, connection in transaction status ACTIVE") from None
