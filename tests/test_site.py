"""The site's skeleton: login everywhere but the health check, deploy checks (migrations: test_migrations.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from http import HTTPStatus
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from tests.helpers import PROJECT, join


@pytest.mark.django_db
def test_healthz_answers_without_login(client):
    response = client.get("/healthz")
    assert response.status_code == HTTPStatus.OK
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_the_runs_page_needs_a_login(client, django_user_model):
    response = client.get("/")
    assert response.status_code == HTTPStatus.FOUND
    assert response["Location"].startswith("/accounts/login/")
    client.force_login(join(django_user_model.objects.create_user("alice"), "viewer"))
    assert client.get("/").status_code == HTTPStatus.OK


@pytest.mark.django_db
def test_the_login_page_logs_a_person_in(client, django_user_model):
    join(django_user_model.objects.create_user("alice", password="a-long-password-1"), "viewer")
    page = client.get("/accounts/login/")
    assert page.status_code == HTTPStatus.OK and b'for="id_username"' in page.content
    response = client.post("/accounts/login/", {"username": "alice", "password": "a-long-password-1"})
    assert response.status_code == HTTPStatus.FOUND and response["Location"] == "/"


@pytest.mark.django_db
def test_demo_login_prints_a_working_login_at_the_address_served(client):
    out = StringIO()
    call_command("demo_login", "--url", "http://127.0.0.1:8765/", stdout=out)
    assert out.getvalue().startswith("Log in at http://127.0.0.1:8765/ as ")
    username, password = out.getvalue().split(" as ")[1].strip().split(" / ")
    response = client.post(reverse("login"), {"username": username, "password": password})
    assert response.status_code == 302 and client.get(reverse("runs")).status_code == 200


@pytest.mark.django_db
def test_demo_login_banner_is_the_login_and_claims_nothing_runs(client):
    """It serves nothing, so it says nothing of a running demo or of stopping one: `make demo` adds
    that once its server answers (tests/test_make_demo.py). Issue 37: it said "demo is running"."""
    out = StringIO()
    call_command("demo_login", "--banner", "--url", "http://127.0.0.1:8765/", stdout=out)
    banner = out.getvalue()
    assert "  Callproof demo login\n    Open       http://127.0.0.1:8765/\n    User       demo\n" in banner
    assert not re.search(r"running|Ctrl-C|Stop|var/", banner), banner
    password = re.search(r"Password   (\S+)", banner)
    assert password is not None
    response = client.post(reverse("login"), {"username": "demo", "password": password.group(1)})
    assert response.status_code == 302 and client.get(reverse("runs")).status_code == 200


def settings_of(**env: str) -> dict:
    """DEBUG, the HTTPS settings and ALLOWED_HOSTS as a process started with ``env`` sees them."""
    code = (
        "import json, django; from django.conf import settings; django.setup(); print(json.dumps({"
        "'DEBUG': settings.DEBUG, 'SECURE_SSL_REDIRECT': getattr(settings, 'SECURE_SSL_REDIRECT', False),"
        "'SESSION_COOKIE_SECURE': settings.SESSION_COOKIE_SECURE, 'ALLOWED_HOSTS': settings.ALLOWED_HOSTS}))"
    )
    env = settings_env(DJANGO_SETTINGS_MODULE="evidence.settings", **env)
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout)


def test_debugging_is_off_and_https_on_unless_asked_for():
    production = settings_of(DJANGO_SECRET_KEY="s" * 60, DJANGO_ALLOWED_HOSTS="callproof.example.com")
    assert production == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "ALLOWED_HOSTS": ["callproof.example.com"],
    }
    development = settings_of(DJANGO_DEBUG="1")
    assert development["DEBUG"] is True and development["SECURE_SSL_REDIRECT"] is False
    loopback = settings_of(DJANGO_SECRET_KEY="s" * 60, DJANGO_HTTPS="0")
    assert loopback["DEBUG"] is False and loopback["SESSION_COOKIE_SECURE"] is False


@pytest.mark.django_db
def test_a_missing_page_is_the_branded_404(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("alice"), "viewer"))
    response = client.get("/runs/no-such-run/")
    assert response.status_code == HTTPStatus.NOT_FOUND
    page = response.content.decode()
    assert "<title>Not found · Callproof</title>" in page and "Back to the runs" in page


@pytest.mark.django_db
def test_a_server_error_is_the_branded_500_without_a_traceback(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("alice"), "viewer"))
    client.raise_request_exception = False
    with connection.cursor() as cursor:  # a real failure: the table the page reads is gone
        cursor.execute("DROP TABLE receipts_finding")
    response = client.get("/findings/")
    assert response.status_code == HTTPStatus.INTERNAL_SERVER_ERROR
    page = response.content.decode()
    assert "<title>Server error · Callproof</title>" in page
    assert "Traceback" not in page and "receipts_finding" not in page and "Exception" not in page


def settings_env(**values: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "DATABASE_URL"))}
    env.update(values)
    return env


def test_check_deploy_is_clean_in_production_settings():
    env = settings_env(
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="a-production-secret-" + "x" * 50,
        DJANGO_ALLOWED_HOSTS="callproof.example.com",
    )
    completed = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "no issues (0 silenced)" in completed.stdout, completed.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "DJANGO_SECRET_KEY is not set"),
        ({"DJANGO_DEBUG": "0"}, "DJANGO_SECRET_KEY is not set"),
        ({"DJANGO_DEBUG": "1", "DJANGO_HTTPS": "maybe"}, "DJANGO_HTTPS must be 0 or 1"),
        ({"DJANGO_DEBUG": "yes"}, "DJANGO_DEBUG must be 0 or 1"),
    ],
)
def test_settings_refuse_a_bad_environment(values, message):
    completed = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=PROJECT,
        env=settings_env(**values),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode != 0 and message in completed.stderr


def project_files() -> list[Path]:
    """The project's own files: what a clone holds, not what .gitignore keeps out of it."""
    skipped = {"var", "__pycache__", "build", "screenshots", "out"}
    files = []
    for folder, subfolders, names in os.walk(PROJECT):
        subfolders[:] = [
            name
            for name in subfolders
            if not name.startswith(".") and name not in skipped and not name.endswith(".egg-info")
        ]
        files += [Path(folder, name) for name in names if not name.endswith((".pyc", ".sqlite3"))]
    return files


def test_the_project_reads_nothing_beside_its_checkout():
    # A user's clone has nothing beside it; .ci/run also runs the suite from such a copy.
    beside = "../" + "shared"
    readers = [path for path in project_files() if beside in path.read_text(errors="replace")]
    assert len(project_files()) > 100 and readers == []


def test_manage_py_names_a_missing_setting_in_one_line():
    completed = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=settings_env(), capture_output=True, text=True
    )
    assert completed.returncode == 1
    assert completed.stderr == (
        "error: DJANGO_SECRET_KEY is not set, and the dashboard needs one unless DJANGO_DEBUG=1; make one, kept secret "
        "and the same on every start, with: python3 -c 'import secrets; print(secrets.token_urlsafe(50))'\n"
    )


def test_five_failed_logins_lock_that_name_out_from_that_address(client, django_user_model):
    join(django_user_model.objects.create_user("mallory-target", password="the-right-password-1"), "viewer")
    guesses = [client.post(reverse("login"), {"username": "mallory-target", "password": "a-guess"}) for _ in range(5)]
    assert [response.status_code for response in guesses] == [200, 200, 200, 200, 429]  # the fifth locks
    locked = client.post(reverse("login"), {"username": "mallory-target", "password": "the-right-password-1"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert client.get(reverse("runs")).status_code == 302, "not logged in"
    other = client.post(reverse("login"), {"username": "mallory-target", "password": "the-right-password-1"},
                        REMOTE_ADDR="192.0.2.9")  # fmt: skip
    assert other.status_code == 302, "the same name from another address is not locked"


def test_production_hashes_passwords_with_argon2():
    code = (
        "import django; django.setup(); from django.contrib.auth.hashers import make_password; "
        "print(make_password('a-long-password-1'))"
    )
    env = settings_env(DJANGO_SETTINGS_MODULE="evidence.settings", DJANGO_DEBUG="0", DJANGO_SECRET_KEY="k" * 50)
    completed = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True)
    assert completed.stdout.startswith("argon2$argon2id$"), completed.stderr
