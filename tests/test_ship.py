"""``callproof ship``: a host with no database credentials and no Django ships its runs over HTTP
with its own key; the dashboard imports them from its mirror as that host's, and the people's
decisions travel back through the same door (evidence/ingest/shipping.py, receipts/ship.py).

The shipper is a real ``python -m receipts ship`` process whose environment holds no
``DATABASE_URL``; the dashboard is pytest-django's live server (a real HTTP server on loopback).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command

from evidence.ingest import shipping
from evidence.models import AuditEntry, Call, Confirmation, Host, HumanDecision, Run
from evidence.retention import actions
from evidence.review import settle
from receipts import durable, protocol, runtime
from tests.helpers import every_entry, first_call_of, join
from tests.shipping import ship
from tests.volume import synthetic_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_host_ships_its_runs_with_its_key_and_writes_back_the_decisions(
    demo_root, tmp_path, live_server, mirror, settings, django_user_model
):
    key = shipping.new_key("agent-a")
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    call_command("import_mirrors")
    runs = {run.run_id: run for run in Run.objects.select_related("host")}
    assert set(runs) == {path.name for path in demo_root.iterdir()}
    assert {str(run.host) for run in runs.values()} == {"agent-a"}
    for run_id, run in runs.items():
        ledger = (demo_root / run_id / protocol.LEDGER_NAME).read_bytes()
        assert run.event_count == ledger.count(b"\n"), run_id
        assert (mirror / "agent-a" / run_id / protocol.LEDGER_NAME).read_bytes() == ledger
        assert Path(run.path) == mirror / "agent-a" / run_id, "imported from the mirror"
    host = Host.objects.get(name="agent-a")
    assert host.runs_root == str(demo_root) and host.stopped_at is not None, "a --once pass lets go of the host"

    # A person decides away from any host; the host's next pass writes it into its own directory.
    confirmer = join(django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer")
    call = first_call_of("send-message-killed")
    settle.settle_call(run=call.run, call=call, user=confirmer, resolution="committed", reason="the mail log has it",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    decision = HumanDecision.objects.get(run=call.run, call_id=call.call_id)
    assert decision.pending
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0 and "decisions: 1 delivered" in shipped.stderr, shipped.stderr
    confirmation = demo_root / "send-message-killed" / "confirmations" / f"{call.call_id}.json"
    assert json.loads(confirmation.read_bytes())["resolution"] == "committed"
    decision.refresh_from_db()
    assert decision.delivered_at is not None and decision.delivered_by == "agent-a"
    shipped = ship(demo_root, live_server.url, key, tmp_path)  # the confirmation and its event travel up
    assert shipped.returncode == 0 and "delivered" not in shipped.stderr, "delivered once"
    call_command("import_mirrors")
    assert Confirmation.objects.filter(run=call.run, call_id=call.call_id, valid=True).exists()
    assert not Call.objects.get(pk=call.pk).in_doubt


def test_another_hosts_copy_of_a_run_is_refused_and_a_revoked_key_stops_the_shipper(
    demo_root, tmp_path, live_server, mirror
):
    first = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, first, tmp_path).returncode == 0
    call_command("import_mirrors")
    other_root = tmp_path / "b-runs"
    other_root.mkdir()
    shutil.copytree(demo_root / "clean-run", other_root / "clean-run", symlinks=True)
    second = shipping.new_key("agent-b")
    shipped = ship(other_root, live_server.url, second, tmp_path)
    assert "run_id clean-run is already host agent-a's run" in shipped.stderr, shipped.stderr
    assert not (mirror / "agent-b" / "clean-run").exists()
    assert str(Run.objects.get(run_id="clean-run").host) == "agent-a"

    shipping.revoke("agent-b")
    refused = ship(other_root, live_server.url, second, tmp_path)
    assert refused.returncode == 1 and "unknown or revoked" in refused.stderr, refused.stderr


def test_a_second_shipper_with_the_same_key_is_refused_while_the_first_ships(client, mirror):
    key = shipping.new_key("agent-a")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_X_CALLPROOF_ROOT": "/srv/runs"}
    assert client.get("/ship/v1/instructions", HTTP_X_CALLPROOF_SHIPPER="one", **headers).status_code == 200
    refused = client.get("/ship/v1/instructions", HTTP_X_CALLPROOF_SHIPPER="two", **headers)
    assert refused.status_code == 409 and "another shipper with host agent-a's key" in refused.json()["error"]
    host = Host.objects.get(name="agent-a")
    assert host.lease == "one" and host.refused_at is not None and host.refused_from == "/srv/runs"
    assert client.post("/ship/v1/stopped", HTTP_X_CALLPROOF_SHIPPER="one", **headers).status_code == 200
    assert client.get("/ship/v1/instructions", HTTP_X_CALLPROOF_SHIPPER="two", **headers).status_code == 200


def push_item(path: str, content: bytes, **changed) -> dict:
    digest = hashlib.sha256(content).hexdigest()
    return {"kind": "file", "path": path, "offset": 0, "size": len(content), "sha256": digest,
            "data": base64.b64encode(content).decode()} | changed  # fmt: skip


@pytest.mark.parametrize(
    ("document", "status", "said"),
    [
        ({"run_id": "../etc", "items": []}, 400, "run_id is not a valid run_id"),
        ({"run_id": "r1", "items": [push_item("../steer.json", b"{}")]}, 400, "path is steer.json"),
        ({"run_id": "r1", "items": [push_item("/etc/passwd", b"x")]}, 400, "path is steer.json"),
        ({"run_id": "r1", "items": [push_item("receipts/.hidden", b"x")]}, 400, "path is steer.json"),
        ({"run_id": "r1", "items": [push_item("receipts/a/b.json", b"x")]}, 400, "path is steer.json"),
        ({"run_id": "r1", "items": [push_item("steer.json", b"{}", sha256="0" * 64)]}, 400, "does not match"),
        ({"run_id": "r1", "items": [push_item("steer.json", b"{}", data="not base64!")]}, 400, "not base64"),
        ({"run_id": "r1", "items": [push_item("steer.json", b"{}", size=2**40)]}, 400, "size is a whole number"),
        ({"run_id": "r1", "items": [push_item("steer.json", b"{}", offset=-1)]}, 400, "offset is a whole number"),
        (
            {
                "run_id": "r1",
                "items": [
                    {
                        "kind": "ledger",
                        "offset": 5,
                        "sha256": hashlib.sha256(b"x\n").hexdigest(),
                        "data": base64.b64encode(b"x\n").decode(),
                    }
                ],
            },
            409,
            "past the mirror's end",
        ),
        ({"run_id": "r1", "items": [{"kind": "other"}] * 201}, 400, "at most 200 items"),
        ([1, 2], 400, "a push is"),
    ],
)
def test_a_push_out_of_bounds_is_refused_and_writes_nothing(client, mirror, document, status, said):
    key = shipping.new_key("agent-a")
    answer = client.post("/ship/v1/push", json.dumps(document), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CALLPROOF_SHIPPER="one")  # fmt: skip
    assert answer.status_code == status and said in answer.json()["error"], answer.content
    written = [path for path in mirror.rglob("*") if path.is_file()] if mirror.exists() else []
    assert written == []


def test_no_key_no_entry_and_a_host_cannot_answer_for_anothers_decision(client, mirror, demo, django_user_model):
    assert client.get("/ship/v1/instructions").status_code == 401
    assert client.get("/ship/v1/instructions", HTTP_AUTHORIZATION="Bearer cph_nope").status_code == 401
    confirmer = join(django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer")
    call = first_call_of("send-message-killed")
    from django.conf import settings

    owner, settings.EVIDENCE_HOST_NAME = settings.EVIDENCE_HOST_NAME, "web-host"
    try:
        settle.settle_call(run=call.run, call=call, user=confirmer, resolution="committed", reason="seen",
                           typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    finally:
        settings.EVIDENCE_HOST_NAME = owner
    decision = HumanDecision.objects.get(run=call.run, call_id=call.call_id)
    stranger = shipping.new_key("agent-z")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {stranger}", "HTTP_X_CALLPROOF_SHIPPER": "z"}
    assert client.get("/ship/v1/instructions", **headers).json()["instructions"] == []
    acked = client.post("/ship/v1/acks", json.dumps([{"id": f"decision-{decision.pk}", "outcome": "delivered"}]),
                        content_type="application/json", **headers)  # fmt: skip
    assert acked.status_code == 200 and acked.json()["delivered"] == 0
    decision.refresh_from_db()
    assert decision.pending, "another host's key cannot mark it delivered"


def test_a_big_ledger_and_a_big_file_arrive_whole_in_chunks_and_a_restart_goes_on_from_the_acknowledged(
    tmp_path, live_server, mirror
):
    root = tmp_path / "runs"
    run_dir = root / "big"
    synthetic_run(run_dir, events=30_000, receipts=10, contract="c" * 64)
    (run_dir / "tasks").mkdir(exist_ok=True)
    (run_dir / "tasks" / "big-task.json").write_text(json.dumps({"blob": "x" * 1_000_000}))
    key = shipping.new_key("agent-a")
    first = ship(root, live_server.url, key, tmp_path)
    assert first.returncode == 0, first.stderr
    copy = mirror / "agent-a" / "big"
    for path in [p for p in run_dir.rglob("*") if p.is_file()]:
        assert (copy / path.relative_to(run_dir)).read_bytes() == path.read_bytes(), path
    assert (run_dir / protocol.LEDGER_NAME).stat().st_size > 3 * 384 * 1024, "more than one chunk"
    # The run goes on; the next pass sends only the new lines, from where the mirror ends.
    durable.append_event(run_dir, "note", {"text": "later"})
    ledger_before = (copy / protocol.LEDGER_NAME).stat().st_size
    second = ship(root, live_server.url, key, tmp_path)
    assert second.returncode == 0, second.stderr
    assert (copy / protocol.LEDGER_NAME).read_bytes() == (run_dir / protocol.LEDGER_NAME).read_bytes()
    assert (copy / protocol.LEDGER_NAME).stat().st_size - ledger_before < 1000
    call_command("import_mirrors")
    assert Run.objects.get(run_id="big").event_count == 30_001


def test_retention_archives_a_shipped_run_from_the_mirror(demo_root, tmp_path, live_server, mirror, monkeypatch,
                                                           settings):  # fmt: skip
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    settings.EVIDENCE_ARCHIVE_ROOT = tmp_path / "archive"
    monkeypatch.setenv("RECEIPTS_CLOCK", "2036-01-01T00:00:00Z")  # past both ages
    [result] = [r for r in actions.apply_due(now=protocol.utc_now(), apply=True) if r["run_id"] == "clean-run"]
    assert result["applied"] == "archived", result
    assert not (mirror / "agent-a" / "clean-run").exists() and (demo_root / "clean-run").is_dir()
    assert (tmp_path / "archive" / "clean-run.tar.gz").is_file()
    archived = set(Run.objects.filter(archived=True).values_list("run_id", flat=True))
    assert {"clean-run", "legacy-task"} <= archived, archived
    # On the host, another run took the name of one archived run meanwhile: it must stay.
    shutil.rmtree(demo_root / "legacy-task")
    runtime.run_init(demo_root / "legacy-task", contract_sha256="d" * 64)
    monkeypatch.delenv("RECEIPTS_CLOCK")
    # Killed between renaming the host's copy away and removing it: nothing acknowledged yet.
    killed = ship(demo_root, live_server.url, key, tmp_path, RECEIPTS_FAILPOINT="ship_after_run_dir_renamed")
    assert killed.returncode == 137, killed.stderr
    assert [path.name for path in demo_root.iterdir() if path.name.startswith(".")] != []
    assert not AuditEntry.objects.filter(action=AuditEntry.HOST_COPY_REMOVED).exists()
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    assert [path.name for path in demo_root.iterdir() if path.name.startswith(".")] == [], "the killed one's copy"
    assert not (demo_root / "clean-run").exists(), "the host's own copy is removed once the archive is read back"
    assert (demo_root / "legacy-task" / "steer.json").is_file(), "another run under an archived id stays"
    removed = Run.objects.get(run_id="clean-run")
    assert removed.host_copy_removed_at is not None
    assert AuditEntry.objects.filter(run=removed, action=AuditEntry.HOST_COPY_REMOVED).count() == 1
    kept = Run.objects.get(run_id="legacy-task")
    assert kept.host_copy_removed_at is None and "holds another run than the one archived" in kept.host_copy_kept
    again = ship(demo_root, live_server.url, key, tmp_path)
    assert again.returncode == 0 and AuditEntry.objects.filter(action=AuditEntry.HOST_COPY_REMOVED).count() == len(
        archived - {"legacy-task"}
    ), "each removal once"


def test_a_ledger_cut_shorter_on_the_host_is_said_and_the_mirror_keeps_what_was_shipped(
    demo_root, tmp_path, live_server, mirror
):
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    ledger = demo_root / "clean-run" / protocol.LEDGER_NAME
    shipped = ledger.read_bytes()
    ledger.write_bytes(shipped[: len(shipped) // 2])  # someone cut the host's ledger
    again = ship(demo_root, live_server.url, key, tmp_path)
    assert again.returncode == 0 and "clean-run: its ledger is shorter than the dashboard acknowledged" in again.stderr
    assert (mirror / "agent-a" / "clean-run" / protocol.LEDGER_NAME).read_bytes() == shipped


def test_a_run_directory_swapped_for_a_symlink_gets_no_decision_where_it_points(
    demo_root, tmp_path, live_server, mirror, django_user_model
):
    """On the agent's host, the run directory swapped for a symlink to a copy of the run: the
    shipper writes nothing there (the writer would have delivered into the copy) and says the
    decision is refused, which the dashboard records as any refusal."""
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    call_command("import_mirrors")
    confirmer = join(django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer")
    call = first_call_of("send-message-killed")
    settle.settle_call(run=call.run, call=call, user=confirmer, resolution="committed", reason="the mail log has it",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    run_dir = demo_root / "send-message-killed"
    copy = tmp_path / "a-copy-of-the-run"
    shutil.copytree(run_dir, copy, symlinks=True)
    run_dir.rename(tmp_path / "the-real-run")
    run_dir.symlink_to(copy, target_is_directory=True)
    before = every_entry(copy)
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert "decisions: 0 delivered, 1 refused" in shipped.stderr, shipped.stderr
    assert every_entry(copy) == before, "nothing made or written where the symlink points"
    decision = HumanDecision.objects.get(run=call.run, call_id=call.call_id)
    assert "symlink" in decision.undeliverable and decision.delivered_at is None
