"""The read-only JSON API: the same reads as the pages, paged by key, for a session or a token
that may browse, described by OpenAPI."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from evidence.models import ApiToken, Call, Finding, Run
from evidence.web.api import new_token
from tests.helpers import CONTRACT, import_as_seen_later, join
from tests.volume import synthetic_run

ENDPOINTS = ["/api/runs", "/api/runs/clean-run", "/api/runs/clean-run/calls", "/api/runs/clean-run/events",
             "/api/runs/clean-run/submissions", "/api/runs/clean-run/decisions", "/api/findings",
             "/api/reservations", "/api/inbox", "/api/audit", "/api/audit/actions", "/api/retention",
             "/api/hosts"]  # fmt: skip


def token_for(user, name: str = "script") -> str:
    out = StringIO()
    call_command("api_token", user.username, "--name", name, stdout=out)
    return out.getvalue().strip()


@pytest.mark.parametrize("who", ["anonymous", "no role", "viewer", "viewer by token", "bad token", "no role by token"])
def test_every_endpoint_answers_only_a_login_that_may_browse(who, demo, client, django_user_model):
    headers = {}
    user = django_user_model.objects.create_user("someone")
    if who.startswith("viewer"):
        join(user, "viewer")
    if who.endswith("by token"):
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token_for(user)}"
    elif who == "bad token":
        headers["HTTP_AUTHORIZATION"] = "Bearer cp_not-a-token"
    elif who != "anonymous":
        client.force_login(user)
    expected = {"anonymous": 401, "bad token": 401, "no role": 403, "no role by token": 403}.get(who, 200)
    for url in ENDPOINTS:
        response = client.get(url, **headers)
        assert response.status_code == expected, (who, url, response.status_code)
        assert response["Content-Type"] == "application/json; charset=utf-8"


def test_tokens_are_kept_as_digests_and_can_be_revoked(db, django_user_model, client):
    user = join(django_user_model.objects.create_user("bot"), "viewer")
    token = token_for(user, "nightly")
    assert token.startswith("cp_") and not ApiToken.objects.filter(digest__contains=token[3:]).exists()
    assert client.get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    call_command("api_token", "bot", "--name", "nightly", "--revoke", stdout=StringIO())
    assert client.get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401


def test_a_token_ends_at_its_expiry_at_a_password_change_and_with_its_owner(db, django_user_model, client):
    from django.utils import timezone

    user = join(django_user_model.objects.create_user("bot", password="the-first-password-1"), "viewer")
    out = StringIO()
    call_command("api_token", "bot", "--name", "weekly", "--expires-in-days", "7", stdout=out)
    expiring, lasting = out.getvalue().strip(), token_for(user, "nightly")
    answer = lambda token: client.get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code  # noqa: E731
    assert answer(expiring) == 200 and answer(lasting) == 200
    ApiToken.objects.filter(name="weekly").update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert answer(expiring) == 401 and answer(lasting) == 200
    user.set_password("a-new-password-after-a-leak-2")
    user.save()
    assert answer(lasting) == 401, "a password change ends every token made under the old one"
    fresh = token_for(user, "after the reset")
    assert answer(fresh) == 200
    user.is_active = False
    user.save()
    assert answer(fresh) == 401
    with pytest.raises(CommandError):
        call_command("api_token", "bot", "--name", "x", "--expires-in-days", "0", stdout=StringIO())


def test_lists_page_by_key_to_the_end_and_agree_with_the_rows(demo_root, db, client, django_user_model):
    synthetic_run(demo_root / "many-calls", events=300, receipts=120, contract=CONTRACT)
    import_as_seen_later(demo_root)
    client.force_login(join(django_user_model.objects.create_user("reader"), "viewer"))
    seen: list[str] = []
    url: str | None = "/api/runs/many-calls/calls?limit=50"
    while url:
        body = client.get(url).json()
        assert body["total"] == 120
        seen += [item["call_id"] for item in body["items"]]
        url = f"/api/runs/many-calls/calls?limit=50&cursor={body['next']}" if body["next"] else None
    assert seen == list(
        Call.objects.filter(run__run_id="many-calls").order_by("call_id").values_list("call_id", flat=True)
    )
    runs = client.get("/api/runs?limit=200").json()["items"]
    assert sorted(run["run_id"] for run in runs) == sorted(Run.objects.values_list("run_id", flat=True))
    findings = client.get("/api/findings?limit=200").json()["items"]
    assert len(findings) == Finding.objects.filter(closed_at__isnull=True).count()
    assert client.get("/api/runs?limit=0").status_code == 400
    assert client.get("/api/runs?cursor=after.0.bm9wZQ").status_code == 400


def test_the_openapi_description_names_every_endpoint(db, client, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("reader"), "viewer"))
    description = client.get("/api/openapi.json").json()
    paths = set(description["paths"])
    assert {"/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/calls", "/api/findings", "/api/reservations",
            "/api/inbox", "/api/audit"} <= paths  # fmt: skip
    writes = {path for path, item in description["paths"].items() if set(item) != {"get"}}
    assert writes == {"/api/findings/{finding_id}/triage"}, "read-only but for triage"
    assert set(description["paths"]["/api/findings/{finding_id}/triage"]) == {"post"}


def test_the_openapi_description_needs_a_login_that_may_browse(db, client, django_user_model):
    assert client.get("/api/openapi.json").status_code == 401
    client.force_login(django_user_model.objects.create_user("no-role"))
    assert client.get("/api/openapi.json").status_code == 403
    client.logout()
    token = new_token(user=join(django_user_model.objects.create_user("script"), "viewer"), name="ci")
    described = client.get("/api/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert described.status_code == 200 and "/api/runs" in described.json()["paths"]
    # What a script reads with its token is never kept by a cache on the way.
    assert "no-store" in described.headers["Cache-Control"]


@pytest.mark.parametrize(
    "url", ["/api/runs?state=zzz", "/api/findings?code=zzz", "/api/findings?severity=zzz", "/api/inbox?kind=zzz",
            "/api/inbox?severity=zzz", "/api/inbox?triage=zzz", "/api/findings?triage=zzz",
            "/api/reservations?triage=zzz"],
)  # fmt: skip
def test_an_unknown_filter_value_is_a_400_as_on_the_pages(db, client, django_user_model, url):
    client.force_login(join(django_user_model.objects.create_user("reader"), "viewer"))
    response = client.get(url)
    assert response.status_code == 400 and "zzz" in response.json()["detail"]


# Each list's JSON twin (on its page) and its API endpoint: the same items, in the same order.
TWINS = [
    ("/?format=json", "/api/runs"),
    ("/?state=finished&format=json", "/api/runs?state=finished"),
    ("/runs/many-calls/?list=events&format=json", "/api/runs/many-calls/events"),
    ("/runs/many-calls/?list=events&type=receipt&format=json", "/api/runs/many-calls/events?type=receipt"),
    ("/runs/many-calls/?list=calls&format=json", "/api/runs/many-calls/calls"),
    ("/runs/a4-concurrent/?list=submissions&format=json", "/api/runs/a4-concurrent/submissions"),
    ("/runs/many-calls/replay/?format=json", "/api/runs/many-calls/decisions"),
    ("/findings/?format=json", "/api/findings"),
    ("/reservations/?format=json", "/api/reservations"),
    ("/inbox/?format=json", "/api/inbox"),
    ("/inbox/?severity=warning&format=json", "/api/inbox?severity=warning"),
    ("/audit/?format=json", "/api/audit"),
    ("/audit/?list=actions&format=json", "/api/audit/actions"),
    ("/retention/?format=json", "/api/retention"),
    ("/retention/?blocked=1&format=json", "/api/retention?blocked=true"),
    ("/hosts/?format=json", "/api/hosts"),
]


def test_each_lists_twins_and_its_api_give_the_same_items_in_the_same_order(demo_root, db, client, django_user_model):
    import csv
    import io

    from evidence.retention import actions
    from evidence.review import settle
    from tests.helpers import content, first_call_of

    synthetic_run(demo_root / "many-calls", events=300, receipts=120, contract=CONTRACT)
    import_as_seen_later(demo_root)
    person = join(django_user_model.objects.create_user("reader"), "viewer")
    call = first_call_of("send-message-killed")
    settle.settle_call(run=call.run, call=call, user=person, resolution="committed", reason="the log shows it",
                       typed_call_id=call.call_id[:12], receipt_sha256=call.file_sha256)  # fmt: skip
    actions.set_legal_hold(run=Run.objects.get(run_id="clean-run"), user=person, hold=True, reason="a case",
                             now=dt.datetime.now(dt.UTC))  # fmt: skip
    client.force_login(person)
    for twin_url, api_url in TWINS:
        twin = json.loads(content(client.get(twin_url)))
        paged: list = []
        url: str | None = f"{api_url}{'&' if '?' in api_url else '?'}limit=7"
        while url:
            body = client.get(url).json()
            paged += body["items"]
            url = f"{api_url}{'&' if '?' in api_url else '?'}limit=7&cursor={body['next']}" if body["next"] else None
        assert paged and twin["items"] == paged, twin_url
        assert (twin["next"], twin["total"]) == (None, len(paged)), twin_url
        table = list(csv.reader(io.StringIO(content(client.get(twin_url.replace("format=json", "format=csv"))))))
        assert table[0] == list(paged[0]) and len(table) == len(paged) + 1, twin_url
