"""Decisions travel back (evidence.ingest.delivery): settled where the run's host is not, a decision
waits in the database, is followed by the rows and by re-imports, and is written into the run
directory by the run's own host, once, or refused there with a finding."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.db import connection

from evidence.ingest import delivery, importer, storing
from evidence.lib import hosts
from evidence.models import Call, Confirmation, Finding, Host, HumanDecision, Run
from evidence.review import inbox, selectors, settle
from receipts import protocol, runtime
from tests.helpers import CONTRACT, content, every_entry, first_call_of, join
from tests.ledger import events_of
from tests.subprocess_db import child_env, database_url_for_children, manage_command, this_database_url
from tests.writer import cli_call, outbox_lines

pytestmark = pytest.mark.django_db


@pytest.fixture
def confirmer(django_user_model):
    return join(django_user_model.objects.create_user("dana", password="a-long-password-1"), "confirmer")


def owner_of(call: Call):
    host = call.run.host
    assert host is not None
    return host


def settle_elsewhere(settings, call: Call, user, resolution: str = "committed") -> HumanDecision:
    """Settle as a web process on another machine than the run's host would."""
    owner = settings.EVIDENCE_HOST_NAME
    settings.EVIDENCE_HOST_NAME = "web-host"
    try:
        settlement = settle.settle_call(run=call.run, call=call, user=user, resolution=resolution,
                                        reason="the mail log shows it", typed_call_id=call.call_id[:12],
                                        receipt_sha256=call.file_sha256)  # fmt: skip
    finally:
        settings.EVIDENCE_HOST_NAME = owner
    return settlement.decision


def test_a_decision_made_away_from_the_runs_host_waits_and_its_host_writes_it_once(demo, settings, confirmer, client):
    call = first_call_of("send-message-killed")
    run_dir = Path(call.run.path)
    decision = settle_elsewhere(settings, call, confirmer)
    assert decision.pending and not (run_dir / "confirmations" / f"{call.call_id}.json").exists()
    assert not Call.objects.get(pk=call.pk).in_doubt, "the rows follow the decision at once"
    assert ("send-message-killed", call.call_id) not in {(i.run_id, i.subject) for i in inbox.inbox_items()}
    client.force_login(confirmer)
    page = content(client.get(f"/runs/send-message-killed/calls/{call.call_id}/"))
    assert "waiting for host" in page and hosts.this_host_name() in page

    # The run changes before its host delivers: the re-import keeps following the decision.
    (run_dir / "notes.txt").write_text("a file the writer does not own")
    importer.run_import(path=run_dir, force=True)
    assert Call.objects.get(pk=call.pk).decision == "reuse"

    host = Run.objects.get(run_id="send-message-killed").host
    assert host is not None
    assert delivery.deliver_pending(host=host) == delivery.DeliveryReport(delivered=1)
    decision.refresh_from_db()
    assert decision.delivered_at is not None and decision.delivered_by == host.name and not decision.pending
    assert len(events_of(run_dir, "confirmation")) == 1
    assert delivery.deliver_pending(host=host) == delivery.DeliveryReport(), "nothing left to deliver"
    assert Confirmation.objects.filter(run=call.run, call_id=call.call_id, valid=True).count() == 1
    assert "Delivered to host" in content(client.get(f"/runs/send-message-killed/calls/{call.call_id}/"))

    resumed = cli_call(run_dir, "send_message", call.args, attempt=call.attempt)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["reused"] is True
    assert len(outbox_lines(run_dir)) == 1


def test_a_delivery_is_dated_by_the_database_not_by_the_hosts_clock(demo, settings, confirmer, monkeypatch):
    call = first_call_of("send-message-killed")
    decision = settle_elsewhere(settings, call, confirmer)
    real_now = dt.datetime.now(dt.UTC)
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(real_now + dt.timedelta(hours=1)))  # the host's
    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(delivered=1)
    decision.refresh_from_db()
    assert decision.delivered_at is not None
    assert abs((decision.delivered_at - real_now).total_seconds()) < 60, decision.delivered_at


def test_a_decision_the_run_directory_refuses_is_never_written_and_the_call_is_in_doubt_again(
    demo, settings, confirmer
):
    call = first_call_of("send-message-killed")
    run_dir = Path(call.run.path)
    decision = settle_elsewhere(settings, call, confirmer)
    receipt = run_dir / "receipts" / f"{call.call_id}.json"
    receipt.write_bytes(receipt.read_bytes() + b"\n")  # the receipt is not what the person saw any more
    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(refused=1)
    decision.refresh_from_db()
    assert decision.undeliverable.startswith("the receipt changed") and decision.delivered_at is None
    assert not (run_dir / "confirmations" / f"{call.call_id}.json").exists()
    assert Call.objects.get(pk=call.pk).in_doubt
    finding = Finding.objects.get(run=call.run, code="decision_undeliverable", closed_at__isnull=True)
    assert finding.call_id == call.call_id and "dana" in finding.detail
    importer.run_import(path=run_dir)
    assert Call.objects.get(pk=call.pk).in_doubt, "a refused decision is not followed by a re-import"
    assert Finding.objects.filter(pk=finding.pk, closed_at__isnull=True).exists(), "it stays until a person looks"
    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(), "it is not tried again"


def test_a_decision_refused_because_another_stood_shows_who_settled_it_and_is_an_inbox_item(
    demo, settings, confirmer, client
):
    call = first_call_of("send-message-killed")
    run_dir = Path(call.run.path)
    decision = settle_elsewhere(settings, call, confirmer, resolution="committed")
    # Meanwhile, at the host, someone settles it the other way with the writer's command line.
    runtime.confirm_call(run_dir, call.call_id, resolution="rejected", reason="the relay bounced it",
                         actor="ops-cli", receipt_sha256=call.file_sha256)  # fmt: skip
    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(refused=1)
    importer.run_import(path=run_dir)
    decision.refresh_from_db()
    assert decision.undeliverable.startswith("the run directory already holds another decision: ops-cli")

    [row] = [row for row in selectors.run_calls(run=call.run) if row.call_id == call.call_id]
    settled_by = getattr(row, "settled_by")  # noqa: B009 - run_calls annotates it
    assert settled_by == "ops-cli", "the decision that stood settled it, not the refused one"
    client.force_login(confirmer)
    page = content(client.get(f"/runs/send-message-killed/calls/{call.call_id}/"))
    lead = page.split('class="lead state-line">', 1)[1].split("</p>", 1)[0]
    assert 'by <span translate="no">ops-cli</span>' in lead and "dana" not in lead, lead
    assert "ops-cli decided at" in page and "with the writer's command line" in page
    assert "A decision the run directory refused" in page and "never written into the run directory" in page
    assert "in doubt again" not in page, "the call is settled: nothing is asked of anyone"
    audit = content(client.get("/audit/"))
    audit_row = audit[audit.index(f'id="decision-{decision.pk}"') :]
    audit_row = audit_row[: audit_row.index("</tr>")]
    assert "refused: never written into the run directory" in audit_row, "never as if the refused one stood"

    [item] = [i for i in inbox.inbox_items() if i.kind == inbox.REFUSED]
    assert (item.run_id, item.subject) == ("send-message-killed", f"decision/{call.call_id}")
    assert "dana" in item.detail and item.action == "finding"
    listed = content(client.get("/inbox/?kind=refused+decision"))
    assert "send-message-killed" in listed and "refused decision" in listed


def test_a_run_directory_that_cannot_be_written_now_is_tried_again_at_the_next_pass(demo, settings, confirmer):
    call = first_call_of("send-message-killed")
    run_dir = Path(call.run.path)
    decision = settle_elsewhere(settings, call, confirmer)
    folder = run_dir / "confirmations"
    folder.rmdir()
    folder.write_text("not a folder")  # the writer never writes through what is not its folder
    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(failed=1)
    decision.refresh_from_db()
    assert decision.pending and decision.delivery_error
    folder.unlink()
    folder.mkdir()
    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(delivered=1)


def test_on_the_runs_own_host_settling_writes_at_once_as_before(demo, confirmer):
    call = first_call_of("send-message-killed")
    settled = settle.settle_call(run=call.run, call=call, user=confirmer, resolution="rejected", reason="bounced",
                                 typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256,
                                 confirm_against_evidence=True)  # fmt: skip
    decision = HumanDecision.objects.get(pk=settled.decision.pk)
    assert decision.delivered_at is not None and decision.delivered_by == hosts.this_host_name()
    assert (Path(call.run.path) / "confirmations" / f"{call.call_id}.json").exists()


def test_another_hosts_copy_of_a_run_is_not_imported(demo, settings):
    run = Run.objects.get(run_id="clean-run")
    owner = settings.EVIDENCE_HOST_NAME
    settings.EVIDENCE_HOST_NAME = "host-b"
    report = importer.root_import(root=Path(run.path).parent)
    assert "clean-run" not in {r.run_id for r in report.runs if r.changed}
    [finding] = [f for f in report.root_findings if f["code"] == "duplicate_run_id" and f["subject"] == "clean-run"]
    assert "on host" in finding["detail"]
    assert Run.objects.filter(pk=run.pk, host__name=owner).exists()


@pytest.mark.django_db(transaction=True)
def test_a_delivery_killed_between_the_file_and_its_event_is_delivered_once_by_the_next_pass(
    demo_root, settings, tmp_path
):
    """A real shipper (import_runs) ended at the writer's failpoint mid-delivery, then run again."""
    url = database_url_for_children(tmp_path)
    root = demo_root
    subprocess.run(manage_command("import_runs", str(root)), env=child_env(url), check=True, capture_output=True)
    env = child_env(url) | {"EVIDENCE_HOST_NAME": "web-host"}
    settle_script = (
        "from django.contrib.auth import get_user_model; from evidence.review import settle;"
        "from evidence.lib.roles import ensure_roles; from evidence.models import Call;"
        "user = get_user_model().objects.create_user('erin');"
        "user.groups.add(ensure_roles()['confirmer']);"
        "call = Call.objects.get(run__run_id='send-message-killed');"
        "settle.settle_call(run=call.run, call=call, user=user, resolution='committed', reason='seen',"
        " typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)"
    )
    subprocess.run(manage_command("shell", "-v", "0", "-c", settle_script), env=env, check=True, capture_output=True)
    killed = subprocess.run(manage_command("import_runs", str(root)), capture_output=True, check=False,
                            env=child_env(url) | {"RECEIPTS_FAILPOINT": "after_confirmation_file"})  # fmt: skip
    assert killed.returncode == 137
    run_dir = root / "send-message-killed"
    assert list((run_dir / "confirmations").iterdir()) and events_of(run_dir, "confirmation") == []
    again = subprocess.run(manage_command("import_runs", str(root)), env=child_env(url), capture_output=True)
    assert again.returncode == 0, again.stderr
    assert "1 delivered" in again.stderr.decode()
    [event] = events_of(run_dir, "confirmation")
    assert event["recovered"] is True
    delivered = subprocess.run(
        manage_command("shell", "-v", "0", "-c", "from evidence.models import HumanDecision as D; "
                       "print([(d.delivered_at is not None, d.delivered_by) for d in D.objects.all()])"),
        env=child_env(url), capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert delivered == f"[(True, '{settings.EVIDENCE_HOST_NAME}')]"


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_decision_is_delivered_beside_a_pass_that_waits_on_another_run(demo_root, settings, confirmer):
    """A pass held as long as we like (the test holds one run's import lock, as a long import of
    that run would): the decision about another run is written meanwhile, and the host that
    works is not silent."""
    url = this_database_url()
    env = child_env(url) | {"EVIDENCE_HOST_NAME": "busy", "EVIDENCE_HOST_SILENT_AFTER_SECONDS": "3"}
    watch = subprocess.Popen(manage_command("import_runs", str(demo_root), "--watch", "--interval", "0.2"),
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not Run.objects.filter(run_id="send-message-killed", host__name="busy").exists():
            assert time.monotonic() < deadline and watch.poll() is None, "the first pass never ended"
            time.sleep(0.2)
        with storing.run_import_lock("arrives-later"):
            writer_run(demo_root / "arrives-later")
            deadline = time.monotonic() + 60
            while not waiting_for_an_advisory_lock():
                assert time.monotonic() < deadline and watch.poll() is None, "the pass never reached the run"
                time.sleep(0.1)
            call = first_call_of("send-message-killed")
            settle_elsewhere(settings, call, confirmer)
            confirmation = Path(call.run.path) / "confirmations" / f"{call.call_id}.json"
            deadline = time.monotonic() + 30
            while not confirmation.exists():
                assert time.monotonic() < deadline, "the decision waited behind the pass"
                time.sleep(0.1)
            time.sleep(3.5)  # past the silence limit, the pass still held
            assert waiting_for_an_advisory_lock(), "the pass is still waiting"
            assert hosts.state_of(Host.objects.get(name="busy")) == hosts.SHIPPING, "working is not silent"
        deadline = time.monotonic() + 60
        while not Run.objects.filter(run_id="arrives-later").exists():
            assert time.monotonic() < deadline, "the pass never went on"
            time.sleep(0.2)
    finally:
        watch.send_signal(signal.SIGTERM)
        _, said = watch.communicate(timeout=60)
    assert watch.returncode == 0, said
    assert "decisions beside the pass: 1 delivered" in said, said


def writer_run(run_dir: Path) -> None:
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    runtime.Executor(run_dir).call("write_file", {"path": "out.txt", "content": "later"})


def waiting_for_an_advisory_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize("target", ["an empty folder", "a copy of the run"])
def test_a_run_directory_swapped_for_a_symlink_is_refused_before_anything_is_made_in_its_target(
    demo, settings, confirmer, tmp_path, target
):
    """Whoever holds the runs root swaps the run directory for a symlink: the host's delivery
    makes nothing where it points (no .writer/, no lock, no confirmation, not even in a copy of
    the run that would take it), and the decision is refused as any other, with its finding."""
    call = first_call_of("send-message-killed")
    run_dir = Path(call.run.path)
    decision = settle_elsewhere(settings, call, confirmer)
    elsewhere = tmp_path / "elsewhere"
    if target == "an empty folder":
        elsewhere.mkdir()
    else:
        shutil.copytree(run_dir, elsewhere, symlinks=True)
    run_dir.rename(tmp_path / "the-real-run")
    run_dir.symlink_to(elsewhere, target_is_directory=True)
    before = every_entry(elsewhere)

    assert delivery.deliver_pending(host=owner_of(call)) == delivery.DeliveryReport(refused=1)
    assert every_entry(elsewhere) == before, "nothing made, nothing written where the symlink points"
    decision.refresh_from_db()
    assert "symlink" in decision.undeliverable and decision.delivered_at is None
    assert Call.objects.get(pk=call.pk).in_doubt, "the call is in doubt again"
    finding = Finding.objects.get(run=call.run, code="decision_undeliverable", closed_at__isnull=True)
    assert "symlink" in finding.detail and "dana" in finding.detail
