"""What an outsider's attack on ``callproof ship`` found, each a test that failed before its fix
(real shipper processes against pytest-django's live server, or crafted requests): a ledger
rewritten on the host, a name the dashboard did not take, a run named like a run's own file,
a 409 that said "shipping", more instructions than one acknowledgement takes, a run refused on
every pass that nobody saw, a run moved while it was sent, a mirror that lost a run, an empty
file, sums past SQLite's integers, a full disk, a run over the new runs an hour, a part hashed
again and again, reports without a rate, a removal cut short under an odd run_id, a lone
surrogate. (docs/operations.md, "How the shipper and the server agree".)"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from evidence.ingest import mirror as mirrors
from evidence.ingest import shipping
from evidence.lib import hosts
from evidence.models import Host, HumanDecision, Run, ShippedRun
from evidence.review import inbox
from receipts import durable, protocol
from receipts import ship as shipper_module
from receipts.reader import MAX_JSON_BYTES, discover_runs
from tests.helpers import until
from tests.shipping import converged, named_before_their_receipts, ship, stalled_item, start_shipper
from tests.test_ship_converges import big_run
from tests.test_ship_hosts import file_item, headers, ledger_item, push
from tests.volume import synthetic_run

pytestmark = pytest.mark.django_db(transaction=True)


def shipped_demo(demo_root: Path, tmp_path: Path, url: str) -> str:
    key = shipping.new_key("agent-a")
    assert ship(demo_root, url, key, tmp_path).returncode == 0
    return key


def test_a_ledger_whose_tail_was_rewritten_on_the_host_is_said_not_spliced(demo_root, tmp_path, live_server, mirror):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    ledger = demo_root / "clean-run" / protocol.LEDGER_NAME
    lines = ledger.read_bytes().splitlines(keepends=True)
    lines[-1] = b"{" + b" " * (len(lines[-1]) - 3) + b"}\n"  # the last line rewritten in place, same length
    ledger.write_bytes(b"".join(lines) + b'{"seq": 999, "type": "note"}\n')
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert "clean-run: the dashboard's copy of its ledger" in shipped.stderr, shipped.stderr
    assert "not the start of this host's ledger" in ShippedRun.objects.get(run_id="clean-run").problem
    mirrored = (mirror / "agent-a" / "clean-run" / protocol.LEDGER_NAME).read_bytes()
    assert not mirrored.endswith(b'{"seq": 999, "type": "note"}\n'), "nothing spliced after the old bytes"


def test_a_ledger_cut_short_then_grown_past_the_mirror_is_said_not_spliced(demo_root, tmp_path, live_server, mirror):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    ledger = demo_root / "clean-run" / protocol.LEDGER_NAME
    old = ledger.read_bytes()
    ledger.write_bytes(b"".join(old.splitlines(keepends=True)[:3]))
    assert "shorter than the dashboard acknowledged" in ship(demo_root, live_server.url, key, tmp_path).stderr
    while ledger.stat().st_size <= len(old):
        with open(ledger, "ab") as stream:
            stream.write(b'{"type": "note", "text": "written after the cut"}\n')
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert "not the start of this host's ledger" in shipped.stderr, shipped.stderr
    assert (mirror / "agent-a" / "clean-run" / protocol.LEDGER_NAME).read_bytes() == old, "what was shipped stays"
    assert ShippedRun.objects.get(run_id="clean-run").problem


@pytest.mark.parametrize(
    "name",
    [b"with space.json", "caf\u00e9.json".encode(), b"_underscore-first.json", b"x" * 201, b"\xff-not-utf8.json"],
)
def test_a_file_of_any_name_never_holds_back_the_rest_of_its_run(name, demo_root, tmp_path, live_server, mirror):
    """A name the writer can make is sent; one the dashboard cannot keep (not UTF-8) is said and
    skipped: the run's new ledger line arrives either way."""
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    run_dir = demo_root / "clean-run"
    with open(os.path.join(os.fsencode(run_dir / "tasks"), name), "wb") as stream:
        stream.write(b"a note an agent left\n")
    durable.append_event(run_dir, "note", {"text": "written after the odd file"})
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    differences = converged(demo_root, mirror / "agent-a")
    if name.startswith(b"\xff"):
        assert "a name the dashboard does not take" in shipped.stderr
        assert "\\xff-not-utf8.json" in ShippedRun.objects.get(run_id="clean-run").problem
        assert not any(key.startswith("clean-run/events") for key in differences), differences
    else:
        assert differences == {}


def test_a_run_named_like_a_runs_own_file_is_no_run_and_hides_no_other(
    demo_root, tmp_path, live_server, mirror, client
):
    assert not protocol.valid_run_id("state.json") and not protocol.valid_run_id("steer.json")
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    odd = demo_root / "state.json"
    odd.mkdir()
    (odd / "steer.json").write_text("{}")
    assert "clean-run" in discover_runs(demo_root).names, "the root is not taken for a run"
    durable.append_event(demo_root / "clean-run", "note", {"text": "written after"})
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a").keys() <= {"state.json/steer.json"}
    refused = push(client, key, {"run_id": "steer.json", "items": [ledger_item(0, b'{"seq": 1}\n')]})
    assert refused.status_code == 400 and not (mirror / "agent-a" / "steer.json").exists()


def test_a_409_about_a_run_whose_id_says_shipping_stops_only_that_run(demo_root, tmp_path, live_server, mirror):
    synthetic_run(demo_root / "aa-shipping-labels", events=20, receipts=2, contract="1" * 64)
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    shutil.rmtree(demo_root / "aa-shipping-labels")  # another run under its id: refused, 409, said
    synthetic_run(demo_root / "aa-shipping-labels", events=30, receipts=3, contract="2" * 64)
    durable.append_event(demo_root / "clean-run", "note", {"text": "another run writes on"})
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0 and "is another run on this host now" in shipped.stderr, shipped.stderr
    assert {k for k in converged(demo_root, mirror / "agent-a") if not k.startswith("aa-shipping-labels/")} == set()


@pytest.mark.parametrize("pending", [201, 450])
def test_every_decision_is_acknowledged_however_many_wait(pending, demo_root, tmp_path, live_server, mirror):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    call_command("import_mirrors")
    run = Run.objects.get(run_id="clean-run")
    decided = protocol.utc_now() - dt.timedelta(minutes=10)
    HumanDecision.objects.bulk_create(
        HumanDecision(run=run, call_id=f"{n:064x}", resolution="committed", reason="seen", actor="dana",
                      decided_at=decided, receipt_sha256="0" * 64, confirmation_id="0" * 64)
        for n in range(pending)
    )  # fmt: skip
    for _ in range(3):  # at most 200 instructions at a time: the rest come once these are said
        assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert not HumanDecision.objects.filter(delivered_at__isnull=True, undeliverable="").exists()


def test_a_run_refused_on_every_pass_is_a_stalled_host(shipping_host):
    root = shipping_host["root"]
    shutil.rmtree(root / "a2-lost-response")  # another run under its id: refused on every pass
    synthetic_run(root / "a2-lost-response", events=50, receipts=5, contract="f" * 64)
    start_shipper(shipping_host)
    item = until(lambda: (found := stalled_item()) and "a2-lost-response" in found.detail and found, "the item")
    assert isinstance(item, inbox.InboxItem) and "is another run on this host now" in item.detail


@pytest.mark.parametrize("replaced", [False, True])
def test_a_run_directory_moved_while_it_is_sent_leaves_no_line_without_its_receipt(
    replaced, demo_root, tmp_path, live_server, mirror, monkeypatch
):
    key = shipping.new_key("agent-a")
    run_dir = big_run(demo_root)  # several pushes: receipts first, then the ledger
    other = tmp_path / "other" / run_dir.name
    synthetic_run(other, events=3000, receipts=300, contract="e" * 64)
    moved: list[bool] = []
    between = shipper_module.Shipper.between_pushes

    def moving(self) -> None:
        if not moved and self._shipping == run_dir.name:  # after the big run's first push
            shutil.move(run_dir, tmp_path / "moved-away")
            if replaced:
                shutil.move(other, run_dir)
            moved.append(True)
        between(self)

    monkeypatch.setattr(shipper_module.Shipper, "between_pushes", moving)
    shipper = shipper_module.Shipper(demo_root, live_server.url, key, state_path=tmp_path / "state.sqlite3")
    try:
        report = shipper.ship_once()
        assert any("the run directory changed while it was sent" in problem for problem in report.problems)
        monkeypatch.setattr(shipper_module.Shipper, "between_pushes", between)
        shipper.ship_once()
    finally:
        shipper.state.close()
        shipper._lock.close()
    assert moved and named_before_their_receipts(mirror / "agent-a" / run_dir.name) == []


def test_a_run_the_mirror_lost_is_sent_whole_again(demo_root, tmp_path, live_server, mirror):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    shutil.rmtree(mirror / "agent-a" / "send-message-killed")  # the server's disk restored without it
    durable.append_event(demo_root / "send-message-killed", "note", {"text": "written after"})
    for _ in range(2):
        assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a") == {}


def test_an_empty_file_arrives_and_a_file_emptied_on_the_host_is_emptied(demo_root, tmp_path, live_server, mirror):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    (demo_root / "clean-run" / "tasks").mkdir(exist_ok=True)
    (demo_root / "clean-run" / "tasks" / "TASK-000099.md").write_bytes(b"")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    (demo_root / "clean-run" / "state.json").write_bytes(b"")
    assert ship(demo_root, live_server.url, key, tmp_path).returncode == 0
    assert converged(demo_root, mirror / "agent-a") == {}


def test_sizes_a_host_says_do_not_break_metrics_the_hosts_page_or_the_inbox(client, mirror, settings):
    key = shipping.new_key("agent-a")
    biggest = {"runs": [{"run_id": f"r{n}", "ledger_size": mirrors.MAX_OFFSET} for n in range(20)]}
    assert client.post("/ship/v1/report", json.dumps(biggest), content_type="application/json",
                       **headers(key)).status_code == 200  # fmt: skip
    beyond = {"runs": [{"run_id": "r99", "ledger_size": mirrors.MAX_OFFSET + 1}]}
    assert client.post("/ship/v1/report", json.dumps(beyond), content_type="application/json",
                       **headers(key)).status_code == 400  # fmt: skip
    settings.EVIDENCE_SHIP_STUCK_AFTER_SECONDS = 1
    later = (protocol.utc_now() + dt.timedelta(seconds=5)).isoformat()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RECEIPTS_CLOCK", later)
        assert Client().get("/metrics").status_code == 200
        [facts] = hosts.with_facts(list(Host.objects.all()))
        assert facts.stall.runs_not_arriving == 20 and facts.stall.behind_bytes == 20 * mirrors.MAX_OFFSET
        assert [item.subject for item in inbox.inbox_items(kind=inbox.STALLED)] == ["agent-a"]


@pytest.mark.parametrize("room_checked", [True, False])
def test_a_full_disk_is_a_507_and_the_push_leaves_nothing(room_checked, small_disk, settings, monkeypatch):
    """A 64 KiB tmpfs under the mirror: the server's check of the room refuses the push before a
    byte is written; without that check (the disk filled meanwhile), the write that fails is a
    507 too, and what the push wrote is undone."""
    settings.EVIDENCE_MIRROR_ROOT = small_disk
    if not room_checked:
        monkeypatch.setattr(mirrors, "DISK_MARGIN", -(1 << 30))
    client = Client(raise_request_exception=False)
    key = shipping.new_key("agent-a")
    body = {"run_id": "r1", "items": [file_item("receipts/a.json", b"x" * 40_000),
                                      ledger_item(0, b'{"pad": "' + b"y" * 40_000 + b'"}\n')]}  # fmt: skip
    answer = client.post("/ship/v1/push", json.dumps(body), content_type="application/json", **headers(key))
    assert answer.status_code == 507, answer.content
    assert [path for path in small_disk.rglob("*") if path.is_file() and path.stat().st_size] == []
    assert not ShippedRun.objects.exists()


def test_a_new_run_over_the_hourly_limit_waits_and_the_others_ship_on(
    demo_root, tmp_path, live_server, mirror, settings
):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    settings.EVIDENCE_SHIP_NEW_RUNS_PER_HOUR = ShippedRun.objects.count()  # the limit reached
    new = demo_root / "aaa-new-run"  # listed before the demo's runs
    synthetic_run(new, events=10, receipts=1, contract="d" * 64)
    durable.append_event(demo_root / "clean-run", "note", {"text": "an existing run writes on"})
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0 and "aaa-new-run: waits (429)" in shipped.stderr, shipped.stderr
    assert {k for k in converged(demo_root, mirror / "agent-a") if not k.startswith("aaa-new-run/")} == set()


def test_a_file_whose_chunks_do_not_make_it_is_refused_and_its_part_must_come_again(client, mirror):
    """The last chunk of a file is checked when its part is written, once: a push whose file does
    not match its SHA-256 is refused and its part removed, so the next push must send the file
    again from its first chunk (a host cannot have the server hash a big part over and over)."""
    key = shipping.new_key("agent-a")
    whole = os.urandom(700_000)
    path, size = "tasks/big.json", len(whole)
    first = file_item(path, whole[:400_000], size=size, whole=whole)
    assert push(client, key, {"run_id": "r1", "items": [first]}).status_code == 200
    lying = file_item(path, b"z" * 300_000, offset=400_000, size=size, whole=whole)
    refused = push(client, key, {"run_id": "r1", "items": [lying]})
    assert refused.status_code == 409 and refused.json()["part_size"] == 0
    assert list(mirrors.parts_root().rglob("*.part")) == [] and not (mirror / "agent-a" / "r1" / path).exists()
    again = push(client, key, {"run_id": "r1", "items": [lying]})
    assert again.status_code == 409 and again.json()["part_size"] == 0, "nothing held to hash again"
    assert ShippedRun.objects.get(run_id="r1").mirror_bytes == 0
    assert size <= MAX_JSON_BYTES


def test_reports_spend_the_hosts_bucket_as_pushes_do(client, mirror, settings):
    settings.EVIDENCE_SHIP_PUSHES_PER_MINUTE = 40
    key = shipping.new_key("agent-a")
    body = json.dumps({"runs": [{"run_id": f"r{n}", "ledger_size": n} for n in range(500)]})
    statuses = [client.post("/ship/v1/report", body, content_type="application/json", **headers(key)).status_code
                for _ in range(5)]  # fmt: skip
    assert statuses[:3] == [200, 200, 200] and 429 in statuses  # each costs 11 of 40


def test_a_removal_cut_short_is_put_back_whatever_the_run_id(tmp_path):
    root = tmp_path / "runs"
    run_dir = root / "-nightly"
    run_dir.mkdir(parents=True)
    (run_dir / "steer.json").write_text("{}")
    assert protocol.valid_run_id("-nightly") and discover_runs(root).names == ["-nightly"]
    os.replace(run_dir, root / ".-nightly.removing-4242")  # killed before the dashboard confirmed
    shipper = shipper_module.Shipper(root, "http://127.0.0.1:9", "cph_x", state_path=tmp_path / "state.sqlite3")
    try:
        shipper._put_back_interrupted_removals(shipper_module.PassReport())
    finally:
        shipper.state.close()
        shipper._lock.close()
    assert run_dir.is_dir() and os.listdir(root) == ["-nightly"]


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("report", '{"runs": [{"run_id": "r1", "problem": "\\ud800 a lone surrogate"}]}'),
        ("acks", '[{"id": "decision-1", "outcome": "failed", "detail": "\\udcff"}]'),
        ("push", '{"run_id": "r1", "items": [], "x": "\\ud800"}'),
    ],
)
def test_a_lone_surrogate_in_a_body_is_a_400(endpoint, body, client, mirror):
    key = shipping.new_key("agent-a")
    answer = client.post(f"/ship/v1/{endpoint}", body, content_type="application/json", **headers(key))
    assert answer.status_code == 400 and "lone surrogate" in answer.json()["error"]


def test_a_run_of_many_files_that_cannot_be_sent_says_a_few_and_counts_the_rest(
    demo_root, tmp_path, live_server, mirror
):
    key = shipped_demo(demo_root, tmp_path, live_server.url)
    for number in range(60):
        (demo_root / "clean-run" / "tasks" / f"link-{number:02d}.json").symlink_to("/etc/passwd")
    shipped = ship(demo_root, live_server.url, key, tmp_path)
    assert shipped.returncode == 0 and shipped.stderr.count("is a symlink or not a file") == 20
    assert ShippedRun.objects.get(run_id="clean-run").problem.endswith("; and 55 more")


def test_host_move_takes_the_old_names_parts_with_it(client, mirror):
    key = shipping.new_key("box-1")
    whole = os.urandom(600_000)
    first = file_item("tasks/big.json", whole[:400_000], size=len(whole), whole=whole)
    assert push(client, key, {"run_id": "r1", "items": [first]}).status_code == 200
    assert client.post("/ship/v1/stopped", "{}", content_type="application/json", **headers(key)).status_code == 200
    hosts.move(old="box-1", new="box-2", reason="renamed", actor="a test")
    new_key = shipping.new_key("box-2")
    rest = file_item("tasks/big.json", whole[400_000:], offset=400_000, size=len(whole), whole=whole)
    assert push(client, new_key, {"run_id": "r1", "items": [rest]}).status_code == 200, "its part came along"
    assert (mirror / "box-2" / "r1" / "tasks" / "big.json").read_bytes() == whole
    assert ShippedRun.objects.get(run_id="r1").mirror_bytes == len(whole)
