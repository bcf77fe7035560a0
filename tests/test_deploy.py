"""The deployment docs/operations.md describes: its files name real commands, and on PostgreSQL
importers and web workers run at once without losing or duplicating a row."""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import sys
import threading
from http import HTTPStatus
from pathlib import Path

import psycopg
import pytest
from django.core.management import get_commands, load_command_class
from django.db import connection
from django.test import Client

from evidence.maintenance import MAINTENANCE
from receipts.cli import build_parser
from tests.helpers import CONTRACT, PROJECT, join
from tests.subprocess_db import (
    NEVER_STALE,
    child_env,
    database_url_for_children,
    manage,
    manage_command,
    normalized_dump,
)
from tests.volume import synthetic_ledger, synthetic_run


def deploy_commands() -> list[list[str]]:
    """Every command line of the Procfile and of the systemd units' ExecStart."""
    lines = [line.split(":", 1)[1] for line in (PROJECT / "Procfile").read_text().splitlines() if ":" in line]
    for unit in sorted((PROJECT / "deploy").glob("*.service")):
        lines += [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith("ExecStart")]
    commands = []
    for line in lines:
        for part in line.split("&&"):
            commands.append(shlex.split(part.replace("${WEB_CONCURRENCY:-4}", "4").replace("${PORT:-8000}", "8000")))
    return commands


def test_the_procfile_and_the_units_name_commands_that_exist():
    commands = deploy_commands()
    assert len(commands) >= 8
    management = get_commands()
    for command in commands:
        program = command[0].rsplit("/", 1)[-1]
        if program.startswith("python"):
            assert command[1].endswith("manage.py") and command[2] in management, command
            # The arguments parse as the command itself parses them (a typo'd option fails here).
            parser = load_command_class(management[command[2]], command[2]).create_parser("manage.py", command[2])
            options = parser.parse_args(command[3:])
            if command[2] == "enqueue_maintenance":
                assert set(options.names) <= set(MAINTENANCE), command
        elif program == "callproof":
            # The writer's own command line (an agent host's daemon), parsed as it parses itself.
            options = build_parser().parse_args(command[1:])
            assert options.command == "serve" and options.agents_group and options.settler, command
        else:
            assert program == "gunicorn" and "evidence.wsgi" in command, command
    assert any("--watch" in command for command in commands), "the importer runs as its own process"
    workers = [command for command in commands if "db_worker" in command]
    assert len(workers) == 2 and all("--no-reload" in command for command in workers), "Procfile and unit"
    assert any(command[1:2] == ["serve"] for command in commands), "the writer daemon has its unit"


def gunicorn_addresses(command: list[str]) -> list:
    """The addresses gunicorn would listen on, as gunicorn's own parser reads its command line."""
    from gunicorn.config import Config

    config = Config()
    arguments = config.parser().parse_args(command[1:])
    for name, value in vars(arguments).items():
        if value is not None and name in config.settings:
            config.set(name, value)
    return config.address


def test_gunicorn_listens_only_where_the_proxy_alone_reaches_it():
    """Behind the proxy, a client that reached gunicorn directly would go around its TLS and its
    X-Forwarded-For rule (a forged address for the login throttle): gunicorn listens on the
    loopback address or a Unix socket, in the Procfile and in the systemd unit alike."""
    servers = [command for command in deploy_commands() if command[0].endswith("gunicorn")]
    assert len(servers) == 2, "the Procfile's web line and the web unit"
    for command in servers:
        addresses = gunicorn_addresses(command)
        assert addresses, command
        for address in addresses:
            # A tuple is a TCP host and port; a string is a Unix socket's path.
            assert isinstance(address, str) or ipaddress.ip_address(address[0]).is_loopback, (command, address)


def timers() -> dict[str, str]:
    """Each timer of deploy/ and the service it starts (its own name, unless it says Unit=)."""
    started = {}
    for timer in sorted((PROJECT / "deploy").glob("*.timer")):
        named = [line.split("=", 1)[1] for line in timer.read_text().splitlines() if line.startswith("Unit=")]
        started[timer.name] = named[0] if named else timer.with_suffix(".service").name
    return started


def test_every_maintenance_task_is_queued_by_a_timer():
    queued: set[str] = set()
    for timer, service in timers().items():
        unit = (PROJECT / "deploy" / service).read_text()
        assert "Type=oneshot" in unit and "enqueue_maintenance" in unit, (timer, service)
        [line] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
        queued |= set(shlex.split(line)[3:])
    assert queued == set(MAINTENANCE), "each task on a schedule, none twice"


def test_systemd_accepts_every_unit(tmp_path):
    """``systemd-analyze verify``, on copies whose /opt/callproof is this checkout's venv."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine (Debian's systemd package has it)")
    (tmp_path / "opt" / ".venv" / "bin").mkdir(parents=True)
    for program in ("python", "gunicorn", "callproof"):
        (tmp_path / "opt" / ".venv" / "bin" / program).symlink_to(Path(sys.prefix) / "bin" / program)
    units = sorted([*(PROJECT / "deploy").glob("*.service"), *(PROJECT / "deploy").glob("*.timer")])
    for unit in units:
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/callproof", str(tmp_path / "opt")))
    names = [unit.name for unit in units]
    verified = subprocess.run(
        ["systemd-analyze", "verify", *names], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
    assert {"callproof-worker.service", "callproof-retention.timer", "callproof-cleanup.timer"} <= set(names)


@pytest.mark.slow
@pytest.mark.postgresql(reason="the scale-out database is PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_two_importers_and_web_requests_at_once_lose_and_duplicate_nothing(demo_root, tmp_path, django_user_model):
    synthetic_ledger(demo_root / "clean-run", 40_000, start_seq=11)
    second_root = tmp_path / "second-root"
    for index in range(12):
        synthetic_run(second_root / f"other-{index:02d}", events=300, receipts=20, contract=CONTRACT)
    url = database_url_for_children(tmp_path)
    user = join(django_user_model.objects.create_user("web", password="a-long-password-1"), "viewer")

    failures: list[str] = []
    pages_served = 0
    stop = threading.Event()

    def browse() -> None:
        nonlocal pages_served
        client = Client()
        client.force_login(user)
        paths = ["/", "/inbox/", "/findings/", "/retention/", "/runs/clean-run/", "/runs/other-03/"]
        while not stop.is_set():
            for path in paths:
                status = client.get(path).status_code
                if status not in (HTTPStatus.OK, HTTPStatus.NOT_FOUND):  # a run not imported yet is a 404
                    failures.append(f"{path}: {status}")
                pages_served += 1
        connection.close()

    browsers = [threading.Thread(target=browse) for _ in range(2)]
    for thread in browsers:
        thread.start()
    # Each importer owns one root first, then takes the other's as well: both meet on every run.
    roots = (demo_root, second_root)
    commands = {root: shlex.join(manage_command("import_runs", str(root), *NEVER_STALE)) for root in roots}
    importers = [
        subprocess.Popen(
            ["sh", "-c", " && ".join(commands[root] for root in order)],
            env=child_env(url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for order in (roots, roots[::-1])
    ]
    errors = [importer.communicate(timeout=600)[1] for importer in importers]
    stop.set()
    for thread in browsers:
        thread.join(timeout=60)
    assert [importer.returncode for importer in importers] == [0, 0], errors
    assert failures == [] and pages_served > 12

    clean = f"test_clean_{os.getpid()}"  # two runs at once (a developer's, CI's) never share it
    admin = psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True)
    admin.execute(f"DROP DATABASE IF EXISTS {clean}")
    admin.execute(f"CREATE DATABASE {clean}")
    try:
        clean_url = url.rsplit("/", 1)[0] + f"/{clean}"
        manage(clean_url, "migrate", "-v", "0", check=True)
        manage(clean_url, "import_runs", str(demo_root), *NEVER_STALE, check=True)
        manage(clean_url, "import_runs", str(second_root), *NEVER_STALE, check=True)
        together, alone = normalized_dump(url), normalized_dump(clean_url)
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {clean} WITH (FORCE)")
        admin.close()
    assert all(count == distinct for _, count, distinct, _ in (line.split() for line in together)), "no duplicates"
    assert together == alone, "nothing lost: the same rows as one importer alone"
