"""The shipper and the server agree on what the mirror holds, whatever is killed or lost between
them (evidence/ingest/mirror.py, receipts/ship.py; docs/operations.md, "How the shipper and the
server agree"): a shipper killed at each step of a pass, at random moments, or whose answers a
proxy loses, ships every run to the host's bytes; a new run under an archived run's id ships as
the new run; a decision is written while a big run is still being pushed; one run that cannot be
read is said and the others ship; a run is never imported half arrived.

Real shipper processes (``python -m receipts ship``, no database in their environment) against
pytest-django's live server, a real HTTP server on loopback; kills are ``os._exit`` at named
failpoints and SIGKILL at random moments.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from evidence.ingest import shipping
from evidence.models import AuditEntry, Finding, HumanDecision, Run, ShippedRun
from evidence.retention import actions
from evidence.review import settle
from receipts import durable, protocol, runtime
from tests.helpers import first_call_of, join, until
from tests.shipping import (
    LossyProxy,
    converged,
    named_before_their_receipts,
    run_files,
    ship,
    ship_command,
    ship_env,
)
from tests.volume import synthetic_run

pytestmark = pytest.mark.django_db(transaction=True)

CONTRACT = "c" * 64


def big_run(root: Path, name: str = "aaa-big", *, events: int = 12_000, receipts: int = 600) -> Path:
    """A run of several pushes (its ledger some 2.4 MB, its receipts some 0.4 MB), listed before
    the demo's runs: a pass pushes it first."""
    run_dir = root / name
    synthetic_run(run_dir, events=events, receipts=receipts, contract=CONTRACT)
    return run_dir


def settled(run_id: str, django_user_model, resolution: str = "committed") -> HumanDecision:
    """A person's decision about the run's first call in doubt, recorded on the dashboard."""
    confirmer = django_user_model.objects.filter(username="dana").first() or join(
        django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer"
    )
    call = first_call_of(run_id)
    settle.settle_call(run=call.run, call=call, user=confirmer, resolution=resolution, reason="the mail log has it",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    return HumanDecision.objects.get(run=call.run, call_id=call.call_id)


def confirmations_in(run_dir: Path) -> list[str]:
    lines = (run_dir / protocol.LEDGER_NAME).read_bytes().splitlines()
    return [event["call_id"] for event in map(json.loads, lines) if event.get("type") == "confirmation"]


@pytest.mark.parametrize(
    "failpoint",
    [
        "ship_before_sizes_saved",  # the dashboard told the ledgers' sizes; the state not saved
        "ship_before_push_saved@1",  # the first push taken; the shipper does not know it
        "ship_before_push_saved@3",  # the third: files and ledger chunks taken before it
        "ship_after_push_acknowledged@2",  # the second push taken and saved
        "ship_before_acks_sent",  # a decision written into its run; not acknowledged
    ],
)
def test_a_shipper_killed_at_each_step_of_a_pass_ships_every_run_to_the_hosts_bytes(
    failpoint, demo_root, tmp_path, live_server, mirror, django_user_model
):
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    decision = settled("send-message-killed", django_user_model)
    big = big_run(demo_root)
    killed = ship(demo_root, live_server.url, key, tmp_path, RECEIPTS_FAILPOINT=failpoint)
    assert killed.returncode == 137, killed.stderr

    again = ship(demo_root, live_server.url, key, tmp_path)
    assert again.returncode == 0, again.stderr
    assert converged(demo_root, mirror / "agent-a") == {}
    # It goes on shipping what the runs write next: the run a kill once left behind is not stuck.
    durable.append_event(big, "note", {"text": "written after the kill"})
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a") == {}

    decision.refresh_from_db()
    assert decision.delivered_at is not None and decision.delivered_by == "agent-a"
    assert confirmations_in(demo_root / "send-message-killed") == [decision.call_id], "written once"
    call_command("import_mirrors")
    assert Run.objects.get(run_id="aaa-big").event_count == 12_001
    assert not Finding.objects.filter(run__run_id="aaa-big", closed_at__isnull=True).exists()


def test_answers_a_proxy_loses_are_healed_and_every_run_converges(demo_root, tmp_path, live_server, mirror):
    """Every other push's answer and every third fetch of instructions is lost on its way back:
    the server applied each push; the shipper sends it again, which the server takes as held."""
    key = shipping.new_key("agent-a")
    big_run(demo_root, events=6_000, receipts=300)
    proxy = LossyProxy(live_server.url, lambda method, path, before: (path.endswith("/push") and before % 3 == 1)
                       or (path.endswith("/instructions") and before % 3 == 2))  # fmt: skip
    passes: list[subprocess.CompletedProcess[str]] = []
    try:
        while len(passes) < 60 and (not passes or passes[-1].returncode != 0):  # a pass that ends well: done
            passes.append(ship(demo_root, proxy.url, key, tmp_path))
    finally:
        proxy.close()
    lost = [path for _, path, was_lost in proxy.seen if was_lost]
    assert sum(path.endswith("/push") for path in lost) >= 3, proxy.seen
    assert any(p.returncode == 1 and "pass failed" in p.stderr for p in passes), "a lost answer fails its pass"
    assert converged(demo_root, mirror / "agent-a") == {}
    assert "409" not in "".join(p.stderr for p in passes), "a push sent again is taken, not refused"
    shipped = ShippedRun.objects.get(host__name="agent-a", run_id="aaa-big")
    assert (
        shipped.mirror_ledger_bytes
        == shipped.host_ledger_bytes
        == (demo_root / "aaa-big" / "events.jsonl").stat().st_size
    )
    assert shipped.behind_since is None and shipped.problem == ""


@pytest.mark.slow  # real processes in numbers: eight shippers killed
def test_a_shipper_killed_at_random_moments_converges(demo_root, tmp_path, live_server, mirror):
    key = shipping.new_key("agent-a")
    big = big_run(demo_root, events=30_000, receipts=1_500)
    chance = random.Random(int.from_bytes(hashlib.sha256(str(tmp_path).encode()).digest()[:4]))
    command = ship_command(demo_root, live_server.url, key, tmp_path, "--interval", "0.05")
    for round_ in range(8):
        durable.append_event(big, "note", {"text": f"round {round_}"})  # the run goes on meanwhile
        shipper = subprocess.Popen(command, env=ship_env(tmp_path), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, cwd=tmp_path)  # fmt: skip
        time.sleep(chance.uniform(0.05, 1.5))  # not a deadline: any moment is as good as any other
        shipper.send_signal(signal.SIGKILL)
        shipper.wait()
    final = ship(demo_root, live_server.url, key, tmp_path)
    assert final.returncode == 0, final.stderr
    assert converged(demo_root, mirror / "agent-a") == {}


def test_a_new_run_under_an_archived_runs_id_ships_as_the_new_run(
    demo_root, tmp_path, live_server, mirror, monkeypatch, settings
):
    key = shipping.new_key("agent-a")
    assert "clean-run" in archived_on_the_dashboard(demo_root, tmp_path, live_server, key, monkeypatch, settings)
    assert not (mirror / "agent-a" / "clean-run").exists()
    # Before the shipper hears of the archive, the host's operator starts another run under the id.
    shutil.rmtree(demo_root / "clean-run")
    runtime.run_init(demo_root / "clean-run", contract_sha256="d" * 64)
    durable.append_event(demo_root / "clean-run", "note", {"text": "the new run"})

    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    assert converged(demo_root, mirror / "agent-a") == {}, "the new run's bytes, not the old offset's"
    archived = Run.objects.get(run_id="clean-run")
    assert "holds another run than the one archived" in archived.host_copy_kept
    call_command("import_mirrors")
    reused = Finding.objects.get(code="archived_run_id_reused", subject="clean-run", closed_at__isnull=True)
    assert reused.run is None and Run.objects.get(run_id="clean-run").archived, "the archive stays the old run's"


def test_a_decision_is_written_while_a_big_run_is_still_being_pushed(
    demo_root, tmp_path, live_server, mirror, django_user_model
):
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    decision = settled("send-message-killed", django_user_model)
    big = big_run(demo_root)
    # Killed after the big run's second push, long before its last, and before any other run's.
    killed = ship(demo_root, live_server.url, key, tmp_path, "--decisions-every", "0",
                  RECEIPTS_FAILPOINT="ship_after_push_acknowledged@2")  # fmt: skip
    assert killed.returncode == 137, killed.stderr
    assert confirmations_in(demo_root / "send-message-killed") == [decision.call_id]
    decision.refresh_from_db()
    assert decision.delivered_at is not None, "written and acknowledged between two pushes"
    assert any(name.startswith("aaa-big/") for name in converged(demo_root, mirror / "agent-a")), "not arrived yet"
    assert (mirror / "agent-a" / big.name / "steer.json").exists(), "it was on its way"


def test_one_run_that_cannot_be_read_is_said_and_the_others_ship(
    demo_root, tmp_path, live_server, mirror, django_user_model
):
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    settled("send-message-killed", django_user_model)
    broken = demo_root / "clean-run"
    (broken / "state.json").unlink()
    (broken / "state.json").symlink_to("/etc/passwd")
    durable.append_event(broken, "note", {"text": "after the symlink"})
    durable.append_event(demo_root / "legacy-task", "note", {"text": "another run writes"})

    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    assert "clean-run: state.json" in shipped.stderr and "not sent" in shipped.stderr
    assert "decisions: 1 delivered" in shipped.stderr
    differences = converged(demo_root, mirror / "agent-a")
    assert set(differences) == {"clean-run/state.json"}, "the rest of that run, and every other, arrived"
    problem = ShippedRun.objects.get(host__name="agent-a", run_id="clean-run").problem
    assert "state.json" in problem and "symlink" in problem
    durable.append_event(broken, "note", {"text": "the run goes on; its state.json still cannot go"})
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert "state.json" in ShippedRun.objects.get(host__name="agent-a", run_id="clean-run").problem, "still said"
    # Mended on the host: the next pass sends it, and says the run ships again.
    (broken / "state.json").unlink()
    (broken / "state.json").write_text(json.dumps({"name": "finished", "attempts": 1}))
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a") == {}
    assert ShippedRun.objects.get(host__name="agent-a", run_id="clean-run").problem == ""


def test_a_run_is_not_imported_half_arrived_and_its_receipts_go_before_the_lines_naming_them(
    demo_root, tmp_path, live_server, mirror, settings, monkeypatch
):
    key = shipping.new_key("agent-a")
    big_run(demo_root, events=12_000, receipts=2_000)
    for pushes in (1, 2, 4):
        killed = ship(demo_root, live_server.url, key, tmp_path,
                      RECEIPTS_FAILPOINT=f"ship_after_push_acknowledged@{pushes}")  # fmt: skip
        assert killed.returncode == 137, killed.stderr
        assert named_before_their_receipts(mirror / "agent-a" / "aaa-big") == []
        call_command("import_mirrors")
        assert not Run.objects.filter(run_id="aaa-big").exists(), "still arriving: not read half arrived"
    # A shipper that died between two pushes does not hold its run back for ever.
    later = protocol.utc_now() + dt.timedelta(seconds=settings.EVIDENCE_HOST_SILENT_AFTER_SECONDS + 1)
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(later))
    call_command("import_mirrors")
    assert Run.objects.filter(run_id="aaa-big").exists()
    monkeypatch.delenv("RECEIPTS_CLOCK")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    run = Run.objects.get(run_id="aaa-big")
    assert run.event_count == 12_000
    codes = set(Finding.objects.filter(run=run, closed_at__isnull=True).values_list("code", flat=True))
    assert not codes & {"missing_receipt", "orphan_receipt", "committed_event_missing"}, codes


def push(client, key: str, document: dict):
    return client.post("/ship/v1/push", json.dumps(document), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CALLPROOF_SHIPPER="one")  # fmt: skip


def ledger_item(offset: int, data: bytes) -> dict:
    return {"kind": "ledger", "offset": offset, "sha256": hashlib.sha256(data).hexdigest(),
            "data": base64.b64encode(data).decode()}  # fmt: skip


def test_the_mirror_takes_what_it_holds_and_says_what_it_holds_otherwise(client, mirror):
    key = shipping.new_key("agent-a")
    lines = b'{"seq": 1}\n', b'{"seq": 2}\n', b'{"seq": 3}\n'
    first = push(client, key, {"run_id": "r1", "items": [ledger_item(0, lines[0]), ledger_item(11, lines[1])]})
    assert first.status_code == 200 and first.json()["ledger_size"] == 22
    # Sent again (its answer lost), and overlapping what the mirror holds: taken, written once.
    again = push(client, key, {"run_id": "r1", "items": [ledger_item(0, lines[0] + lines[1] + lines[2])]})
    assert again.status_code == 200 and again.json()["ledger_size"] == 33
    held = mirror / "agent-a" / "r1" / "events.jsonl"
    assert held.read_bytes() == b"".join(lines)
    # Past the mirror's end, or unlike its bytes: refused with what it holds, nothing written.
    for item in (ledger_item(40, b'{"seq": 5}\n'), ledger_item(11, b'{"seq": 9}\n')):
        refused = push(client, key, {"run_id": "r1", "items": [item]})
        assert refused.status_code == 409, refused.content
        assert refused.json()["ledger_size"] == 33
        assert refused.json()["ledger_sha256"] == hashlib.sha256(b"".join(lines)).hexdigest()
    assert held.read_bytes() == b"".join(lines)


def test_a_refused_push_leaves_nothing_behind(client, mirror):
    key = shipping.new_key("agent-a")
    good = {"kind": "file", "path": "steer.json", "offset": 0, "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest(),
            "data": base64.b64encode(b"{}").decode()}  # fmt: skip
    refused = push(client, key, {"run_id": "r1", "items": [good, ledger_item(0, b"x\n"), {"kind": "other"}]})
    assert refused.status_code == 400
    assert not (mirror / "agent-a" / "r1").exists() and not ShippedRun.objects.exists()
    # The same, refused only when its last item is held against the mirror: still nothing.
    refused = push(client, key, {"run_id": "r1", "items": [good, ledger_item(5, b"x\n")]})
    assert refused.status_code == 409
    assert not (mirror / "agent-a" / "r1").exists()


def stopped(process: subprocess.Popen) -> bool:
    """Whether ``process`` stopped itself at a ``:pause`` failpoint (its state is T)."""
    return Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def archived_on_the_dashboard(demo_root, tmp_path, live_server, key, monkeypatch, settings) -> list[str]:
    """The demo shipped and imported, then retention archives its finished runs from the mirror."""
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    settings.EVIDENCE_ARCHIVE_ROOT = tmp_path / "archive"
    monkeypatch.setenv("RECEIPTS_CLOCK", "2036-01-01T00:00:00Z")  # past both ages
    applied = actions.apply_due(now=protocol.utc_now(), apply=True)
    monkeypatch.delenv("RECEIPTS_CLOCK")
    return sorted(str(result["run_id"]) for result in applied if result.get("applied") == "archived")


def hold(run_id: str, django_user_model, *, on: bool = True) -> None:
    keeper = django_user_model.objects.filter(username="lee").first() or join(
        django_user_model.objects.create_user("lee", password="a-long-password-1"), "admin"
    )
    actions.set_legal_hold(run=Run.objects.get(run_id=run_id), user=keeper, hold=on, reason="the lawyers asked",
                           now=protocol.utc_now())  # fmt: skip


def test_a_legal_hold_set_while_the_host_removes_an_archived_run_keeps_the_hosts_copy(
    demo_root, tmp_path, live_server, mirror, monkeypatch, settings, django_user_model
):
    key = shipping.new_key("agent-a")
    archived = archived_on_the_dashboard(demo_root, tmp_path, live_server, key, monkeypatch, settings)
    assert "clean-run" in archived
    command = ship_command(demo_root, live_server.url, key, tmp_path, "--once")
    log, pausing = tmp_path / "shipper.log", ship_env(tmp_path, RECEIPTS_FAILPOINT="ship_after_run_dir_renamed:pause")
    with open(log, "w") as stderr:
        shipper = subprocess.Popen(command, env=pausing, stdout=subprocess.DEVNULL, stderr=stderr, cwd=tmp_path)
    held = False
    while shipper.poll() is None:  # each removal stops there, one run after another
        until(lambda: stopped(shipper) or shipper.poll() is not None, "the shipper to stop or end")
        if shipper.poll() is None and not held and not (demo_root / "clean-run").exists():
            # clean-run renamed out of the readers' way, not yet removed: the hold arrives now,
            # after the shipper fetched the instruction and before it removes the directory.
            hold("clean-run", django_user_model)
            held = True
        if shipper.poll() is None:
            shipper.send_signal(signal.SIGCONT)
            time.sleep(0.05)  # not a deadline: the loop waits for the next stop or the end either way
    assert shipper.wait() == 0, log.read_text()
    assert (demo_root / "clean-run" / "steer.json").is_file(), "the hold won: the host's copy is put back"
    assert [path.name for path in demo_root.iterdir() if path.name.startswith(".")] == []
    kept = Run.objects.get(run_id="clean-run")
    assert kept.host_copy_removed_at is None and kept.host_copy_removal_confirmed_at is None
    removed = AuditEntry.objects.filter(action=AuditEntry.HOST_COPY_REMOVED)
    assert "clean-run" not in set(removed.values_list("run__run_id", flat=True))
    assert held and not (demo_root / "legacy-task").exists(), "a run under no hold is removed as before"
    # The hold lifted, the next pass removes it, once.
    hold("clean-run", django_user_model, on=False)
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert not (demo_root / "clean-run").exists()
    assert removed.filter(run__run_id="clean-run").count() == 1


def test_a_removal_confirmed_before_a_hold_is_finished_and_acknowledged(
    demo_root, tmp_path, live_server, mirror, monkeypatch, settings, django_user_model
):
    key = shipping.new_key("agent-a")
    first = archived_on_the_dashboard(demo_root, tmp_path, live_server, key, monkeypatch, settings)[0]
    killed = ship(demo_root, live_server.url, key, tmp_path, RECEIPTS_FAILPOINT="ship_after_removal_confirmed")
    assert killed.returncode == 137, killed.stderr
    [left] = [path.name for path in demo_root.iterdir() if path.name.startswith(".")]
    assert left.startswith(f".{first}.removed-"), left
    hold(first, django_user_model)  # too late: the dashboard confirmed the removal before it
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert [path.name for path in demo_root.iterdir() if path.name.startswith(".")] == []
    assert not (demo_root / first).exists()
    run = Run.objects.get(run_id=first)
    assert run.host_copy_removed_at is not None and run.legal_hold
    assert AuditEntry.objects.filter(run=run, action=AuditEntry.HOST_COPY_REMOVED).count() == 1


def test_an_earlier_shippers_json_state_is_taken_over_and_nothing_is_sent_again(
    demo_root, tmp_path, live_server, mirror
):
    """A shipper upgraded in place: its JSON state (what each ledger and file the dashboard took)
    becomes the SQLite state, with the same instance (the dashboard's lease stays its own)."""
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    legacy: dict = {"instance": "the-instance-it-had", "files": {}}
    for run_dir in sorted(path for path in demo_root.iterdir() if path.is_dir()):
        for relative in run_files(run_dir):
            facts = (run_dir / relative).lstat()
            mark = (
                facts.st_size if relative == protocol.LEDGER_NAME else [facts.st_size, facts.st_mtime_ns, facts.st_ino]
            )
            legacy["files"][f"{run_dir.name}/{relative}"] = mark
    state = ship_command(demo_root, live_server.url, key, tmp_path)[-1]
    Path(state).write_text(json.dumps(legacy))
    received = dict(ShippedRun.objects.values_list("run_id", "received_at"))

    again = ship(demo_root, live_server.url, key, tmp_path)
    assert again.returncode == 0, again.stderr
    assert Path(state).read_bytes().startswith(b"SQLite format 3")
    assert ShippedRun.objects.get(run_id="clean-run").host.lease == "the-instance-it-had"
    assert dict(ShippedRun.objects.values_list("run_id", "received_at")) == received, "nothing sent again"
    durable.append_event(demo_root / "clean-run", "note", {"text": "after the upgrade"})
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a") == {}


def test_a_steer_json_that_cannot_be_read_for_a_while_does_not_make_the_run_start_again(
    demo_root, tmp_path, live_server, mirror
):
    """Which run a directory holds is its steer.json's digest; one that cannot be read now says
    nothing of it: what the shipper knows of the run stands, and it goes on from there."""
    import sqlite3

    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    state = Path(ship_command(demo_root, live_server.url, key, tmp_path)[-1])

    def known(run_id: str) -> tuple[int, int]:
        with sqlite3.connect(state) as db:
            files = db.execute("SELECT count(*) FROM files WHERE run_id = ?", (run_id,)).fetchone()[0]
            [ledger] = db.execute("SELECT ledger FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return files, ledger

    files_before, _ = known("clean-run")
    durable.append_event(demo_root / "clean-run", "note", {"text": "written meanwhile"})
    steer = demo_root / "clean-run" / "steer.json"
    steer.rename(tmp_path / "steer.json")
    steer.mkdir()  # a folder where steer.json was: no digest
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0 and "clean-run: steer.json" in shipped.stderr, shipped.stderr
    files_now, ledger = known("clean-run")
    assert files_now == files_before, "not started again from nothing"
    assert ledger == (demo_root / "clean-run" / "events.jsonl").stat().st_size
    steer.rmdir()
    (tmp_path / "steer.json").rename(steer)
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a") == {}
