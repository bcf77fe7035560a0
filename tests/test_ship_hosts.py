"""What a host that ships may do, and what the server tells about it (evidence/ingest/mirror.py,
evidence/ingest/shipping.py, evidence/lib/hosts.py): ``host move`` retires the old name for good;
a host's pushes are bounded (a rate, new runs an hour, a quota) and every refusal says which; a
chunked file abandoned half way is swept; no input to ``/ship/v1`` is a 500; a host whose clock
is off is told apart."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
from typing import Any

import pytest
from django.core.management import call_command

from evidence.ingest import mirror as mirrors
from evidence.ingest import shipping
from evidence.lib import hosts
from evidence.models import Finding, Host, Run, ShippedRun
from receipts import durable, protocol
from tests.shipping import converged, ship
from tests.test_ship_converges import confirmations_in, settled

pytestmark = pytest.mark.django_db(transaction=True)


def headers(key: str, **more: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_X_CALLPROOF_SHIPPER": "one", **more}


def test_host_move_retires_the_old_names_keys_and_its_mirror_goes_with_its_runs(
    demo_root, tmp_path, live_server, mirror, client, django_user_model
):
    old_key = shipping.new_key("box-1")
    assert ship(demo_root, live_server.url, old_key, tmp_path).returncode == 0
    call_command("import_mirrors")
    runs = set(Run.objects.filter(host__name="box-1").values_list("run_id", flat=True))
    assert runs == {path.name for path in demo_root.iterdir()}
    assert client.get("/ship/v1/instructions", **headers(old_key)).status_code == 200  # its shipper at work
    with pytest.raises(hosts.MoveRefusedError, match="stop its shipper first") as refused:
        hosts.move(old="box-1", new="box-2", reason="renamed", actor="a test")
    assert "import_runs" not in str(refused.value), "a shipping host has no watch to stop"
    assert client.post("/ship/v1/stopped", **headers(old_key)).status_code == 200

    assert hosts.move(old="box-1", new="box-2", reason="the machine was renamed", actor="a test") == len(runs)
    # One request with the old key does not bring the retired name back.
    assert client.get("/ship/v1/instructions", **headers(old_key)).status_code == 401
    again = ship(demo_root, live_server.url, old_key, tmp_path)
    assert again.returncode == 1 and "unknown or revoked" in again.stderr, again.stderr
    retired = Host.objects.get(name="box-1")
    assert hosts.state_of(retired) == hosts.ONE_OFF and not retired.shipped_runs.exists()

    # The new name's shipper goes on from what the server holds; its runs import as its own.
    decision = settled("send-message-killed", django_user_model)
    durable.append_event(demo_root / "clean-run", "note", {"text": "written after the move"})
    new_key = shipping.new_key("box-2")
    shipped = ship(demo_root, live_server.url, new_key, tmp_path)
    assert shipped.returncode == 0 and "decisions: 1 delivered" in shipped.stderr, shipped.stderr
    assert converged(demo_root, mirror / "box-2") == {}
    assert not any((mirror / "box-1").iterdir()), "the old name's folder of the mirror moved with its runs"
    call_command("import_mirrors")
    assert set(Run.objects.filter(host__name="box-2").values_list("run_id", flat=True)) == runs
    assert not Run.objects.filter(host__name="box-1").exists()
    assert not Finding.objects.filter(code="duplicate_run_id", closed_at__isnull=True).exists()
    assert Run.objects.get(run_id="clean-run").event_count == 11
    decision.refresh_from_db()
    assert decision.delivered_by == "box-2"
    assert confirmations_in(demo_root / "send-message-killed") == [decision.call_id]


def ledger_item(offset: int, data: bytes) -> dict:
    return {"kind": "ledger", "offset": offset, "sha256": hashlib.sha256(data).hexdigest(),
            "data": base64.b64encode(data).decode()}  # fmt: skip


def file_item(path: str, data: bytes, *, offset: int = 0, size: int | None = None, whole: bytes | None = None) -> dict:
    return {"kind": "file", "path": path, "offset": offset, "size": len(whole or data) if size is None else size,
            "sha256": hashlib.sha256(whole or data).hexdigest(), "data": base64.b64encode(data).decode()}  # fmt: skip


def push(client, key: str, document: object):
    return client.post("/ship/v1/push", json.dumps(document), content_type="application/json", **headers(key))


def test_a_hosts_pushes_are_bounded_and_each_refusal_says_which_bound(client, mirror, settings):
    key = shipping.new_key("agent-a")
    settings.EVIDENCE_SHIP_NEW_RUNS_PER_HOUR = 3
    for number in range(3):
        assert push(client, key, {"run_id": f"r{number}", "items": [ledger_item(0, b"{}\n")]}).status_code == 200
    refused = push(client, key, {"run_id": "r3", "items": [ledger_item(0, b"{}\n")]})
    assert refused.status_code == 429 and "EVIDENCE_SHIP_NEW_RUNS_PER_HOUR" in refused.json()["error"]
    assert int(refused["Retry-After"]) >= 1 and not (mirror / "agent-a" / "r3").exists()
    assert push(client, key, {"run_id": "r0", "items": [ledger_item(3, b"{}\n")]}).status_code == 200, "runs it has"

    settings.EVIDENCE_SHIP_QUOTA_MIB = 1
    big = b"x" * 400_000 + b"\n"
    assert push(client, key, {"run_id": "r1", "items": [ledger_item(3, big)]}).status_code == 200
    assert push(client, key, {"run_id": "r1", "items": [ledger_item(3 + len(big), big)]}).status_code == 200
    full = push(client, key, {"run_id": "r1", "items": [ledger_item(3 + 2 * len(big), big)]})
    assert full.status_code == 507 and "EVIDENCE_SHIP_QUOTA_MIB" in full.json()["error"]
    assert full.json()["used_bytes"] == mirrors.host_bytes(Host.objects.get(name="agent-a"))
    assert (mirror / "agent-a" / "r1" / "events.jsonl").stat().st_size == 3 + 2 * len(big), "nothing written"

    settings.EVIDENCE_SHIP_QUOTA_MIB, settings.EVIDENCE_SHIP_PUSHES_PER_MINUTE = 0, 5
    Host.objects.filter(name="agent-a").update(push_tokens_at=None)  # a full bucket: a minute's worth
    statuses = [push(client, key, {"run_id": "r2", "items": []}).status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    host = Host.objects.get(name="agent-a")
    assert host.push_refused_since is not None and "EVIDENCE_SHIP_PUSHES_PER_MINUTE" in host.push_refusal
    assert host.push_tokens_at is not None
    Host.objects.filter(name="agent-a").update(push_tokens_at=host.push_tokens_at - dt.timedelta(seconds=13))
    assert push(client, key, {"run_id": "r2", "items": []}).status_code == 200, "the bucket fills again"
    assert Host.objects.get(name="agent-a").push_refused_since is None, "a push taken ends the refusals"


def test_a_file_abandoned_half_way_is_swept_and_its_bytes_freed(client, mirror, settings):
    key = shipping.new_key("agent-a")
    whole = b'{"big": "' + b"y" * 700_000 + b'"}\n'
    first = file_item("tasks/t.json", whole[:400_000], size=len(whole), whole=whole)
    assert push(client, key, {"run_id": "r1", "items": [first]}).status_code == 200
    parts = list(mirrors.parts_root().rglob("*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == 400_000
    assert ShippedRun.objects.get(run_id="r1").mirror_bytes == 400_000, "a part counts against the quota"
    assert mirrors.sweep_parts() == [], "a part in progress stays"
    old = parts[0].stat().st_mtime - settings.EVIDENCE_SHIP_PARTS_KEEP_SECONDS - 1
    os.utime(parts[0], (old, old))
    assert mirrors.sweep_parts() == parts
    assert not mirrors.parts_root().exists() or not any(mirrors.parts_root().rglob("*"))
    assert ShippedRun.objects.get(run_id="r1").mirror_bytes == 0
    # The file's next chunk finds no part: the server says so, and the file goes again from its start.
    rest = file_item("tasks/t.json", whole[400_000:], offset=400_000, size=len(whole), whole=whole)
    again = push(client, key, {"run_id": "r1", "items": [rest]})
    assert again.status_code == 409 and again.json()["part_size"] == 0
    assert push(client, key, {"run_id": "r1", "items": [first]}).status_code == 200
    assert push(client, key, {"run_id": "r1", "items": [rest]}).status_code == 200
    assert (mirror / "agent-a" / "r1" / "tasks" / "t.json").read_bytes() == whole
    assert ShippedRun.objects.get(run_id="r1").mirror_bytes == len(whole)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ([{"id": "decision-²", "outcome": "delivered"}], 200),  # "²".isdigit(), and int("²") raises
        ([{"id": "remove-٣", "outcome": "delivered"}], 200),  # an Arabic-Indic three
        ([{"id": "decision-" + "9" * 30, "outcome": "failed"}], 200),
    ],
)
def test_an_acknowledgement_of_no_instruction_changes_nothing(client, mirror, body, said):
    key = shipping.new_key("agent-a")
    answer = client.post("/ship/v1/acks", json.dumps(body), content_type="application/json", **headers(key))
    assert answer.status_code == said and answer.json() == {"delivered": 0, "refused": 0, "failed": 0}


def test_any_name_the_writer_can_make_is_written_and_json_nested_deep_is_refused_not_a_500(client, mirror):
    """A file name of 251 characters (the server's temp name beside it would pass 255 bytes: a
    500 once), of 255 bytes of UTF-8, with a space or an accent: each is written, its temp file
    beside the mirror. One of 256 bytes, a lone surrogate, JSON nested 100,000 deep: 400s."""
    key = shipping.new_key("agent-a")
    names = ["a" * 246 + ".json", "é" * 125 + "a.json"[:5], "with space.json", "café.json", "-dash-first.json"]
    assert len(names[1].encode()) == 255
    for name in names:
        answer = push(client, key, {"run_id": "r1", "items": [file_item(f"tasks/{name}", b"{}")]})
        assert answer.status_code == 200, (name, answer.content)
        assert (mirror / "agent-a" / "r1" / "tasks" / name).read_bytes() == b"{}"
    for name in ("é" * 128, "\ud800.json", ".hidden", "a/b"):
        answer = push(client, key, {"run_id": "r2", "items": [file_item(f"tasks/{name}", b"{}")]})
        assert answer.status_code == 400, (name, answer.content)
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("push", "acks", "report", "removal"):
        answer = client.post(f"/ship/v1/{path}", deep, content_type="application/json", **headers(key))
        assert answer.status_code == 400 and "nests deeper" in answer.json()["error"], path
    assert not (mirror / "agent-a" / "r2").exists()


def test_a_host_whose_clock_is_off_is_told_apart(client, mirror, settings):
    key = shipping.new_key("agent-a")
    fast = protocol.format_time(protocol.utc_now() + dt.timedelta(hours=1))
    assert client.get("/ship/v1/instructions", **headers(key, HTTP_X_CALLPROOF_TIME=fast)).status_code == 200
    offset = Host.objects.get(name="agent-a").clock_offset_seconds
    assert offset is not None and 3590 < offset <= 3600
    right = protocol.format_time(protocol.utc_now())
    assert client.get("/ship/v1/instructions", **headers(key, HTTP_X_CALLPROOF_TIME=right)).status_code == 200
    assert abs(Host.objects.get(name="agent-a").clock_offset_seconds or 99) < 5
    # A push's time is an upload's, not a clock's: it is not read.
    late = protocol.format_time(protocol.utc_now() - dt.timedelta(hours=2))
    push_headers = headers(key, HTTP_X_CALLPROOF_TIME=late)
    client.post("/ship/v1/push", json.dumps({"run_id": "r1", "items": []}), content_type="application/json",
                **push_headers)  # fmt: skip
    assert abs(Host.objects.get(name="agent-a").clock_offset_seconds or 99) < 5


def test_a_run_gone_from_its_hosts_root_is_no_longer_behind(client, mirror, demo_root, tmp_path, live_server):
    key = shipping.new_key("agent-a")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    durable.append_event(demo_root / "clean-run", "note", {"text": "never shipped"})
    body = {"runs": [{"run_id": "clean-run", "ledger_size": (demo_root / "clean-run" / "events.jsonl").stat().st_size}]}
    assert client.post("/ship/v1/report", json.dumps(body), content_type="application/json",
                       **headers(key)).status_code == 200  # fmt: skip
    assert ShippedRun.objects.get(run_id="clean-run").behind_since is not None
    assert client.post("/ship/v1/stopped", **headers(key)).status_code == 200  # its lease let go
    # Removed by hand on the host before its new line went: the shipper says it is gone.
    import shutil

    shutil.rmtree(demo_root / "clean-run")
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    gone = ShippedRun.objects.get(run_id="clean-run")
    assert gone.behind_since is None and gone.host_ledger_bytes == gone.mirror_ledger_bytes
    assert Host.objects.get(name="agent-a").last_pass_seconds is not None, "the shipper's pass, timed"


def test_refused_pushes_count_against_the_rate_and_the_mirror_is_hashed_once_for_them(client, mirror, settings):
    """A host that sends pushes the server must refuse (each a 409 that says the SHA-256 of what
    the mirror holds) spends its bucket as any other, and the server hashes its mirror's ledger
    once for each state of the file, not once a refusal."""
    key = shipping.new_key("agent-a")
    lines = b'{"seq": 1}\n' * 1000
    assert push(client, key, {"run_id": "r1", "items": [ledger_item(0, lines)]}).status_code == 200
    settings.EVIDENCE_SHIP_PUSHES_PER_MINUTE = 4
    Host.objects.filter(name="agent-a").update(push_tokens_at=None)
    past_the_end = {"run_id": "r1", "items": [ledger_item(len(lines) + 5, b"{}\n")]}
    answers = [push(client, key, past_the_end) for _ in range(5)]
    assert [answer.status_code for answer in answers] == [409, 409, 409, 409, 429]
    assert {answer.json()["ledger_sha256"] for answer in answers[:4]} == {hashlib.sha256(lines).hexdigest()}
    shipped = ShippedRun.objects.get(run_id="r1")
    facts = (mirror / "agent-a" / "r1" / "events.jsonl").lstat()
    assert shipped.ledger_digest_of == f"{facts.st_size}:{facts.st_mtime_ns}:{facts.st_ino}"
    assert shipped.ledger_digest == hashlib.sha256(lines).hexdigest()
