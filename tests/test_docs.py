"""Every relative link in the README and docs/ resolves to a file of the checkout (and an
anchor-only link to a heading of its page): a newcomer following them never meets a 404."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import PROJECT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [PROJECT / "README.md", PROJECT / "CHANGELOG.md", *sorted((PROJECT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lowercase, punctuation dropped, spaces as hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def link_resolves(page: Path, target: str) -> bool:
    """A relative link of ``page``: to a file of the checkout, and to a heading of it for an anchor."""
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    inside = resolved.exists() and resolved.is_relative_to(PROJECT)
    return inside and (not anchor or resolved.suffix != ".md" or anchor in anchors(resolved))


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(PROJECT)) for page in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto: — not ours to check offline
        if not link_resolves(page, target):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"


def test_the_readmes_writer_example_runs_and_prints_what_it_says_every_time(tmp_path):
    """The ten lines a runtime author copies first: run as they stand, in an empty folder, and run
    again, as anyone trying them does: the second run resumes the run the first made, prints the
    same, and sends nothing more (issue 37: it stopped on FileExistsError)."""
    import subprocess
    import sys

    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    [example] = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    said = re.search(r"# (committed True True)$", example, re.MULTILINE)
    assert said is not None, "the example says what it prints"
    promised = said.group(1)
    outbox = tmp_path / "runs" / "run-1" / "outbox.jsonl"
    for _ in range(2):
        completed = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                                   env={"PYTHONPATH": str(PROJECT), "PATH": "/usr/bin:/bin"}, check=False)  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.strip() == promised
        assert len(outbox.read_text().splitlines()) == 1, "one message, however often the example runs"
    assert (tmp_path / "runs" / "run-1" / "events.jsonl").stat().st_size > 0
