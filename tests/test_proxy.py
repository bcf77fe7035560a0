"""The dashboard behind Debian's nginx, configured by deploy/nginx.conf (docs/operations.md's snippet),
served by gunicorn as a deployment serves it (EVIDENCE_PROXY_COUNT=1): a proxy never opens
a door. The login throttle sees the client's real address, whatever the client writes into
X-Forwarded-For; one client's failures do not lock a user name for everyone; and /metrics is
not public because the proxy makes every request come from loopback.

Clients on different addresses are real: Linux answers on all of 127.0.0.0/8, so a client
socket bound to 127.0.0.2 or 127.0.0.3 reaches nginx from that address.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.helpers import PROJECT
from tests.serving import Browser, free_port, stop, wait_for
from tests.subprocess_db import database_url_for_children

NGINX = "/usr/sbin/nginx"
PASSWORD = "the-right-password-1"
METRICS_TOKEN = "metrics-token-for-the-proxy-test"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.nginx,
    pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is installed by `make test` (make test-packages)"),
]


class Ports(NamedTuple):
    snippet: int  # nginx configured by deploy/nginx.conf
    bare: int  # nginx passing requests on with no X-Forwarded-For (the README's old snippet)


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[Ports]:
    """nginx's ports, with gunicorn behind them on a database the test shares."""
    url = database_url_for_children(tmp_path)
    static_root = tmp_path / "static"
    # The deployment's settings, not the suite's (which turn debugging on): a refused request
    # then shows the page a deployment shows, and passwords are hashed as in production.
    env = {
        **os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "evidence.settings", "DJANGO_DEBUG": "0",
        "DJANGO_HTTPS": "0", "DJANGO_SECRET_KEY": "proxy-test-" + "k" * 50,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "EVIDENCE_PROXY_COUNT": "1",
        "DJANGO_STATIC_ROOT": str(static_root),
    }  # fmt: skip
    env.pop("EVIDENCE_METRICS_TOKEN", None)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", f"from django.contrib.auth import get_user_model; "
                    f"from evidence.lib.roles import ensure_roles; u = get_user_model().objects.create_user('alice', "
                    f"password={PASSWORD!r}); u.groups.add(ensure_roles()['viewer'])"], cwd=PROJECT, env=env,
                   check=True)  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=PROJECT, env=env,
                   check=True)  # fmt: skip
    app_port, proxy_port, bare_port = free_port(), free_port(), free_port()
    gunicorn = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "evidence.wsgi", "-b", f"127.0.0.1:{app_port}", "-w", "2"],
        cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    site = (PROJECT / "deploy" / "nginx.conf").read_text().replace("127.0.0.1:8000", f"127.0.0.1:{app_port}")
    assert f"127.0.0.1:{app_port}" in site, "deploy/nginx.conf no longer proxies to gunicorn's address"
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    (prefix / "site.conf").write_text(site)
    (prefix / "nginx.conf").write_text(
        f"pid {prefix}/nginx.pid; error_log {prefix}/error.log; worker_processes 1;\n"
        "events {}\n"
        f"http {{ access_log off; client_body_temp_path {prefix}; proxy_temp_path {prefix};\n"
        f"  server {{ listen 127.0.0.1:{proxy_port}; include {prefix}/site.conf; }}\n"
        # The snippet the README gave before: no X-Forwarded-For at all.
        f"  server {{ listen 127.0.0.1:{bare_port}; location / {{ proxy_pass http://127.0.0.1:{app_port}; "
        "proxy_set_header Host $host; } } }\n"
    )
    nginx = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(app_port, gunicorn)
        wait_for(proxy_port, nginx)
        yield Ports(proxy_port, bare_port)
    finally:
        stop(nginx)
        stop(gunicorn)
        shutil.rmtree(static_root, ignore_errors=True)


def test_a_client_chosen_forwarded_for_never_escapes_the_throttle(proxied):
    mallory = Browser(proxied.snippet, "127.0.0.2")
    # A fresh address in the header for every guess: only the proxy's own entry is read, so the
    # fifth failure locks mallory's real address out, and the right password then changes nothing.
    statuses = [mallory.log_in(f"wrong-{guess}", forwarded_for=f"203.0.113.{guess + 1}") for guess in range(5)]
    assert statuses == [200, 200, 200, 200, 429]
    assert mallory.log_in(PASSWORD, forwarded_for="198.51.100.77") == 429, "locked out, whatever the header says"


def test_one_clients_failures_do_not_lock_the_name_for_everyone(proxied):
    mallory, alice = Browser(proxied.snippet, "127.0.0.2"), Browser(proxied.snippet, "127.0.0.3")
    assert [mallory.log_in(f"wrong-{guess}") for guess in range(5)][-1] == 429
    assert mallory.log_in(PASSWORD) == 429
    assert alice.log_in(PASSWORD) == 302, "the real alice, from her own address, still logs in"


def test_metrics_are_not_public_through_the_proxy(proxied):
    """Behind a declared proxy every request comes from loopback: without the token, /metrics is
    closed, through the snippet and through a proxy that sets no X-Forwarded-For at all."""
    for port in proxied:
        status, body = Browser(port, "127.0.0.1").request("GET", "/metrics")
        assert status == 403 and "callproof_" not in body, port


def test_a_foreign_host_is_a_400_that_tells_nothing_and_keeps_the_pages_headers(proxied):
    """nginx passes the client's Host on: Django refuses it (DisallowedHost). The page says the
    request could not be understood, not how the server is configured (the exception's text
    names ALLOWED_HOSTS), and carries the headers every page carries, so even this page cannot
    be framed or run a script."""
    for path in ("/", "/runs/clean-run/", "/accounts/login/"):
        connection = http.client.HTTPConnection("127.0.0.1", proxied.snippet, timeout=30)
        connection.request("GET", path, headers={"Host": "evil.example"})
        response = connection.getresponse()
        page = response.read().decode()
        connection.close()
        assert response.status == 400, path
        assert "ALLOWED_HOSTS" not in page and "evil.example" not in page, path
        assert "The request could not be understood" in page, path
        assert response.headers["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"], path
        assert "no-store" in response.headers["Cache-Control"], path
