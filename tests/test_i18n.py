"""The dashboard in English and Simplified Chinese (docs/glossary.md).

Every string of every template is marked; the Chinese catalogue is complete (nothing
untranslated, nothing fuzzy), current with the code (makemessages finds nothing new) and
compiled as committed; every page read in Chinese shows no English interface text outside
data (tests/i18n_check.py says what data is); the browser's language chooses, and the
switcher overrides it and is remembered.
"""

from __future__ import annotations

import datetime as dt
import gettext
import html
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from http import HTTPStatus
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.template.base import Lexer, TokenType
from django.urls import reverse

from evidence.lib import hosts
from evidence.models import Call, Finding, Host, Run
from evidence.review import triage
from receipts import protocol
from tests.helpers import content, join
from tests.i18n_check import english_on
from tests.test_times import every_page

PROJECT = Path(__file__).resolve().parents[1]
TEMPLATES = PROJECT / "templates"
CATALOGUE = PROJECT / "evidence" / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
COMPILED = CATALOGUE.with_suffix(".mo")
# What makemessages reads: the dashboard and its templates (the writer and the reader are
# standard library only, and speak to programs, not to the dashboard's readers). Not
# 'receipts/*': Django matches that against every folder named receipts, templates/receipts/ too.
MAKEMESSAGES = ["makemessages", "--locale", "zh_Hans", "--no-obsolete", "--no-location", "--ignore", ".venv/*",
                "--ignore", "tests/*", "--ignore", "receipts/*.py", "--ignore", "var/*",
                "--ignore", "build/*"]  # fmt: skip

gettext_tools = pytest.mark.skipif(shutil.which("msgfmt") is None, reason="GNU gettext is installed by make")


def unmarked(template: Path) -> list[str]:
    """Interface text of ``template`` that is not inside a translate or blocktranslate tag."""
    kept: list[str] = []
    skipping = ""
    for token in Lexer(template.read_text()).tokenize():
        words = token.contents.split()
        tag = words[0] if words and token.token_type == TokenType.BLOCK else ""
        if skipping:
            if tag == skipping:
                skipping = ""
            continue
        if tag in {"blocktranslate", "blocktrans"}:
            skipping = "end" + tag
        elif tag == "comment":
            skipping = "endcomment"
        if token.token_type == TokenType.TEXT:
            kept.append(token.contents)
        elif token.token_type in (TokenType.VAR, TokenType.BLOCK):
            kept.append("\x00")  # a value or a translation: not literal text
    return [text.replace("\x00", "…") for text in english_on("".join(kept))]


TEMPLATE_FILES = sorted(TEMPLATES.rglob("*.html"))


@pytest.mark.parametrize("template", TEMPLATE_FILES, ids=[str(t.relative_to(TEMPLATES)) for t in TEMPLATE_FILES])
def test_every_string_a_template_shows_is_marked_for_translation(template):
    assert unmarked(template) == []


def test_the_check_finds_a_string_left_unmarked(tmp_path):
    """The lint above is not blind: plain text, a title and a data-label are caught; data,
    identifiers and marked strings are not."""
    page = tmp_path / "page.html"
    page.write_text(
        '{% load i18n %}<p>{% translate "Settled" %} <code>run_id</code> CSV {{ value }}</p>'
        '<span translate="no">alice</span>{% blocktranslate %}Calls {{ n }}{% endblocktranslate %}'
        '<td data-label="Last event">x</td><button title="Show it">→</button><p>Nothing here</p>'
        '<button type="submit" name="act" value="acknowledge">✓</button><input type="submit" value="Send it">'
    )
    # a <button>'s value is sent, not shown; an input button's value is its label
    assert unmarked(page) == ["Last event", "Show it", "Nothing here", "Send it"]


def labels_looked_up_per_row(template: Path) -> list[str]:
    """The words a template looks up in each row of a loop for a card label (``data-label``):
    a page of fifty rows asked the catalogue fifty times for one word (issue 41). A column's
    word is looked up once, before the rows (``{% translate "Seq" as seq_label %}``)."""
    found, loops, text_before = [], 0, ""
    for token in Lexer(template.read_text()).tokenize():
        words = token.contents.split()
        if token.token_type == TokenType.BLOCK and words:
            loops += {"for": 1, "endfor": -1}.get(words[0], 0)
            per_row = loops and words[0] in {"translate", "trans"} and "as" not in words
            if per_row and text_before.endswith('data-label="'):
                found.append(" ".join(words[1:]))
        text_before = token.contents if token.token_type == TokenType.TEXT else ""
    return found


@pytest.mark.parametrize("template", TEMPLATE_FILES, ids=[str(t.relative_to(TEMPLATES)) for t in TEMPLATE_FILES])
def test_no_template_looks_up_a_card_label_in_each_row(template):
    assert labels_looked_up_per_row(template) == []


def test_the_check_finds_a_card_label_looked_up_per_row(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(
        '{% load i18n %}{% translate "Seq" as seq_label %}<td data-label="{% translate \'Time\' %}">'
        '{% for e in rows %}<td data-label="{{ seq_label }}">{{ e.seq }}</td>'
        "<td data-label=\"{% translate 'Time' %}\">{{ e.ts }}</td>{% endfor %}"
    )
    assert labels_looked_up_per_row(page) == ["'Time'"]


def entries(po_text: str) -> list[str]:
    """The entries of a PO file's text, its header left out."""
    blocks = [block for block in po_text.strip().split("\n\n") if "\nmsgid " in "\n" + block]
    return [block for block in blocks if '"Content-Type:' not in block]


def catalogue_entries(po: Path) -> dict[tuple[str, str], str]:
    """(msgctxt, msgid) -> msgstr of a compiled catalogue, read by Python's own gettext."""
    with po.open("rb") as compiled:
        catalog = gettext.GNUTranslations(compiled)._catalog  # type: ignore[attr-defined]
    return {key if isinstance(key, tuple) else ("", key): value for key, value in catalog.items() if key}


@gettext_tools
def test_the_chinese_catalogue_has_nothing_untranslated_or_fuzzy():
    for option in ("--untranslated", "--only-fuzzy"):
        left = subprocess.run(["msgattrib", option, "--no-obsolete", str(CATALOGUE)], capture_output=True, text=True)
        assert left.returncode == 0, left.stderr
        assert entries(left.stdout) == [], option
    checked = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(CATALOGUE)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@gettext_tools
def test_the_catalogue_holds_every_marked_string_of_the_code(tmp_path):
    """makemessages over a copy of the sources finds no string the catalogue lacks, and the
    catalogue keeps none the code no longer has."""
    copy = tmp_path / "callproof"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns(".venv", "var", ".git", "__pycache__", "build"))
    made = subprocess.run(
        [sys.executable, "manage.py", *MAKEMESSAGES],
        cwd=copy, capture_output=True, text=True, env={**os.environ, "DJANGO_DEBUG": "1"},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    fresh = subprocess.run(["msgattrib", "--untranslated", "--no-obsolete", str(copy / CATALOGUE.relative_to(PROJECT))],
                           capture_output=True, text=True)  # fmt: skip
    assert entries(fresh.stdout) == [], "marked in the code, not in the catalogue (make messages)"
    ids = subprocess.run(["msgcomm", "--unique", str(CATALOGUE), str(copy / CATALOGUE.relative_to(PROJECT))],
                         capture_output=True, text=True)  # fmt: skip
    assert entries(ids.stdout) == [], "in one catalogue only (make messages)"


@gettext_tools
def test_the_committed_compiled_catalogue_is_its_source_compiled(tmp_path):
    compiled = tmp_path / "django.mo"
    subprocess.run(["msgfmt", "-o", str(compiled), str(CATALOGUE)], check=True)
    assert catalogue_entries(COMPILED) == catalogue_entries(compiled), "run make messages and commit the .mo"


MARKUP = re.compile(r"<[^>]*>|&#?\w+;")
PLACEHOLDERS = re.compile(r"%\(\w+\)[sd]|\{\w*\}")


def test_a_translation_adds_no_markup_and_keeps_its_placeholders():
    """A translated sentence is trusted as a template is (format_html and the retention page's
    sentences escape only the values), so the catalogue may carry no tag, entity or bare ``<`` /
    ``&`` that its English lacks, and a sentence keeps every value it names."""
    checked = 0
    for key, translated in catalogue_entries(COMPILED).items():
        plural = isinstance(key[1], int)  # (msgid, n): Chinese's one form answers the English plural
        english = key[0] if plural else key[1].split("\x04")[-1]
        added = Counter(MARKUP.findall(translated)) - Counter(MARKUP.findall(english))
        assert not added, f"{english!r} gains {sorted(added)} in Chinese"
        for bare in "<&":
            assert translated.count(bare) <= english.count(bare), f"{english!r} gains a bare {bare} in Chinese"
        if not plural:
            assert sorted(PLACEHOLDERS.findall(translated)) == sorted(PLACEHOLDERS.findall(english)), english
        checked += 1
    assert checked > 500


def every_page_in_every_state(client) -> list[str]:
    """Every page of the demo, with a settled call, a legal hold, triaged findings and hosts so
    that their panels show too."""
    call = Call.objects.get(run__run_id="write-file-killed")
    form = {"confirm_call_id": call.call_id[:12], "receipt_sha256": call.file_sha256, "confirm_queryable": "on"}
    form |= {"resolution": "committed", "reason": "the file is there"}
    assert client.post(reverse("confirm", args=["write-file-killed", call.call_id]), form).status_code == 303
    hold = client.post(reverse("legal_hold", args=["clean-run"]), {"hold": "set", "reason": "an audit asked"})
    assert hold.status_code in (HTTPStatus.FOUND, HTTPStatus.SEE_OTHER)
    person = User.objects.get(username="ada")
    now = protocol.utc_now()
    findings = list(Finding.objects.order_by("pk"))
    triage.act(finding=findings[0], user=person, action=triage.ACKNOWLEDGE, reason="known", now=now)
    until = now + dt.timedelta(days=1)
    triage.act(finding=findings[1], user=person, action=triage.SNOOZE, reason="later", until=until, now=now)
    triage.act(finding=findings[2], user=person, action=triage.SNOOZE, reason="next", on_change=True, now=now)
    # A host that ships, and one gone silent (its last report long ago).
    hosts.register(runs_root=Path("/srv/runs"), watching=True)
    long_ago = now - dt.timedelta(days=2)
    Host.objects.create(name="old-host", runs_root="/srv/old", version="0", started_at=long_ago, last_seen_at=long_ago,
                        watching=True)  # fmt: skip
    triage_pages = [reverse("triage", args=[finding.pk]) for finding in findings]
    views = [
        "/findings/?triage=acknowledged",
        "/findings/?triage=snoozed",
        "/inbox/?triage=snoozed",
        "/reservations/?triage=acknowledged",
    ]
    missing = ["/runs/no-such-run/", "/findings/?code=nonsense", "/search/?q=nothing-like-this"]
    return every_page() + triage_pages + views + missing + ["/accounts/login/"]


def test_no_page_read_in_chinese_shows_an_english_interface_string(chinese, demo):
    shown = {}
    for url in every_page_in_every_state(chinese):
        response = chinese.get(url)
        assert response.status_code in (HTTPStatus.OK, HTTPStatus.NOT_FOUND, HTTPStatus.BAD_REQUEST), url
        assert response["Content-Language"] == "zh-hans", url
        if english := english_on(content(response)):
            shown[url] = english
    assert shown == {}


def test_the_browser_chooses_the_language_and_the_switcher_overrides_it(client, demo, django_user_model):
    client.force_login(join(django_user_model.objects.create_user("wei"), "viewer"))
    english = client.get("/", HTTP_ACCEPT_LANGUAGE="en-GB,en;q=0.9")
    chinese = client.get("/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9")
    assert english["Content-Language"] == "en" and '<html lang="en">' in content(english)
    assert chinese["Content-Language"] == "zh-hans" and '<html lang="zh-Hans">' in content(chinese)
    switched = client.post(
        reverse("set_language"), {"language": "en", "next": "/findings/"}, HTTP_ACCEPT_LANGUAGE="zh-CN"
    )
    assert switched.status_code == HTTPStatus.FOUND and switched["Location"] == "/findings/"
    assert client.cookies[settings.LANGUAGE_COOKIE_NAME]["httponly"]
    # Remembered over the browser's own choice, on every later page.
    assert client.get("/findings/", HTTP_ACCEPT_LANGUAGE="zh-CN")["Content-Language"] == "en"
    # Somewhere else the switcher does not send anyone.
    for elsewhere in ("https://evil.example/", "//evil.example/", "/\\evil.example/", "javascript:alert(1)",
                      "http:/\\evil.example", "\thttps://evil.example/"):  # fmt: skip
        away = client.post(reverse("set_language"), {"language": "zh-hans", "next": elsewhere})
        assert away["Location"] == "/", elsewhere
    # A language the site does not offer changes nothing: not the cookie, not the page.
    client.post(reverse("set_language"), {"language": "fr\r\nSet-Cookie: x=1", "next": "/"})
    assert client.cookies[settings.LANGUAGE_COOKIE_NAME].value == "zh-hans"
    assert client.get("/", HTTP_ACCEPT_LANGUAGE="fr")["Content-Language"] == "zh-hans"
    assert Run.objects.exists()


LANGUAGE_FORM = re.compile(r'<form method="post" action="/language/".*?</form>', re.DOTALL)


def switch_language_like_a_browser(client, page: str, language: str):
    """Send the page's language form as a browser does (its hidden fields, the chosen language)
    and follow where it leads."""
    [form] = LANGUAGE_FORM.findall(page)
    fields = {name: html.unescape(value) for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', form)}
    return client.post(reverse("set_language"), {**fields, "language": language}, follow=True)


def test_switching_language_on_a_page_that_answered_a_post_opens_the_forms_page(client, demo, django_user_model):
    """A refused form answers its POST with the page again: switching language there goes to
    the page that holds the form, not to the form's URL (which takes only a POST: a 405)."""
    client.force_login(join(django_user_model.objects.create_user("ada"), "admin", "confirmer"))
    call = Call.objects.get(run__run_id="write-file-killed")
    finding = Finding.objects.order_by("pk").first()
    assert finding is not None
    call_args = ["write-file-killed", call.call_id]
    posted = {
        reverse("confirm", args=call_args): reverse("call", args=call_args),
        reverse("triage_action", args=[finding.pk]): reverse("triage", args=[finding.pk]),
        reverse("legal_hold", args=["clean-run"]): reverse("run", args=["clean-run"]),
    }  # fmt: skip
    # Refused too: a withdrawal with no decision to take back (a 409), a rule with no name.
    posted[reverse("withdraw", args=call_args)] = reverse("call", args=call_args)
    posted[reverse("notification_rule_add")] = reverse("notifications")
    for action, form_page in posted.items():
        answer = client.post(action, {"reason": "x" * 3, "hold": "sideways", "action": "sideways"})
        refused = answer.status_code in (HTTPStatus.BAD_REQUEST, HTTPStatus.CONFLICT)
        assert refused and LANGUAGE_FORM.search(content(answer)), action
        switched = switch_language_like_a_browser(client, content(answer), "zh-hans")
        assert switched.status_code == HTTPStatus.OK, action
        assert switched.redirect_chain[-1][0] == form_page, action
        assert switched["Content-Language"] == "zh-hans", action
        client.post(reverse("set_language"), {"language": "en", "next": "/"})
    # On a page asked for with a GET, the switcher comes back to it, query and all.
    page = client.get("/findings/?severity=error")
    switched = switch_language_like_a_browser(client, content(page), "zh-hans")
    assert switched.redirect_chain[-1][0] == "/findings/?severity=error"


def test_the_admin_reads_in_chinese_with_its_header_app_and_model_names(client, demo, django_user_model):
    """The admin is Django's, and Django translates its own words; the site's header, its app
    and its models are ours to name (Django's default plural made "Audit entrys"). A superuser
    sees every model of ours the admin shows."""
    client.force_login(django_user_model.objects.create_superuser("root", password="a-long-password-1"))
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "zh-CN,zh;q=0.9,en;q=0.5"
    index = content(client.get("/admin/"))
    for english in ("Callproof administration", "Receipts", "Audit entr", "Human decision", "Settle decision"):
        assert english not in index, english
    assert "Callproof 管理" in index and "回执" in index
    for model, name in (("auditentry", "审计记录"), ("humandecision", "裁定记录"), ("host", "主机")):
        url = reverse(f"admin:receipts_{model}_changelist")
        assert f'href="{url}"' in index and f">{name}</a>" in index, model
        page = content(client.get(url))
        assert "Callproof 管理" in page and "Callproof administration" not in page, url
        assert name in page and "entrys" not in page, url
