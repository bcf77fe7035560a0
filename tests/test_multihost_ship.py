"""Beyond one machine, the way for more than one: three agent hosts ship with ``callproof ship``,
each in a mount namespace that sees only its own runs root, with its own key and no database
setting in its environment; gunicorn and ``import_mirrors`` see no agent's root at all (an empty
read-only tmpfs over them); one PostgreSQL. A person settles over HTTP; the run's own host
writes the decision, once, and the runtime reuses it. A shipper killed between the confirmation
file and its ledger event writes it exactly once when it starts again. A host that ships a
copy of another host's run is refused, and the owner's run is untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evidence.ingest import shipping
from evidence.models import Call, HumanDecision, Run
from tests.helpers import PROJECT, join, until
from tests.ledger import events_of
from tests.serving import Browser, free_port, stop, wait_for
from tests.subprocess_db import child_env, database_url_for_children, manage_command
from tests.test_multihost import PASSWORD, killed_send, resume, settle_over_http
from tests.writer import outbox_lines

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql(reason="the multi-host deployment is one PostgreSQL"),
]

HOSTS = ("host-a", "host-b", "host-c")


def hidden(paths: list[Path]) -> str:
    """A shell prefix that lays an empty read-only tmpfs over each of ``paths``."""
    return "".join(f"mount -t tmpfs -o ro none {path} && " for path in paths)


class Shipper:
    """One agent host's ``callproof ship``, in a mount namespace where the other hosts' roots
    are empty, with nothing of the database in its environment."""

    def __init__(self, world: dict, host: str, **env: str) -> None:
        self.host = host
        root, home = world["roots"][host], world["homes"][host]
        others = [world["roots"][other] for other in HOSTS if other != host]
        command = (
            f"{hidden(others)}exec {sys.executable} -m receipts ship {root} --to http://127.0.0.1:{world['port']} "
            f"--key-file {home / 'key'} --state {home / 'state.json'} --interval 0.3"
        )
        environment = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(PROJECT), **env}
        self.log = home / "shipper.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                                            cwd=home, env=environment, stdout=subprocess.DEVNULL,
                                            stderr=log)  # fmt: skip

    def said(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict]:
    url = database_url_for_children(tmp_path)
    agents = tmp_path / "agents"  # what the server's processes must not see
    roots = {host: agents / host for host in HOSTS}
    homes = {host: tmp_path / "homes" / host for host in HOSTS}  # each host's key and state
    args = {host: killed_send(roots[host], f"{host}-msg", f"from {host}") for host in HOSTS}
    for host in HOSTS:
        homes[host].mkdir(parents=True)
        (homes[host] / "key").write_text(shipping.new_key(host) + "\n")
    from django.contrib.auth import get_user_model

    join(get_user_model().objects.create_user("carol", password=PASSWORD), "confirmer")
    mirror, static_root = tmp_path / "mirror", tmp_path / "static"
    env = child_env(url) | {
        "DJANGO_DEBUG": "0", "DJANGO_HTTPS": "0", "DJANGO_SECRET_KEY": "multi-host-" + "k" * 50,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "DJANGO_STATIC_ROOT": str(static_root), "EVIDENCE_HOST_NAME": "web",
        "EVIDENCE_MIRROR_ROOT": str(mirror),
    }  # fmt: skip
    env.pop("EVIDENCE_METRICS_TOKEN", None)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=PROJECT, env=env,
                   check=True)  # fmt: skip
    port = free_port()
    probe = tmp_path / "server-sees.txt"
    web = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"{hidden([agents])}ls -A {agents} > {probe} && "
         f"exec {sys.executable} -m gunicorn evidence.wsgi -b 127.0.0.1:{port} -w 2"],
        cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    importer = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"{hidden([agents])}exec {' '.join(manage_command('import_mirrors', '--watch', '--interval', '0.3'))}"],
        cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    world = {"url": url, "roots": roots, "homes": homes, "args": args, "port": port, "mirror": mirror}
    shippers: dict[str, Shipper] = {}
    try:
        wait_for(port, web)
        assert probe.read_text() == "", "the server's processes see nothing of the agents' roots"
        shippers.update({host: Shipper(world, host) for host in HOSTS})
        until(lambda: Run.objects.filter(run_id__in=[f"{h}-msg" for h in HOSTS]).count() == 3, "the three runs", 90)
        assert set(Run.objects.values_list("run_id", "host__name")) == {(f"{h}-msg", h) for h in HOSTS}
        browser = Browser(port, "127.0.0.1")
        assert browser.log_in(PASSWORD, username="carol") == 302
        yield world | {"browser": browser, "shippers": shippers}
    finally:
        for process in [web, importer, *(shipper.process for shipper in shippers.values())]:
            if process.poll() is None:
                stop(process)
        shutil.rmtree(static_root, ignore_errors=True)


def test_three_shippers_each_write_their_own_runs_decision_once(world):
    browser = world["browser"]
    decided = {host: settle_over_http(browser, f"{host}-msg") for host in HOSTS}
    for host, call_id in decided.items():
        run_dir = world["roots"][host] / f"{host}-msg"
        delivered = HumanDecision.objects.filter(call_id=call_id, delivered_at__isnull=False)
        decision = until(delivered.first, f"{host} to deliver", 60)
        assert isinstance(decision, HumanDecision) and decision.delivered_by == host
        assert [event["call_id"] for event in events_of(run_dir, "confirmation")] == [call_id]
        assert resume(run_dir, world["args"][host])["reused"] is True
        assert len(outbox_lines(run_dir)) == 1, "the message was sent once"
        for other in HOSTS:
            assert other == host or not (world["roots"][other] / f"{host}-msg").exists()
    # The confirmations travel up, and the mirror's import settles the calls.
    doubts = Call.objects.in_doubt().filter(run__run_id__in=[f"{h}-msg" for h in HOSTS])
    until(lambda: not doubts.exists(), "the confirmations imported from the mirrors", 60)


def test_a_shipper_killed_mid_delivery_delivers_exactly_once_when_it_starts_again(world):
    browser, host = world["browser"], "host-b"
    run_dir = world["roots"][host] / f"{host}-msg"
    stop(world["shippers"][host].process)
    dying = Shipper(world, host, RECEIPTS_FAILPOINT="after_confirmation_file")
    world["shippers"][host] = dying
    call_id = settle_over_http(browser, f"{host}-msg")
    assert until(lambda: dying.process.poll() is not None, "the shipper to die at the failpoint", 60)
    assert dying.process.returncode == 137
    assert (run_dir / "confirmations" / f"{call_id}.json").exists() and events_of(run_dir, "confirmation") == []
    assert HumanDecision.objects.get(call_id=call_id).pending, "never acknowledged"
    world["shippers"][host] = Shipper(world, host)
    until(lambda: HumanDecision.objects.filter(call_id=call_id, delivered_at__isnull=False).exists(), "delivery", 60)
    [event] = events_of(run_dir, "confirmation")
    assert event["call_id"] == call_id and event["recovered"] is True
    assert resume(run_dir, world["args"][host])["reused"] is True
    assert len(outbox_lines(run_dir)) == 1


def test_a_host_that_ships_a_copy_of_another_hosts_run_is_refused(world):
    stop(world["shippers"]["host-c"].process)
    shutil.copytree(world["roots"]["host-a"] / "host-a-msg", world["roots"]["host-c"] / "host-a-msg", symlinks=True)
    before = Run.objects.values_list("host__name", "path", "fingerprint").get(run_id="host-a-msg")
    copier = Shipper(world, "host-c")
    world["shippers"]["host-c"] = copier
    until(lambda: "run_id host-a-msg is already host host-a's run" in copier.said(), "host-c's refused push")
    assert Run.objects.values_list("host__name", "path", "fingerprint").get(run_id="host-a-msg") == before
    assert not (world["mirror"] / "host-c" / "host-a-msg").exists()
    assert copier.process.poll() is None, "the refusal is one run's: host-c ships on"
