"""What a client can put in a request is a 400 that says why, never a 500, on both databases:
a NUL anywhere in the address, a page cursor of the wrong kind for its column, a Host the site
does not serve."""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client

from tests.helpers import join

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("reader"), "viewer"))
    return client


def cursor(*values) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "url",
    [
        "/runs/clean%00run/", "/search/?q=a%00b", "/findings/?code=%00", "/audit/?actor=x%00y",
        "/?page=after.0.%00", "/api/runs/clean%00run", "/api/audit?actor=%00", "/api/findings?run_id=a%00",
    ],
)  # fmt: skip
def test_a_nul_anywhere_in_the_address_is_a_400(viewer, demo, url):
    response = viewer.get(url)
    assert response.status_code == 400, url
    if url.startswith("/api/"):
        assert "NUL" in response.json()["detail"]


@pytest.mark.parametrize(
    "url",
    [
        f"/runs/clean-run/?page=after.0.{cursor('not a number')}",
        f"/runs/clean-run/?page=before.0.{cursor(2**64)}",
        f"/api/findings?cursor=after.0.{cursor('not a number')}",
        f"/api/findings?cursor=after.0.{cursor(2**70)}",
        f"/api/runs?cursor=after.0.{cursor(17)}",
        f"/api/runs?cursor=after.0.{cursor('a' + chr(0))}",
        # times with no UTC form Python can hold: a 500 on both databases before (issue 36)
        f"/?page=after.0.{cursor('0001-01-01T00:00:00+14:00', 'clean-run')}",
        f"/?page=before.0.{cursor('9999-12-31T23:59:59-14:00', 'clean-run')}",
        f"/api/runs?cursor=after.0.{cursor('9999-12-31T23:59:59-14:00', 'clean-run')}",
    ],
)
def test_a_cursor_of_the_wrong_kind_for_its_column_is_a_400(viewer, demo, url):
    response = viewer.get(url)
    assert response.status_code == 400, url
    if url.startswith("/api/"):
        assert "cursor" in response.json()["detail"]


def test_a_host_the_site_does_not_serve_is_a_400_page(demo):
    client = Client(raise_request_exception=False)
    response = client.get("/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    api = client.get("/api/runs", HTTP_HOST="evil.example")
    assert api.status_code == 400


def test_a_refusal_is_in_the_readers_language_on_the_page_and_english_in_the_api(viewer, demo):
    """The page says it in Chinese with what was sent and what is allowed as code (data); the
    API speaks English to programs, whatever the browser asks for."""
    chinese = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}
    page = viewer.get("/findings/?severity=loud", **chinese).content.decode()
    assert "<code>severity=&#x27;loud&#x27;</code> 不是以下之一：<code>error, warning</code>" in page
    nul = viewer.get("/findings/?code=%00", **chinese).content.decode()
    assert "地址中不允许出现 <code>U+0000 (NUL)</code> 字符" in nul
    api = viewer.get("/api/findings?severity=loud", **chinese)
    assert api.status_code == 400 and api.json()["detail"] == "severity='loud' is not one of: error, warning"
    assert "NUL" in viewer.get("/api/audit?actor=%00", **chinese).json()["detail"]
    # A page cursor no page made: the same two voices.
    forged = viewer.get("/findings/?page=sideways.0.x", **chinese).content.decode()
    assert "<code>page=&#x27;sideways.0.x&#x27;</code> 不是此列表中的一页" in forged
    detail = viewer.get("/api/findings?cursor=after.0.x", **chinese).json()["detail"]
    assert detail == "the page cursor is not one this site made"


def test_the_nul_refusal_speaks_this_requests_language_not_the_previous_ones(viewer, demo):
    """Translations are activated per thread: a refusal made before LocaleMiddleware ran would
    speak whatever language the thread's previous request had asked for."""
    english, chinese = {"HTTP_ACCEPT_LANGUAGE": "en"}, {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}
    assert "地址中不允许出现" in viewer.get("/findings/?code=%00", **chinese).content.decode()
    after_chinese = viewer.get("/findings/?code=%00", **english).content.decode()
    assert "a <code>U+0000 (NUL)</code> character is not allowed in the address" in after_chinese
    assert "地址" not in after_chinese
    viewer.get("/findings/", **english)
    assert "地址中不允许出现" in viewer.get("/search/?q=a%00b", **chinese).content.decode()
