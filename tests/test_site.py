"""The site's skeleton: login everywhere but the health check, migrations, deploy checks."""

from __future__ import annotations

import os
import subprocess
import sys
from http import HTTPStatus
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

PROJECT = Path(__file__).resolve().parent.parent


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
    client.force_login(django_user_model.objects.create_user("alice"))
    assert client.get("/").status_code == HTTPStatus.OK


@pytest.mark.django_db
def test_the_login_page_logs_a_person_in(client, django_user_model):
    django_user_model.objects.create_user("alice", password="a-long-password-1")
    page = client.get("/accounts/login/")
    assert page.status_code == HTTPStatus.OK and b'for="id_username"' in page.content
    response = client.post("/accounts/login/", {"username": "alice", "password": "a-long-password-1"})
    assert response.status_code == HTTPStatus.FOUND and response["Location"] == "/"


@pytest.mark.django_db
def test_no_migrations_are_pending():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)


@pytest.mark.django_db
def test_demo_login_prints_a_working_login(client):
    out = StringIO()
    call_command("demo_login", stdout=out)
    username, password = out.getvalue().split(" as ")[1].strip().split(" / ")
    assert client.login(username=username, password=password)


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
    assert "no issues" in completed.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"DJANGO_DEBUG": "0"}, "DJANGO_SECRET_KEY must be set"),
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


def test_the_project_reads_nothing_beside_its_checkout():
    # A user's clone has nothing beside it; .ci/run also runs the suite from such a copy.
    beside = "../" + "shared"
    tracked = subprocess.run(["git", "ls-files"], cwd=PROJECT, capture_output=True, text=True, check=True).stdout
    readers = [
        name
        for name in tracked.splitlines()
        if (PROJECT / name).is_file() and beside in (PROJECT / name).read_text(errors="replace")
    ]
    assert readers == []
