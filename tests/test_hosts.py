"""Hosts (evidence.hosts): registered by their importer, silent when they stop reporting, and
shown so on the Hosts page, on /metrics, in the inbox and in the header's count."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import time

import pytest
from django.urls import reverse

from evidence import hosts, inbox
from evidence.models import Host
from receipts import protocol
from tests.helpers import PROJECT, content
from tests.subprocess_db import child_env, database_url_for_children, manage_command
from tests.test_operations import scrape

pytestmark = pytest.mark.django_db


def shipping(name: str, *, seen_ago: float = 0.0, stopped: bool = False) -> Host:
    now = protocol.utc_now()
    return Host.objects.create(
        name=name, runs_root=f"/srv/{name}", version="0.1.0", started_at=now - dt.timedelta(hours=1),
        last_seen_at=now - dt.timedelta(seconds=seen_ago), last_pass_seconds=0.4, watching=True,
        stopped_at=now if stopped else None,
    )  # fmt: skip


def test_a_host_is_silent_when_it_stops_reporting_or_says_it_stopped(db, settings):
    settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS = 60
    fresh, quiet, stopped = (
        shipping("fresh", seen_ago=5),
        shipping("quiet", seen_ago=61),
        shipping("gone", stopped=True),
    )
    one_off = Host.objects.create(name="cron", runs_root="", version="0.1.0", started_at=protocol.utc_now(),
                                  last_seen_at=protocol.utc_now() - dt.timedelta(days=3))  # fmt: skip
    assert set(hosts.silent().values_list("name", flat=True)) == {"quiet", "gone"}
    states = {host.name: hosts.state_of(host) for host in (fresh, quiet, stopped, one_off)}
    assert states == {"fresh": "shipping", "quiet": "silent", "gone": "stopped", "cron": "one-off"}
    assert {host.name for host in Host.objects.all() if hosts.is_silent(host)} == {"quiet", "gone"}


def test_a_silent_host_is_an_inbox_item_and_down_on_metrics(demo, logged_in, client):
    before = inbox.inbox_total()
    shipping("host-a", seen_ago=3600)
    shipping("host-b")
    [item] = [item for item in inbox.inbox_items() if item.kind == inbox.HOST]
    assert (item.subject, item.severity, item.action) == ("host-a", "error", "host")
    assert inbox.inbox_total() == before + 1 and inbox.inbox_counts()[inbox.HOST] == 1
    page = content(logged_in.get("/inbox/"))
    assert "host <code>host-a</code>" in page and reverse("hosts") in page
    values = scrape(client)
    assert values[("callproof_host_up", (("host", "host-a"),))] == 0
    assert values[("callproof_host_up", (("host", "host-b"),))] == 1
    hosts_page = content(logged_in.get("/hosts/"))
    assert "host-a" in hosts_page and 'badge-bad">silent' in hosts_page and 'badge-ok">shipping' in hosts_page


def test_a_superuser_retires_a_host_that_will_not_report_again(demo, client, django_user_model):
    gone = shipping("gone", stopped=True)
    client.force_login(django_user_model.objects.create_superuser("root", password="a-long-password-1"))
    response = client.post("/admin/receipts/host/", {"action": "retire", "_selected_action": [gone.pk]})
    assert response.status_code == 302
    gone.refresh_from_db()
    assert not gone.watching and not hosts.silent().exists()
    assert hosts.state_of(gone) == hosts.ONE_OFF


@pytest.mark.django_db(transaction=True)
def test_a_watching_importer_registers_beats_and_says_it_stopped(demo_root, tmp_path):
    url = database_url_for_children(tmp_path)
    env = child_env(url) | {"EVIDENCE_HOST_NAME": "agent-7"}
    watch = subprocess.Popen(manage_command("import_runs", str(demo_root), "--watch", "--interval", "0.2"),
                             cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        query = (
            "from evidence.models import Host; h = Host.objects.get(name='agent-7');"
            "print(h.last_pass_seconds is not None, h.watching, h.stopped_at is None, h.runs.count())"
        )
        deadline, seen = time.monotonic() + 60, ""
        while time.monotonic() < deadline and not seen.startswith("True True True"):
            seen = subprocess.run(manage_command("shell", "-v", "0", "-c", query), env=env, capture_output=True,
                                  text=True, check=False).stdout.strip()  # fmt: skip
            time.sleep(0.2)
        assert seen == f"True True True {len(list(demo_root.iterdir()))}"
    finally:
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(30) == 0
    stopped = subprocess.run(manage_command("shell", "-v", "0", "-c", "from evidence.models import Host; "
                             "print(Host.objects.get(name='agent-7').stopped_at is not None)"),
                             env=env, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert stopped == "True"
