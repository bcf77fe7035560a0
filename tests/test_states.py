"""One table of states (receipts/states.py, issue 37): every page, the API, the downloads and the
exports show a call, and an inbox item about one, as one of its states, each drawn as the table
says (its tone, its own glyph, its word in the reader's language). A page that shows a state
outside the table, or draws one otherwise, fails here."""

from __future__ import annotations

import json
import re
from http import HTTPStatus

import pytest
from django.urls import reverse

from evidence.models import Call, Run
from evidence.review import inbox
from receipts import recovery, runtime, states
from tests.helpers import content, downloaded, import_as_seen_later, join
from tests.test_i18n import every_page_in_every_state
from tests.test_rules import CONTRACT, _disputed

pytestmark = pytest.mark.django_db

BADGE = re.compile(
    r'<span data-value="([^"]*)" data-state="([^"]*)" class="badge badge-([a-z]+) state">'
    r'<span class="glyph" aria-hidden="true">([^<]*)</span>([^<]*)</span>'
)
LANGUAGES = {"en": "en", "zh-hans": "zh-Hans"}


@pytest.fixture
def every_state(demo_root, client, django_user_model):
    """The demo runs and a run with a call of each state the demo lacks: a commit its target does
    not show (disputed), a call its tool refused (rejected), one a person settles as not done."""
    odd = demo_root / "odd-states"
    runtime.run_init(odd, contract_sha256=CONTRACT)
    _disputed(odd)
    refused = runtime.Executor(odd).call("write_file", {"path": "../outside.txt", "content": "x"}, attempt=1)
    assert refused.status == "rejected"
    import_as_seen_later(demo_root)
    ada = django_user_model.objects.create_user("ada", password="a-long-password-1")
    client.force_login(join(ada, "admin", "confirmer", "exporter"))
    return client


def settle_one_as_not_done(client) -> None:
    call = Call.objects.get(run__run_id="send-message-killed")
    form = {"confirm_call_id": call.call_id[:12], "receipt_sha256": call.file_sha256}
    form |= {"resolution": "rejected", "reason": "the relay has no such message"}
    form |= {"confirm_against_evidence": "on"}  # its outbox shows the message: "did not happen" asks twice
    assert client.post(reverse("confirm", args=["send-message-killed", call.call_id]), form).status_code == 303


def test_every_state_a_page_shows_is_the_tables_drawn_as_the_table_says(every_state):
    client = every_state
    urls = every_page_in_every_state(client)  # settles a call as done, triages findings
    settle_one_as_not_done(client)
    seen: dict[str, set[str]] = {}
    for language, table_language in LANGUAGES.items():
        client.cookies["callproof_language"] = language
        for url in urls:
            response = client.get(url)
            assert response.status_code in (HTTPStatus.OK, HTTPStatus.NOT_FOUND, HTTPStatus.BAD_REQUEST), url
            page = content(response)
            badges = BADGE.findall(page)
            assert len(badges) == page.count("data-state="), f"{url}: a state drawn another way"
            for value, name, tone, glyph, word in badges:
                assert name in states.STATES, f"{url} shows {name!r}, a state outside the table"
                state = states.STATES[name]
                assert (value, glyph, word) == (name, state.glyph, state.word(table_language)), url
                assert tone == state.tone or (tone == "neutral" and state.tone == "ok"), url  # unproven: never green
                seen.setdefault(name, set()).add(url)
    assert set(seen) == set(states.STATES), f"a state no page showed: {set(states.STATES) - set(seen)}"


def test_the_api_the_downloads_and_the_inbox_say_only_the_tables_states(every_state):
    client = every_state
    call_states = set(states.STATES) - {states.CONFLICT, states.STALE}
    shown = set()
    for run in Run.objects.all():
        body = client.get(f"/api/runs/{run.run_id}/calls").json()
        shown |= {item["status"] for item in body["items"]}
        download = json.loads(
            downloaded(client.get(reverse("run", args=[run.run_id]), {"list": "calls", "format": "json"}))
        )
        shown |= {row["status"] for row in download["items"]}
    assert shown <= call_states and {"in doubt", "disputed", "tampered", "rejected", "committed"} <= shown
    kinds = {item.state for item in inbox.inbox_items() if item.state}
    assert kinds <= set(states.STATES) and {"in doubt", "disputed", "tampered"} <= kinds


def test_every_call_the_rule_can_meet_shows_as_one_of_the_tables_states():
    receipt_words = ("committed", "rejected", "prepared", "unknown", "failed", "no such status", "")
    for present in (True, False):
        for status in receipt_words:
            for verification in ("verified", "mismatch", "unverifiable", "disputed", ""):
                for decision in ("reuse", "retry", "stop", "confirm", "query", ""):
                    shown = recovery.shown_status(
                        present=present, status=status, verification=verification, decision=decision
                    )
                    assert shown in states.STATES, (present, status, verification, decision, shown)


def test_each_state_says_what_to_do_in_each_language_and_the_catalogue_agrees():
    from django.utils import translation

    from evidence.words import i18n

    for name, state in states.STATES.items():
        assert state.to_do("en") and state.to_do("zh-Hans") and state.to_do("en") != state.to_do("zh-Hans"), name
        with translation.override("zh-hans"):
            assert i18n.word(name) == state.word("zh-Hans"), name
