"""What every page shares: the login, GET only, 404s, bounded queries, safe downloads."""

from __future__ import annotations

import csv
import io
import re
from http import HTTPStatus

import pytest
from django.urls import reverse

from evidence.ingest import importer
from receipts import durable
from tests.helpers import content, first_call_of
from tests.volume import synthetic_ledger

pytestmark = pytest.mark.django_db

PAGES = [
    "/",
    "/findings/",
    "/reservations/",
    "/runs/clean-run/",
    "/runs/clean-run/replay/",
    "/search/?q=clean-run",
    "/hosts/",
]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_needs_a_login(client, demo, url):
    response = client.get(url)
    assert response.status_code == HTTPStatus.FOUND
    assert response["Location"].startswith("/accounts/login/")


def test_the_call_page_needs_a_login(client, demo):
    call = first_call_of("clean-run")
    response = client.get(reverse("call", args=["clean-run", call.call_id]))
    assert response.status_code == HTTPStatus.FOUND


def test_pages_refuse_post(logged_in, demo):
    assert logged_in.post("/").status_code == HTTPStatus.METHOD_NOT_ALLOWED
    assert logged_in.post("/runs/clean-run/").status_code == HTTPStatus.METHOD_NOT_ALLOWED


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/?format=xml", "format=&#x27;xml&#x27; is not one of: csv, json"),
        ("/?state=nonsense", "state=&#x27;nonsense&#x27; is not one of:"),
        ("/runs/clean-run/?list=everything&format=csv", "list=&#x27;everything&#x27; is not one of: events, calls"),
        ("/runs/clean-run/?type=nope", "type=&#x27;nope&#x27; is not one of:"),
        ("/findings/?code=made_up", "code=&#x27;made_up&#x27; is not one of: invalid_json"),
        ("/inbox/?kind=everything", "kind=&#x27;everything&#x27; is not one of: silent host, stalled host, tampered"),
        ("/runs/clean-run/replay/?decision=maybe", "decision=&#x27;maybe&#x27; is not one of: confirm"),
        ("/audit/?list=zzz", "list=&#x27;zzz&#x27; is not one of: decisions, actions"),
    ],
)
def test_an_unknown_parameter_is_a_400_that_says_what_is_allowed(logged_in, demo, url, message):
    response = logged_in.get(url)
    assert response.status_code == HTTPStatus.BAD_REQUEST
    page = content(response)
    assert message in re.sub(r"</?code>", "", page), "what was sent and what is allowed (each as code: data)"
    assert f"<code>{message.split(' is not')[0]}</code>" in page
    assert '<nav aria-label="Main">' in page, "the branded page keeps the navigation"


def test_unknown_run_and_call_are_404(logged_in, demo):
    assert logged_in.get("/runs/nope/").status_code == HTTPStatus.NOT_FOUND
    assert logged_in.get("/runs/clean-run/calls/" + "0" * 64 + "/").status_code == HTTPStatus.NOT_FOUND


def test_query_counts_do_not_grow_with_the_run(logged_in, demo, django_assert_max_num_queries):
    call = first_call_of("clean-run")
    urls = ["/", "/runs/clean-run/", "/runs/clean-run/replay/", "/findings/", "/reservations/"]
    urls.append(reverse("call", args=["clean-run", call.call_id]))
    small = {}
    for url in urls:
        with django_assert_max_num_queries(40) as captured:
            logged_in.get(url)
        small[url] = len(captured)
    synthetic_ledger(demo / "clean-run", 3000, start_seq=11)
    importer.run_import(path=demo / "clean-run")
    for url in urls:
        with django_assert_max_num_queries(small[url]):
            logged_in.get(url)


def test_csv_cells_that_could_be_formulas_are_neutralised(logged_in, demo):
    run_dir = demo / "clean-run"
    for text in ('=HYPERLINK("http://evil")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        durable.append_event(run_dir, text, {})
    importer.run_import(path=run_dir)
    rows = list(csv.reader(io.StringIO(content(logged_in.get("/runs/clean-run/?format=csv")))))
    types = [row[2] for row in rows[1:]]
    assert '\'=HYPERLINK("http://evil")' in types and "'+1" in types and "'-2+3" in types
    assert "'@SUM(A1)" in types and "'\tx" in types and "'\rx" in types
    assert not [cell for row in rows[1:] for cell in row if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    seqs = [row[0] for row in rows[1:]]
    assert all(seq.isdigit() for seq in seqs), "numbers stay numbers"


def test_every_page_names_the_version_in_its_footer(logged_in, demo):
    from receipts import __version__

    for url in ("/", "/findings/", "/inbox/", "/audit/", "/accounts/login/"):
        assert f'<footer class="site"><span translate="no">Callproof {__version__}</span></footer>' in content(
            logged_in.get(url)
        ), url
