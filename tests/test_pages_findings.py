"""The findings page and the stale reservations and calls."""

from __future__ import annotations

import json

import pytest

from tests.helpers import content, first_call_of

pytestmark = pytest.mark.django_db


def test_findings_page_puts_digest_mismatches_first_with_both_values(logged_in, demo):
    page = content(logged_in.get("/findings/"))
    assert page.index("Digest mismatches") < page.index("Every other finding")
    digest_section = page[page.index("Digest mismatches") : page.index("Every other finding")]
    assert "identity_mismatch" in digest_section and "input_digest_mismatch" in digest_section
    call = first_call_of("tampered-receipt")
    assert call.recomputed_call_id in digest_section and call.declared_call_id in digest_section
    assert "stale_reservation" not in digest_section


def test_findings_filters_and_download(logged_in, demo):
    page = content(logged_in.get("/findings/?code=stale_call"))
    assert "send-message-killed" in page and "tampered-receipt</a>" not in page
    items = json.loads(content(logged_in.get("/findings/?run=conflict-same-id&format=json")))["items"]
    assert {item["code"] for item in items} == {"submission_conflict"}


def test_reservations_page_is_read_only_and_says_what_a_resume_would_do(logged_in, demo):
    page = content(logged_in.get("/reservations/"))
    assert "stale-submission" in page and "adopts the task file" in page
    assert '<form method="post"' not in page.split("</header>")[1]
    items = json.loads(content(logged_in.get("/reservations/?format=json")))["items"]
    assert {item["kind"] for item in items} == {"reservation", "call"}
