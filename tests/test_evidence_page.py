"""Issue 36: what an export's page says is what is verified. ``verify-evidence`` renders the page
again from evidence.json (receipts/reader/evidence_page.py) and compares every byte, in the
language the manifest names, so an edited page fails even when its digest in the manifest is
rewritten to match, with ``--against`` too (docs/evidence-exports.md, "What the page check covers")."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence.export.bundle import export_run
from evidence.export.redaction import Policy
from evidence.models import Run
from receipts import protocol
from receipts.reader import evidence_page
from receipts.reader.verify import verify_export
from tests.helpers import first_call_of

# Any JSON value, to stand in for a section an editor rewrote.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)

LANGUAGES = ("en", "zh-hans")


def exported(run_id: str, language: str, out: Path) -> Path:
    export_run(run=Run.objects.get(run_id=run_id), out=out, policy=Policy(), language=language)
    return out


def edit_page(folder: Path, edit: Callable[[str], str]) -> None:
    """Edit the page as someone covering their tracks would: the manifest's page digest rewritten
    to the edited page's, so that only what the page says can give it away."""
    page = (folder / "index.html").read_text(encoding="utf-8")
    edited = edit(page)
    assert edited != page, "the edit found nothing to change"
    (folder / "index.html").write_text(edited, encoding="utf-8")
    evidence = (folder / "evidence.json").read_text(encoding="utf-8")
    old = json.loads(evidence)["manifest"]["page_sha256"]
    (folder / "evidence.json").write_text(evidence.replace(old, protocol.sha256_hex(edited.encode())), encoding="utf-8")


def says_the_page_differs(problems: list[str]) -> bool:
    return any(problem.startswith("index.html does not say what evidence.json says") for problem in problems)


def badge_of(word: str, language: str) -> str:
    shown = evidence_page.states.CHINESE[word] if language == "zh-hans" else word
    if state := evidence_page.states.STATES.get(word):
        glyph = f'<span class="glyph" aria-hidden="true">{state.glyph}</span>'
        return f'data-value="{word}" data-state="{word}" class="badge badge-{state.tone} state">{glyph}{shown}<'
    return f'data-value="{word}" class="badge badge-{evidence_page.states.KINDS.get(word, "neutral")}">{shown}<'


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_tampered_verdict_turned_verified_fails_though_its_digest_was_rewritten(demo, tmp_path, language):
    folder = exported("tampered-receipt", language, tmp_path / "out")
    assert verify_export(folder) == []
    tampered, verified = badge_of("tampered", language), badge_of("verified", language)
    assert tampered in (folder / "index.html").read_text(encoding="utf-8")
    edit_page(folder, lambda page: page.replace(tampered, verified))
    problems = verify_export(folder)
    assert says_the_page_differs(problems), problems
    assert any("verified" in problem for problem in problems), "the difference is quoted"
    # The run directory matching evidence.json does not make the page true.
    assert says_the_page_differs(verify_export(folder, demo / "tampered-receipt"))


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_committed_turned_rejected_fails(demo, tmp_path, language):
    folder = exported("clean-run", language, tmp_path / "out")
    committed, rejected = badge_of("committed", language), badge_of("rejected", language)
    edit_page(folder, lambda page: page.replace(committed, rejected))
    assert says_the_page_differs(verify_export(folder, demo / "clean-run"))


@pytest.mark.parametrize(
    "edit",
    [
        # a call's row taken out
        lambda page: page.replace(
            page[page.index("<tr><td><code") : page.index("</tr>", page.index("<tr><td><code")) + 5], ""
        ),
        # a stylesheet rule that hides the calls table: nothing the page says changed, what it shows did
        lambda page: page.replace("</style>", "table.data { display: none; }\n</style>"),
        # a line added after the end
        lambda page: page + "<p>Verified by an independent auditor.</p>\n",
        # a call's digest in its row, not the manifest's
        lambda page: page.replace('<td><code class="digest">', '<td><code class="digest">0', 1),
    ],
    ids=["row-removed", "style-added", "sentence-added", "digest-changed"],
)
def test_any_edit_of_what_the_page_shows_fails(demo, tmp_path, edit):
    folder = exported("clean-run", "en", tmp_path / "out")
    edit_page(folder, edit)
    assert says_the_page_differs(verify_export(folder))


def test_a_page_in_a_language_the_manifest_does_not_name_fails(demo, tmp_path):
    english = exported("clean-run", "en", tmp_path / "en")
    chinese = exported("clean-run", "zh-hans", tmp_path / "zh")
    edit_page(english, lambda page: (chinese / "index.html").read_text(encoding="utf-8"))
    assert says_the_page_differs(verify_export(english))


def test_a_page_format_this_verifier_does_not_know_is_said_not_passed(demo, tmp_path):
    folder = exported("clean-run", "en", tmp_path / "out")
    evidence = (folder / "evidence.json").read_text(encoding="utf-8")
    (folder / "evidence.json").write_text(evidence.replace(evidence_page.PAGE_FORMAT, "someone-elses/v9"))
    (problem,) = verify_export(folder)
    assert '"someone-elses/v9"' in problem and "cannot be checked" in problem


def test_the_page_shows_each_call_as_evidence_json_has_it(demo, tmp_path):
    """Not only the same bytes twice: the page the export writes holds each call's id, status
    and decision from evidence.json, and its digests."""
    folder = exported("tampered-receipt", "en", tmp_path / "out")
    document = json.loads((folder / "evidence.json").read_bytes())
    page = (folder / "index.html").read_text(encoding="utf-8")
    for call in document["calls"]:
        row = page[page.index(f'<tr><td><code class="digest">{call["call_id"]}</code>') :]
        row = row[: row.index("</tr>")]
        assert f'data-value="{call["shown_status"]}"' in row
        assert call["input_sha256"][:16] in row
    for name, digest in document["manifest"]["sections"].items():
        assert f'data-section="{name}">{digest}</code>' in page
    assert first_call_of("tampered-receipt").call_id in page


def test_the_writers_verifier_fails_an_edited_page_with_no_django(demo, tmp_path):
    """``callproof verify-evidence`` as an outsider runs it: a process of its own, no Django
    settings; it exits 1 and names the page."""
    folder = exported("tampered-receipt", "zh-hans", tmp_path / "out")
    command = [
        sys.executable,
        "-m",
        "receipts",
        "verify-evidence",
        str(folder),
        "--against",
        str(demo / "tampered-receipt"),
    ]
    env = {"PATH": "/usr/bin:/bin"}
    before = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, cwd=Path(__file__).parent.parent
    )
    assert "index.html" not in before.stdout + before.stderr
    edit_page(folder, lambda page: page.replace(badge_of("tampered", "zh-hans"), badge_of("verified", "zh-hans")))
    after = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, cwd=Path(__file__).parent.parent
    )
    assert after.returncode == 1
    assert "index.html does not say what evidence.json says" in after.stdout + after.stderr


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_page_draws_each_state_as_the_dashboard_does(language):
    from django.utils import translation

    from evidence.templatetags.dashboard import state_badge

    page = evidence_page._Page(evidence_page.page_language(language))
    with translation.override(language):
        for name in evidence_page.states.STATES:
            assert page.badge(name) == str(state_badge(name)), name


def test_a_page_made_in_the_first_format_still_verifies_and_is_held_to_it(demo, tmp_path):
    """A v1 page (badges by kind, before the table of states) is rendered as v1 pages were: an
    export made then still verifies, and a v1 manifest does not excuse a page drawn otherwise."""
    folder = exported("tampered-receipt", "en", tmp_path / "out")
    path = folder / "evidence.json"
    document = json.loads(path.read_bytes())
    v1, v2 = evidence_page.PAGE_FORMATS
    assert document["manifest"]["page"]["format"] == v2
    document["manifest"]["page"]["format"] = v1
    first = evidence_page.render_from(document, "en", v1)
    assert first != evidence_page.render_from(document, "en", v2) and b'data-state="' not in first
    text = path.read_text(encoding="utf-8")
    text = text.replace(f'"{v2}"', f'"{v1}"').replace(document["manifest"]["page_sha256"], protocol.sha256_hex(first))
    path.write_text(text, encoding="utf-8")
    (folder / "index.html").write_bytes(first)
    assert verify_export(folder) == []
    edit_page(folder, lambda page: page.replace('badge-bad">tampered', 'badge-ok">committed'))
    assert says_the_page_differs(verify_export(folder))


def test_the_pages_words_are_the_dashboards():
    """The page is rendered with no Django, so it holds its own Chinese for the records' words:
    the same as the dashboard's catalogue says, and a badge of the same kind (docs/glossary.md)."""
    from django.utils import translation

    from evidence.templatetags.dashboard import BADGE_CLASSES
    from evidence.words import i18n

    with translation.override("zh-hans"):
        assert {word: i18n.word(word) for word in i18n.WORDS} == evidence_page.states.CHINESE
    assert BADGE_CLASSES is evidence_page.states.KINDS


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    sections=st.fixed_dictionaries({name: JSON for name in evidence_page.SECTIONS}),
    manifest=st.fixed_dictionaries({"page": JSON, "sections": JSON, "policy": JSON, "whole": JSON}),
    language=st.sampled_from(evidence_page.LANGUAGES),
)
def test_the_page_is_rendered_from_any_evidence_json_edited_by_hand_without_a_traceback(sections, manifest, language):
    """What a hand-edited evidence.json holds, in any section's place, renders (and so is
    compared) rather than crashing the verifier."""
    document = {"format": evidence_page.FORMAT, **sections, "manifest": manifest}
    page = evidence_page.render_from(document, language).decode("utf-8")
    assert page.startswith("<!doctype html>") and "<script" not in page
