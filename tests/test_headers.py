"""Every response carries the hardening headers; in production settings, cookies are Secure
and HSTS is on. The browser test checks that no page breaks the policy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import PROJECT, join
from tests.test_roles import ACTS, WHO

POLICY_MUST_HAVE = ("default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'",
                    "object-src 'none'", "base-uri 'none'")  # fmt: skip


def check_headers(response, where: str) -> None:
    policy = response.headers.get("Content-Security-Policy", "")
    assert all(part in policy for part in POLICY_MUST_HAVE), (where, policy)
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, (where, policy)
    assert response.headers.get("X-Frame-Options") == "DENY", where
    assert response.headers.get("Referrer-Policy") == "same-origin", where
    assert response.headers.get("X-Content-Type-Options") == "nosniff", where
    cache = {part.strip() for part in response.headers.get("Cache-Control", "").split(",")}
    assert {"no-store", "private"} <= cache, (where, cache)
    for name, cookie in response.cookies.items():
        if cookie.value == "" and cookie["max-age"] == 0:
            continue  # a cookie being removed (the session, at logout)
        assert cookie["httponly"] and cookie["samesite"] == "Lax", (where, name)


@pytest.mark.parametrize("who", ["anonymous", "confirmer", "exporter", "admin"])
def test_every_response_carries_the_hardening_headers(who, demo, client, django_user_model):
    assert who in WHO
    if who != "anonymous":
        client.force_login(join(django_user_model.objects.create_user("someone"), who))
    for act in ACTS:
        response = getattr(client, act.method)(act.url(), act.data())
        check_headers(response, f"{who} {act.method} {act.name}")
        if response.streaming:
            b"".join(response.streaming_content)  # a download: read, so that its file is closed
    check_headers(client.get("/no-such-page/"), "a 404")


PRODUCTION_PROBE = """
import json, os
import django
django.setup()
from django.conf import settings
from django.test import Client
from django.test.utils import override_settings
# Static files are collected for a deployment; this probe has none, so their names are plain.
plain = {**settings.STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
override_settings(STORAGES=plain).enable()
client = Client()
login = client.get("/accounts/login/", secure=True)
insecure = client.get("/accounts/login/")
cookie = login.cookies["csrftoken"]
print(json.dumps({
    "hsts": login.headers.get("Strict-Transport-Security"),
    "redirect": [insecure.status_code, insecure.headers.get("Location")],
    "cookie": {"secure": bool(cookie["secure"]), "httponly": bool(cookie["httponly"])},
    "policy": login.headers.get("Content-Security-Policy"),
}))
"""


def test_production_settings_send_hsts_and_secure_cookies(tmp_path):
    """evidence/settings.py as a deployment runs it: debug off, HTTPS on (the default)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "evidence.settings",
        "DJANGO_SECRET_KEY": "a-production-secret-key-" + "x" * 40,
        "DJANGO_ALLOWED_HOSTS": "testserver",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'prod.sqlite3'}",
    }
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=PROJECT, env=env, check=True)
    completed = subprocess.run(
        [sys.executable, "-c", PRODUCTION_PROBE], cwd=PROJECT, env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(completed.stdout)
    assert seen["hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert seen["redirect"] == [301, "https://testserver/accounts/login/"]
    assert seen["cookie"] == {"secure": True, "httponly": True}
    assert "script-src 'self'" in seen["policy"]
