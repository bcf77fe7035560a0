"""Who may do what: every URL and every action, as anonymous, as a login with no role,
and as each role (evidence/lib/roles.py). Nothing unauthorised succeeds."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from http import HTTPStatus

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from evidence.export import jobs
from evidence.lib.roles import ROLES
from evidence.models import AuditEntry, Call, Claim, Export, Finding, HumanDecision, NotificationRule, Run
from receipts import protocol
from tests.helpers import first_call_of, join

OK, REDIRECT, SEE_OTHER, UNAUTHORIZED = HTTPStatus.OK, HTTPStatus.FOUND, HTTPStatus.SEE_OTHER, HTTPStatus.UNAUTHORIZED
FORBIDDEN, NOT_ALLOWED = HTTPStatus.FORBIDDEN, HTTPStatus.METHOD_NOT_ALLOWED
WHO = ("anonymous", "no role", *ROLES)


@dataclasses.dataclass
class Act:
    name: str  # the URL name it exercises
    method: str
    url: Callable[[], str]
    allowed: tuple[str, ...]  # who may; "every role" is spelled out
    data: Callable[[], dict] = dict
    success: int = OK  # what an allowed person gets
    public: bool = False  # no login needed
    key_only: bool = False  # a host key's (callproof ship), never a person's: 401 to everyone


def in_doubt() -> Call:
    return first_call_of("send-message-killed")


def made_export() -> int:
    """A finished export of clean-run, made as the worker makes one (someone else's: nobody's)."""
    export = Export.objects.filter(run__run_id="clean-run", requested_by=None).first()
    if export is None:
        export = Export.objects.create(run=Run.objects.get(run_id="clean-run"), created_at=protocol.utc_now())
        jobs.make(export.pk)
    return export.pk


def conflict() -> int:
    """The demo's submission conflict: a finding to triage."""
    return Finding.objects.get(code="submission_conflict", run__run_id="conflict-same-id").pk


def a_rule() -> int:
    """A notification rule to turn off (nobody's)."""
    rule = NotificationRule.objects.filter(created_by=None).first()
    if rule is None:
        rule = NotificationRule.objects.create(name="ops", channel="email", emails="ops@example.com",
                                               created_at=protocol.utc_now())  # fmt: skip
    return rule.pk


EVERY_ROLE = tuple(ROLES)
ACTS = [
    Act("healthz", "get", lambda: "/healthz", WHO, public=True),
    Act("metrics", "get", lambda: "/metrics", WHO, public=True),  # its own guard: this machine, or a token
    Act("login", "get", lambda: reverse("login"), WHO, public=True),
    Act("runs", "get", lambda: reverse("runs"), EVERY_ROLE),
    Act("search", "get", lambda: reverse("search") + "?q=e", EVERY_ROLE),
    Act("findings", "get", lambda: reverse("findings"), EVERY_ROLE),
    Act("reservations", "get", lambda: reverse("reservations"), EVERY_ROLE),
    Act("run", "get", lambda: reverse("run", args=["clean-run"]), EVERY_ROLE),
    Act("replay", "get", lambda: reverse("replay", args=["clean-run"]), EVERY_ROLE),
    Act("call", "get", lambda: reverse("call", args=["send-message-killed", in_doubt().call_id]), EVERY_ROLE),
    Act("audit", "get", lambda: reverse("audit"), EVERY_ROLE),
    Act("inbox", "get", lambda: reverse("inbox"), EVERY_ROLE),
    Act("retention", "get", lambda: reverse("retention"), EVERY_ROLE),
    Act("hosts", "get", lambda: reverse("hosts"), EVERY_ROLE),
    Act("api_docs", "get", lambda: reverse("api_docs"), EVERY_ROLE),
    Act("export_request", "get", lambda: reverse("export_request", args=["clean-run"]), ()),
    Act("export_request", "post", lambda: reverse("export_request", args=["clean-run"]), ("exporter",),
        success=SEE_OTHER),
    Act("export_panel", "get", lambda: reverse("export_panel", args=["clean-run"]), ("exporter",)),
    Act("export_download", "get", lambda: reverse("export_download", args=["clean-run", made_export()]),
        ("exporter",)),
    Act("run_evidence", "get", lambda: reverse("run_evidence", args=["clean-run"]), ("exporter",)),
    Act("legal_hold", "get", lambda: reverse("legal_hold", args=["clean-run"]), ()),
    Act(
        "legal_hold", "post", lambda: reverse("legal_hold", args=["clean-run"]), ("admin",),
        data=lambda: {"hold": "set", "reason": "a court asked"}, success=SEE_OTHER,
    ),
    # Before the settlement below: a claim is on a call still in doubt (settling releases it).
    Act("claim", "get", lambda: reverse("claim"), ()),
    Act(
        "claim", "post", lambda: reverse("claim"), ("confirmer",), success=SEE_OTHER,
        data=lambda: {"kind": "in doubt", "run": "send-message-killed", "subject": in_doubt().call_id,
                      "action": "claim"},
    ),
    Act("confirm", "get", lambda: reverse("confirm", args=["send-message-killed", in_doubt().call_id]), ()),
    Act(
        "confirm", "post", lambda: reverse("confirm", args=["send-message-killed", in_doubt().call_id]),
        ("confirmer",), success=SEE_OTHER,
        data=lambda: {"resolution": "committed", "reason": "the mail log shows it",
                      "confirm_call_id": in_doubt().call_id[:12], "receipt_sha256": in_doubt().file_sha256},
    ),
    # The decision above was written into its run at once (this process is the run's host): too
    # late to withdraw, and only a confirmer is told so (409); nobody else gets that far.
    Act("withdraw", "get", lambda: reverse("withdraw", args=["send-message-killed", in_doubt().call_id]), ()),
    Act("withdraw", "post", lambda: reverse("withdraw", args=["send-message-killed", in_doubt().call_id]),
        ("confirmer",), success=HTTPStatus.CONFLICT),
    Act("triage", "get", lambda: reverse("triage", args=[conflict()]), EVERY_ROLE),
    Act("triage_action", "get", lambda: reverse("triage_action", args=[conflict()]), ()),
    Act(
        "triage_action", "post", lambda: reverse("triage_action", args=[conflict()]), ("confirmer",),
        data=lambda: {"action": "acknowledge", "reason": "known: the client retried"}, success=SEE_OTHER,
    ),
    Act("notifications", "get", lambda: reverse("notifications"), ("admin",)),
    Act("notification_rule_add", "get", lambda: reverse("notification_rule_add"), ()),
    Act(
        "notification_rule_add", "post", lambda: reverse("notification_rule_add"), ("admin",), success=SEE_OTHER,
        data=lambda: {"name": "ops", "channel": "email", "emails": "ops@example.com"},
    ),
    Act("notification_rule_action", "get", lambda: reverse("notification_rule_action", args=[a_rule()]), ()),
    Act(
        "notification_rule_action", "post", lambda: reverse("notification_rule_action", args=[a_rule()]),
        ("admin",), data=lambda: {"action": "disable"}, success=SEE_OTHER,
    ),
    Act("admin:index", "get", lambda: reverse("admin:index"), ("admin",)),
    Act("admin:auth_user_changelist", "get", lambda: reverse("admin:auth_user_changelist"), ("admin",)),
    Act("logout", "post", lambda: reverse("logout"), WHO, success=REDIRECT, public=True),
    Act("set_language", "post", lambda: reverse("set_language"), WHO, success=REDIRECT, public=True,
        data=lambda: {"language": "en", "next": "/"}),
    # The shipper's door: a login, whatever its roles, opens none of it (tests/test_ship.py).
    Act("ship_push", "post", lambda: reverse("ship_push"), (), key_only=True,
        data=lambda: {"run_id": "clean-run", "items": []}),
    Act("ship_instructions", "get", lambda: reverse("ship_instructions"), (), key_only=True),
    Act("ship_acks", "post", lambda: reverse("ship_acks"), (), key_only=True),
    Act("ship_stopped", "post", lambda: reverse("ship_stopped"), (), key_only=True),
    Act("ship_report", "post", lambda: reverse("ship_report"), (), key_only=True, data=lambda: {"runs": []}),
    Act("ship_removal", "post", lambda: reverse("ship_removal"), (), key_only=True,
        data=lambda: {"id": "remove-1", "steer_sha256": ""}),
]  # fmt: skip


def denied(who: str, act: Act) -> set[int]:
    """What a person who may not do ``act`` gets: the login page, a refusal, or (for a
    method the URL never takes) 405. Never a success."""
    if act.key_only:
        return {UNAUTHORIZED}
    if who == "anonymous":
        return {REDIRECT}  # to the login page (the dashboard's or the admin's)
    if act.name.startswith("admin:"):
        return {REDIRECT}  # the admin site sends a person who is not its staff to its own login
    if who == "no role":
        return {FORBIDDEN}
    return {FORBIDDEN, NOT_ALLOWED}


def test_every_url_is_in_the_table():
    """A new URL must say who may use it before it can land."""
    names = set()

    def walk(patterns, namespace: str = "") -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if pattern.namespace in ("admin", "api"):
                    continue  # the admin site (its index and user list stand for it); the API (test_api)
                walk(pattern.url_patterns, pattern.namespace or namespace)
            elif isinstance(pattern, URLPattern) and pattern.name:
                names.add(pattern.name)

    walk(get_resolver().url_patterns)
    assert names == {act.name for act in ACTS if not act.name.startswith("admin:")}


@pytest.mark.parametrize("who", WHO)
def test_nothing_unauthorised_succeeds(who, demo, client, django_user_model):
    if who != "anonymous":
        user = django_user_model.objects.create_user("someone", password="a-long-password-1")
        if who != "no role":
            join(user, who)  # no staff flag: the admin role alone opens the admin site
        client.force_login(user)
    for act in ACTS:
        response = getattr(client, act.method)(act.url(), act.data())
        if response.streaming:
            b"".join(response.streaming_content)  # a download: read, so that its file is closed
        may = who in act.allowed
        expected = {act.success} if may else denied(who, act)
        assert response.status_code in expected, (who, act.name, act.method, response.status_code)
        if act.name == "logout":
            continue
        if not may and act.method == "post":
            assert not Run.objects.filter(legal_hold=True).exists() or who == "admin"
            assert not HumanDecision.objects.exists() or who == "confirmer"
            assert not Export.objects.exclude(requested_by=None).exists() or who == "exporter"
            assert not Finding.objects.exclude(triage="").exists() or who == "confirmer"
            assert not NotificationRule.objects.exclude(created_by=None).exists() or who == "admin"
            assert not NotificationRule.objects.filter(enabled=False).exists() or who == "admin"
            assert not Claim.objects.exists() or who == "confirmer"
    if who == "admin":
        assert Run.objects.get(run_id="clean-run").legal_hold
        assert NotificationRule.objects.get(created_by__username="someone").emails == "ops@example.com"
    if who == "confirmer":
        assert HumanDecision.objects.get().actor == "someone"
        assert Finding.objects.get(pk=conflict()).triage == "acknowledged"
        assert AuditEntry.objects.get(action=AuditEntry.ACKNOWLEDGED).actor == "someone"
        assert AuditEntry.objects.get(action=AuditEntry.CLAIMED).actor == "someone"


def test_a_person_without_a_role_sees_no_count_of_anything(demo, client, django_user_model):
    client.force_login(django_user_model.objects.create_user("nobody"))
    response = client.get(reverse("runs"))
    assert response.status_code == FORBIDDEN
    assert b'class="count"' not in response.content


def test_the_data_migration_gives_each_role_exactly_its_permissions(django_user_model):
    """On the migration's own models; what it makes on a new database, tests/test_migrations.py."""
    migration = importlib.import_module("evidence.migrations.0002_roles")
    Group.objects.filter(name="viewer").delete()
    Group.objects.get_or_create(name="admin")[0].permissions.set(Permission.objects.filter(codename="confirm_call"))
    state = MigrationExecutor(connection).loader.project_state(("receipts", "0002_roles"))
    migration.make_roles(state.apps, None)
    for role, permissions in ROLES.items():
        held = {f"{p.content_type.app_label}.{p.codename}" for p in Permission.objects.filter(group__name=role)}
        assert held == set(permissions), role


@pytest.mark.django_db
def test_a_login_with_no_role_sees_one_page_naming_who_can_give_one(client, django_user_model):
    """Wherever it goes, a login with no role gets the same page (a 403): no navigation of
    links that all refuse, and the active people who may give it a role."""
    admin = join(django_user_model.objects.create_user("ana", email="ana@example.org"), "admin")
    django_user_model.objects.create_superuser("root-person", email="")
    join(django_user_model.objects.create_user("gone", is_active=False), "admin")
    join(django_user_model.objects.create_user("vera"), "viewer")
    client.force_login(django_user_model.objects.create_user("newcomer"))
    for url in (reverse("runs"), reverse("inbox"), reverse("audit"), reverse("run", args=["no-such-run"])):
        page = client.get(url)
        assert page.status_code == FORBIDDEN, url
        html = page.content.decode()
        assert "You have no role yet" in html and "<strong>viewer</strong>" in html
        assert 'aria-label="Main"' not in html and 'role="search"' not in html, "links that would all refuse"
        assert f'href="mailto:{admin.email}"' in html and "root-person" in html
        assert "gone" not in html and "vera" not in html, "only active people who can give a role"
        assert "Log out" in html


@pytest.mark.django_db
def test_the_no_role_page_says_how_to_make_the_first_admin(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("newcomer"))
    html = client.get(reverse("runs")).content.decode()
    assert "Nobody can give roles yet" in html and "createsuperuser" in html


@pytest.mark.django_db
def test_a_refusal_offers_no_way_back_that_refuses_too(client, django_user_model):
    """A viewer refused an act is offered the runs; the 403 page links nowhere it cannot go."""
    client.force_login(join(django_user_model.objects.create_user("vera"), "viewer"))
    refused = client.post(reverse("legal_hold", args=["any-run"]), {"hold": "set", "reason": "x"})
    assert refused.status_code == FORBIDDEN and b"Back to the runs" in refused.content
