"""Issue 55, case 4: a host's key alone can show a decision nobody made.

A confirmation its host wrote (the writer's ``confirm`` command, the runtime API) settles the
call for the runtime whatever name it gives. The dashboard says what it is: made on host X by
the name Y, not a dashboard account; an audit entry says so once, and unless the run is signed
with a key the server trusts, an inbox item waits for a person to acknowledge it. A decision
made on the dashboard and written back is none of these.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import reverse

from evidence.ingest import importer
from evidence.models import AuditEntry, Call, Confirmation, Finding, Run
from evidence.review import inbox, triage
from receipts import protocol, runtime, signing
from receipts.demo import run_writer
from tests.helpers import CONTRACT, content, first_call_of, join
from tests.writer import MESSAGE, cli_call, only_receipt, receipt_path

pytestmark = pytest.mark.django_db

RUN = "send-message-killed"
ON_HOST = "(the name its file gives, not a dashboard account)"


@pytest.fixture
def carol(django_user_model):
    """A dashboard account named carol, who settles calls: the name a host's file borrows."""
    return join(django_user_model.objects.create_user("carol", password="a-long-password-1"), "confirmer", "admin")


def lead_of(page: str) -> str:
    start = page.index('class="lead state-line">')
    return page[start : page.index("</p>", start)]


def confirm_on_the_host(run_dir: Path, call: Call, *, actor: str = "carol", resolution: str = "committed") -> None:
    """What anyone who can write the run directory can do: the writer's own command line."""
    written = run_writer(
        "confirm", str(run_dir), call.call_id, "--resolution", resolution, "--reason", "the relay's log shows it",
        "--actor", actor, "--receipt-sha256", call.file_sha256,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    assert json.loads(written.stdout)["written"] is True


def host_items() -> list[inbox.InboxItem]:
    return inbox.inbox_items(kind=inbox.HOST_DECISION)


def test_a_confirmation_written_on_the_host_is_the_hosts_word_said_once_and_an_inbox_item(demo, client, carol):
    call = first_call_of(RUN)
    run_dir = demo / RUN
    host_run = Run.objects.get(run_id=RUN)
    host = host_run.host
    assert host is not None
    confirm_on_the_host(run_dir, call)
    importer.run_import(path=run_dir)

    # The page first: it said "settled: committed by carol", as if carol had decided it here.
    client.force_login(carol)
    page = content(client.get(reverse("call", args=[RUN, call.call_id])))
    lead = lead_of(page)
    assert f'on host <code translate="no">{host.name}</code> by <span translate="no">carol</span> {ON_HOST}' in lead
    confirmation = Confirmation.objects.get(run__run_id=RUN, call_id=call.call_id)
    assert confirmation.valid and confirmation.made_on_host == host.name
    # The runtime follows the file: the call is settled, as the host's word (nothing waits for anyone).
    assert not Call.objects.get(pk=call.pk).in_doubt
    assert "Settled by a person" not in page and "Settled on host" in page
    assert "which is not a dashboard account" in page and "An inbox item waits for a person" in page
    run_page = content(client.get(reverse("run", args=[RUN])))
    assert ON_HOST in run_page[run_page.index('id="calls"') : run_page.index('id="submissions"')]

    [listed] = content_of_api(client, f"/api/runs/{RUN}/calls")
    assert (listed["status"], listed["settled_by"], listed["settled_on_host"]) == (
        "settled: committed",
        "carol",
        host.name,
    )
    run_counts = client.get(f"/api/runs/{RUN}").json()
    assert run_counts["in_doubt"] == 0 and run_counts["open_findings"] >= 1

    [entry] = AuditEntry.objects.filter(action=AuditEntry.DECISION_MADE_ON_HOST)
    assert (entry.run_id, entry.subject, entry.actor) == (host_run.pk, call.call_id, "import")
    assert entry.reason.endswith(confirmation.confirmation_id) and f"on host {host.name}" in entry.reason
    assert f'href="/audit/?run={RUN}#action-{entry.pk}"' in page
    audit = content(client.get("/audit/"))
    assert f'id="action-{entry.pk}"' in audit and "a call settled on its host, not on the dashboard" in audit
    [item] = host_items()
    assert (item.run_id, item.severity, item.code) == (RUN, "warning", "decision_made_on_host")
    assert "not a dashboard account" in item.detail and item.finding_id is not None

    # Imported again, forced or after a change: one entry, one item, however many imports.
    importer.run_import(path=run_dir, force=True)
    (run_dir / "state.json").touch()
    importer.run_import(path=run_dir)
    assert AuditEntry.objects.filter(action=AuditEntry.DECISION_MADE_ON_HOST).count() == 1
    assert Finding.objects.filter(code="decision_made_on_host").count() == 1

    # A person acknowledges it: it leaves the open inbox, and no import brings it back.
    finding = Finding.objects.get(code="decision_made_on_host")
    triage.act(finding=finding, user=carol, action=triage.ACKNOWLEDGE, reason="ops settled it at the host",
               now=protocol.utc_now())  # fmt: skip
    assert host_items() == []
    importer.run_import(path=run_dir, force=True)
    assert host_items() == [] and AuditEntry.objects.filter(action=AuditEntry.DECISION_MADE_ON_HOST).count() == 1
    page = content(client.get(reverse("call", args=[RUN, call.call_id])))
    assert "ops settled it at the host" in page and "An inbox item waits for a person" not in page


def content_of_api(client, url: str) -> list[dict]:
    response = client.get(url)
    assert response.status_code == 200, response.content
    return response.json()["items"]


def test_a_decision_made_on_the_dashboard_and_written_back_is_no_hosts_word(demo, client, carol):
    call = first_call_of(RUN)
    client.force_login(carol)
    form = {"resolution": "committed", "reason": "the mail server's log shows the message",
            "confirm_call_id": call.call_id[:12], "receipt_sha256": call.file_sha256}  # fmt: skip
    assert client.post(reverse("confirm", args=[RUN, call.call_id]), form).status_code == 303
    importer.run_import(path=demo / RUN, force=True)  # the file read back, as the next pass reads it

    assert Confirmation.objects.get(run__run_id=RUN, call_id=call.call_id).made_on_host == ""
    page = content(client.get(reverse("call", args=[RUN, call.call_id])))
    assert "Settled by a person" in page and ON_HOST not in page and 'by <span translate="no">carol</span>' in page
    [item] = content_of_api(client, f"/api/runs/{RUN}/calls")
    assert (item["settled_by"], item["settled_on_host"]) == ("carol", "")
    assert not AuditEntry.objects.filter(action=AuditEntry.DECISION_MADE_ON_HOST).exists()
    assert host_items() == []


def test_another_decision_on_the_host_than_the_dashboards_is_the_hosts_word(demo, client, carol):
    """The dashboard decided one way; the host's file says the other and stands: it is the host's."""
    call = first_call_of(RUN)
    run_dir = demo / RUN
    confirm_on_the_host(run_dir, call, actor="ops-cli", resolution="rejected")
    importer.run_import(path=run_dir)
    [item] = host_items()
    assert item.subject.startswith(f"confirmations/{call.call_id}.json#")
    client.force_login(carol)
    lead = lead_of(content(client.get(reverse("call", args=[RUN, call.call_id]))))
    assert 'by <span translate="no">ops-cli</span>' in lead and ON_HOST in lead


def test_in_a_run_signed_with_a_trusted_key_it_is_audited_but_asks_nobody(
    tmp_path, key_file, settings, monkeypatch, client, carol
):
    monkeypatch.setenv(signing.KEY_ENV, str(key_file))
    run_dir = tmp_path / "signed-run"
    runtime.run_init(run_dir, contract_sha256=CONTRACT)
    assert cli_call(run_dir, "send_message", MESSAGE, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    call_id = only_receipt(run_dir)
    receipt_sha = protocol.sha256_hex(receipt_path(run_dir, call_id).read_bytes())
    # The runtime API, with the run's key: a signed confirmation, by a name.
    runtime.confirm_call(run_dir, call_id, resolution="committed", reason="the mail log shows it", actor="carol",
                         receipt_sha256=receipt_sha)  # fmt: skip
    settings.EVIDENCE_SIGNING_KEY_FILES = [str(key_file)]
    importer.run_import(path=run_dir)

    confirmation = Confirmation.objects.get(call_id=call_id)
    assert confirmation.valid and confirmation.made_on_host
    assert AuditEntry.objects.filter(action=AuditEntry.DECISION_MADE_ON_HOST, subject=call_id).count() == 1
    assert host_items() == [] and not Finding.objects.filter(code="decision_made_on_host").exists()
    client.force_login(carol)
    page = content(client.get(reverse("call", args=[run_dir.name, call_id])))
    assert ON_HOST in lead_of(page) and "signed with a key this server trusts" in page


def test_the_call_page_says_it_in_chinese(demo, chinese):
    call = first_call_of(RUN)
    confirm_on_the_host(demo / RUN, call)
    importer.run_import(path=demo / RUN)
    page = content(chinese.get(reverse("call", args=[RUN, call.call_id])))
    lead = lead_of(page)
    assert ON_HOST not in lead and "not a dashboard account" not in page
    assert "并非仪表盘账户" in lead and 'translate="no">carol</span>' in lead
