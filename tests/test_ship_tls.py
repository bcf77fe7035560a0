"""``callproof ship`` over HTTPS as a deployment serves it: Debian's nginx terminates TLS with
deploy/nginx.conf in front of gunicorn (DJANGO_HTTPS=1: HTTPS only, HSTS), and the shipper trusts
the site's certificate through ``--ca-file``. Without it, the shipper refuses the connection."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from receipts import runtime
from tests.helpers import CONTRACT, PROJECT
from tests.serving import Browser, free_port, stop, wait_for
from tests.subprocess_db import child_env, database_url_for_children, manage, manage_command

NGINX = "/usr/sbin/nginx"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.nginx,
    pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is installed by `make test` (make test-packages)"),
]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict]:
    url = database_url_for_children(tmp_path)
    cert, key = tmp_path / "site.pem", tmp_path / "site.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    mirror, static_root = tmp_path / "mirror", tmp_path / "static"
    env = {
        **os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "0", "DJANGO_HTTPS": "1",
        "DJANGO_SECRET_KEY": "tls-test-" + "k" * 50, "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "EVIDENCE_PROXY_COUNT": "1", "DJANGO_STATIC_ROOT": str(static_root), "EVIDENCE_MIRROR_ROOT": str(mirror),
    }  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=PROJECT, env=env,
                   check=True)  # fmt: skip
    app_port, tls_port = free_port(), free_port()
    gunicorn = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "evidence.wsgi", "-b", f"127.0.0.1:{app_port}", "-w", "2"],
        cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    (prefix / "site.conf").write_text(
        (PROJECT / "deploy" / "nginx.conf").read_text().replace("127.0.0.1:8000", f"127.0.0.1:{app_port}")
    )
    (prefix / "nginx.conf").write_text(
        f"pid {prefix}/nginx.pid; error_log {prefix}/error.log; worker_processes 1;\n"
        "events {}\n"
        f"http {{ access_log off; client_body_temp_path {prefix}; proxy_temp_path {prefix};\n"
        f"  server {{ listen 127.0.0.1:{tls_port} ssl; ssl_certificate {cert}; ssl_certificate_key {key};\n"
        f"           include {prefix}/site.conf; }} }}\n"
    )
    nginx = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(app_port, gunicorn)
        wait_for(tls_port, nginx)
        host_key = manage(url, "host", "add", "agent-tls", check=True).stdout.strip()
        yield {"url": url, "https": f"https://127.0.0.1:{tls_port}", "cert": cert, "key": host_key, "mirror": mirror}
    finally:
        stop(nginx)
        stop(gunicorn)
        shutil.rmtree(static_root, ignore_errors=True)


def ship(site: dict, root: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "key").write_text(site["key"] + "\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(PROJECT)}
    command = [sys.executable, "-m", "receipts", "ship", str(root), "--to", site["https"], "--key-file",
               str(tmp_path / "key"), "--state", str(tmp_path / "state.json"), "--once", *extra]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_host_ships_over_https_through_nginx_and_trusts_only_the_certificate_it_is_given(site, tmp_path):
    root = tmp_path / "runs"
    for run_id in ("tls-run-1", "tls-run-2"):  # ids of its own: the database may hold other tests' demo runs
        runtime.run_init(root / run_id, contract_sha256=CONTRACT)
        runtime.Executor(root / run_id).call("write_file", {"path": "out.txt", "content": run_id})
    untrusted = ship(site, root, tmp_path)
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr
    assert not site["mirror"].exists(), "nothing was sent to a site the shipper does not trust"
    shipped = ship(site, root, tmp_path, "--ca-file", str(site["cert"]))
    assert shipped.returncode == 0 and "refused" not in shipped.stderr, shipped.stderr
    env = child_env(site["url"]) | {"EVIDENCE_MIRROR_ROOT": str(site["mirror"])}
    subprocess.run(manage_command("import_mirrors"), env=env, cwd=PROJECT, check=True, capture_output=True)
    query = (
        "import json; from evidence.models import Run; "
        "print(json.dumps(sorted(Run.objects.filter(host__name='agent-tls').values_list('run_id', flat=True))))"
    )
    imported = json.loads(manage(site["url"], "shell", "-v", "0", "-c", query, check=True).stdout)
    assert imported == ["tls-run-1", "tls-run-2"], shipped.stderr


def test_the_shipper_refuses_plain_http_to_another_machine(tmp_path):
    (tmp_path / "key").write_text("cph_" + "k" * 43 + "\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(PROJECT)}
    refused = subprocess.run([sys.executable, "-m", "receipts", "ship", str(tmp_path), "--to", "http://192.0.2.10",
                              "--key-file", str(tmp_path / "key"), "--once"], env=env, capture_output=True, text=True,
                             check=False)  # fmt: skip
    assert refused.returncode == 1 and "reached over https (plain http only on loopback)" in refused.stderr


def test_a_person_logs_in_through_nginx_on_a_port_of_its_own(site, tmp_path):
    """deploy/nginx.conf passes the Host on as the client sent it, port included: a login whose
    Origin and Referer carry the port (as every browser's does) is the site's own, not refused
    as a cross-site request (with ``Host $host`` nginx dropped the port: 403)."""
    manage(site["url"], "shell", "-c", "from django.contrib.auth import get_user_model; "
           "from evidence.lib.roles import ensure_roles; u = get_user_model().objects.create_user('alice', "
           "password='the-right-password-1'); u.groups.add(ensure_roles()['viewer'])", check=True)  # fmt: skip
    tls = ssl.create_default_context(cafile=str(site["cert"]))
    browser = Browser(urllib.parse.urlsplit(site["https"]).port or 443, "127.0.0.1", tls)
    assert browser.log_in("the-right-password-1") == 302
    status, page = browser.request("GET", "/")
    assert status == 200 and "alice" in page
