"""Beyond one machine, with the real parts: two agent hosts, each an importer (``import_runs
--watch``) owning its own runs root, ship to one PostgreSQL; the dashboard is gunicorn in a
mount namespace where both roots are an empty read-only tmpfs, so it can neither read nor
write a run directory. A person settles over HTTP; the owning host's importer writes the
decision into the run, and the runtime then reuses it. An importer killed mid-delivery
delivers exactly once when it starts again; an importer that stops shows on the Hosts page,
on /metrics and in the inbox.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evidence.models import Call, Host, HumanDecision, Run
from receipts import runtime
from receipts.demo import run_writer
from tests.helpers import CONTRACT, PROJECT, join, until
from tests.ledger import events_of
from tests.serving import Browser, free_port, stop, wait_for
from tests.subprocess_db import child_env, database_url_for_children, manage_command
from tests.writer import outbox_lines

PASSWORD = "a-long-password-for-carol-1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql(reason="the multi-host deployment is one PostgreSQL"),
]


def killed_send(root: Path, run_id: str, body: str) -> dict:
    """A run whose send_message was killed after its effect: a call in doubt, not queryable."""
    run_dir = root / run_id
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    args = {"to": "ops@example.com", "body": body}
    assert run_writer("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(args),
                      RECEIPTS_FAILPOINT="after_effect").returncode == 137  # fmt: skip
    return args


class Shipper:
    """One agent host's importer, as its systemd unit runs it."""

    def __init__(self, url: str, host: str, root: Path, **env: str) -> None:
        self.host = host
        environment = child_env(url) | {"EVIDENCE_HOST_NAME": host} | env
        self.process = subprocess.Popen(
            manage_command("import_runs", str(root), "--watch", "--interval", "0.3"),
            cwd=PROJECT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self) -> None:
        stop(self.process)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict]:
    url = database_url_for_children(tmp_path)
    agents = tmp_path / "agents"  # what the web process must not see
    roots = {"host-a": agents / "a", "host-b": agents / "b"}
    args = {
        "host-a": killed_send(roots["host-a"], "a-msg", "from a"),
        "host-b": killed_send(roots["host-b"], "b-msg", "from b"),
    }
    from django.contrib.auth import get_user_model

    join(get_user_model().objects.create_user("carol", password=PASSWORD), "confirmer")
    shippers = {host: Shipper(url, host, root) for host, root in roots.items()}
    until(lambda: Run.objects.filter(run_id__in=["a-msg", "b-msg"], host__isnull=False).count() == 2, "both imports")
    assert set(Run.objects.values_list("run_id", "host__name")) == {("a-msg", "host-a"), ("b-msg", "host-b")}

    static_root, probe = tmp_path / "static", tmp_path / "web-sees.txt"
    env = child_env(url) | {
        "DJANGO_DEBUG": "0", "DJANGO_HTTPS": "0", "DJANGO_SECRET_KEY": "multi-host-" + "k" * 50,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "DJANGO_STATIC_ROOT": str(static_root), "EVIDENCE_HOST_NAME": "web",
    }  # fmt: skip
    env.pop("EVIDENCE_METRICS_TOKEN", None)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=PROJECT, env=env,
                   check=True)  # fmt: skip
    port = free_port()
    # The web's own view of the machine: the agents' roots are an empty read-only tmpfs.
    script = (
        f"mount -t tmpfs -o ro none {agents} && ls -A {agents} > {probe} && "
        f"exec {sys.executable} -m gunicorn evidence.wsgi -b 127.0.0.1:{port} -w 2"
    )
    web = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=PROJECT,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(port, web)
        assert probe.read_text() == "", "the web process sees nothing of the agents' roots"
        browser = Browser(port, "127.0.0.1")
        assert browser.log_in(PASSWORD, username="carol") == 302
        yield {"url": url, "roots": roots, "args": args, "shippers": shippers, "browser": browser}
    finally:
        stop(web)
        for shipper in shippers.values():
            if shipper.process.poll() is None:
                shipper.stop()
        shutil.rmtree(static_root, ignore_errors=True)


def settle_over_http(browser: Browser, run_id: str) -> str:
    call = Call.objects.get(run__run_id=run_id)
    path = f"/runs/{run_id}/calls/{call.call_id}/"
    status, page = browser.request("GET", path)
    assert status == 200 and "files are on host" in page, "the web never reads the run's target itself"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    digest = re.search(r'name="receipt_sha256" value="([0-9a-f]{64})"', page)
    assert token and digest, page[-3000:]
    form = {"csrfmiddlewaretoken": token.group(1), "receipt_sha256": digest.group(1), "resolution": "committed",
            "reason": "the mail server's log shows it", "confirm_call_id": call.call_id[:12]}  # fmt: skip
    status, _ = browser.request("POST", path + "confirm/", form)
    assert status == 303
    return call.call_id


def resume(run_dir: Path, args: dict) -> dict:
    completed = run_writer("call", str(run_dir), "--tool", "send_message", "--args", json.dumps(args), "--attempt", "1")
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_a_decision_made_on_the_web_is_written_by_the_runs_own_host(world):
    browser, run_dir = world["browser"], world["roots"]["host-a"] / "a-msg"
    call_id = settle_over_http(browser, "a-msg")
    _, page = browser.request("GET", f"/runs/a-msg/calls/{call_id}/")
    assert "waiting for host <code>host-a</code>" in page or "Delivered to host <code>host-a</code>" in page
    decision = until(lambda: HumanDecision.objects.filter(call_id=call_id, delivered_at__isnull=False).first(),
                     "host-a to deliver", 30)  # fmt: skip
    assert isinstance(decision, HumanDecision) and decision.delivered_by == "host-a"
    assert (run_dir / "confirmations" / f"{call_id}.json").exists()
    assert [event["call_id"] for event in events_of(run_dir, "confirmation")] == [call_id]
    assert not (world["roots"]["host-b"] / "a-msg").exists(), "host-b never touched it"
    _, page = browser.request("GET", f"/runs/a-msg/calls/{call_id}/")
    assert "Delivered to host <code>host-a</code>" in page
    assert resume(run_dir, world["args"]["host-a"])["reused"] is True
    assert len(outbox_lines(run_dir)) == 1, "the message was sent once"


def test_an_importer_killed_mid_delivery_delivers_exactly_once_when_it_starts_again(world):
    browser, run_dir = world["browser"], world["roots"]["host-b"] / "b-msg"
    world["shippers"]["host-b"].stop()
    dying = Shipper(world["url"], "host-b", world["roots"]["host-b"], RECEIPTS_FAILPOINT="after_confirmation_file")
    world["shippers"]["host-b"] = dying
    until(lambda: Host.objects.filter(name="host-b", stopped_at__isnull=True).exists(), "host-b registered again")
    call_id = settle_over_http(browser, "b-msg")
    assert until(lambda: dying.process.poll() is not None, "the importer to die at the failpoint", 30)
    assert dying.process.returncode == 137
    dying.stop()
    assert (run_dir / "confirmations" / f"{call_id}.json").exists() and events_of(run_dir, "confirmation") == []
    assert HumanDecision.objects.get(call_id=call_id).pending
    world["shippers"]["host-b"] = Shipper(world["url"], "host-b", world["roots"]["host-b"])
    until(lambda: HumanDecision.objects.filter(call_id=call_id, delivered_at__isnull=False).exists(), "delivery", 30)
    [event] = events_of(run_dir, "confirmation")
    assert event["call_id"] == call_id and event["recovered"] is True
    assert resume(run_dir, world["args"]["host-b"])["reused"] is True
    assert len(outbox_lines(run_dir)) == 1


def test_an_importer_that_stops_shows_on_the_hosts_page_on_metrics_and_in_the_inbox(world):
    browser = world["browser"]
    _, metrics = browser.request("GET", "/metrics")
    assert 'callproof_host_up{host="host-a"} 1.0' in metrics
    world["shippers"]["host-a"].stop()
    _, hosts = browser.request("GET", "/hosts/")
    row = hosts[hosts.index("<code>host-a</code>") :][:400]
    assert "stopped" in row
    _, metrics = browser.request("GET", "/metrics")
    assert 'callproof_host_up{host="host-a"} 0.0' in metrics and 'callproof_host_up{host="host-b"} 1.0' in metrics
    _, inbox = browser.request("GET", "/inbox/")
    assert "silent host" in inbox and "host <code>host-a</code>" in inbox
