"""docs/seed-requirements.md says, for each requirement of the seed articles, which tests prove it
and which docs say how. A test renamed or removed, or a heading reworded, would leave the table
citing nothing: these tests read the table and fail on any citation that does not resolve. The
page's session of ``callproof`` (where its output differs from the article's) is run for real."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import PROJECT
from tests.test_docs import LINK, link_resolves

PAGE = PROJECT / "docs" / "seed-requirements.md"
STATUSES = ("met differently", "not met", "met")  # longest first: "met differently" starts with "met"
TEST = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")

EXEMPT: dict[str, str] = {}  # a row whose citations may not exist yet, with why (none now)


def rows(text: str) -> dict[str, list[str]]:
    """Each table row by its id (R1, T1, ...): its cells, the id's cell left out."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"[A-Z]\d+", cells[0]):
            assert cells[0] not in found, f"{cells[0]} is in the table twice"
            found[cells[0]] = cells[1:]
    return found


def defined(path: Path, name: str) -> bool:
    """Whether a test module defines ``name`` at its top level (what ``file::name`` selects)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name for node in tree.body)


def problems(page: Path, text: str, exempt: dict[str, str]) -> list[str]:
    """What does not hold in a table of requirements: each as a line naming its row."""
    found = []
    table = rows(text)
    for row_id in exempt:
        if row_id not in table:
            found.append(f"{row_id}: exempt, but not in the table")
    for row_id, cells in table.items():
        if len(cells) != 4:
            found.append(f"{row_id}: {len(cells)} cells after the id, not 4")
            continue
        asks, status, where, proved_by = cells
        if not re.search(r"\(§\d\)\.$|\(opening\)\.$", asks):
            found.append(f"{row_id}: the requirement does not end with its section")
        if not status.startswith(STATUSES):
            found.append(f"{row_id}: status {status!r} is none of {STATUSES}")
        links = [target for target in LINK.findall(where) if not re.match(r"[a-z]+:", target)]
        tests = TEST.findall(proved_by)
        if not links:
            found.append(f"{row_id}: no doc section cited")
        if not tests:
            found.append(f"{row_id}: no test cited")
        if row_id in exempt:
            continue
        found += [f"{row_id}: link {target} does not resolve" for target in links if not link_resolves(page, target)]
        for file, name in tests:
            if not (PROJECT / file).is_file():
                found.append(f"{row_id}: {file} does not exist")
            elif name and not defined(PROJECT / file, name):
                found.append(f"{row_id}: {file} has no test {name}")
    return found


def test_every_cited_test_and_link_of_the_seed_requirements_exists():
    assert problems(PAGE, PAGE.read_text(encoding="utf-8"), EXEMPT) == []


def test_both_articles_have_their_table():
    table = rows(PAGE.read_text(encoding="utf-8"))
    for prefix in ("R", "T"):
        numbers = sorted(int(row_id[1:]) for row_id in table if row_id[0] == prefix)
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 10, (prefix, numbers)


def test_a_row_citing_what_is_not_there_is_reported():
    """The check itself: every kind of broken citation is caught, and a sound row passes."""
    page = PROJECT / "docs" / "a-page-that-is-not-there.md"  # links resolve from docs/, as the real page's do
    sound = "[call_id](RUN_DIRECTORY.md#call_id) | `tests/test_protocol.py::test_make_call_id_matches_every_vector`"
    text = "\n".join([
        "| id | asks | status | where | proved by |",
        "|---|---|---|---|---|",
        f"| R1 | A sound row (§1). | met | {sound} |",
        "| R2 | A missing file (§1). | met | [x](RUN_DIRECTORY.md) | `tests/test_nonesuch.py` |",
        "| R3 | A missing test (§2). | met | [x](RUN_DIRECTORY.md) | `tests/test_protocol.py::test_nonesuch` |",
        "| R4 | A missing page (§3). | not met | [x](nonesuch.md) | `tests/test_protocol.py` |",
        "| R5 | A missing heading (§3). | met | [x](RUN_DIRECTORY.md#nonesuch) | `tests/test_protocol.py` |",
        "| R6 | An unknown status (§4). | done | [x](RUN_DIRECTORY.md) | `tests/test_protocol.py` |",
        "| R7 | Nothing cited (§4). | met | RUN_DIRECTORY.md | tests/test_protocol.py |",
        "| R8 | Exempt, so unchecked (§4). | met | [x](nonesuch.md) | `tests/test_nonesuch.py::test_x` |",
        "| R9 | No section. | met | [x](RUN_DIRECTORY.md) | `tests/test_protocol.py` |",
    ])  # fmt: skip
    assert problems(page, text, {"R8": "a reason", "R10": "a row that is not there"}) == [
        "R10: exempt, but not in the table",
        "R2: tests/test_nonesuch.py does not exist",
        "R3: tests/test_protocol.py has no test test_nonesuch",
        "R4: link nonesuch.md does not resolve",
        "R5: link RUN_DIRECTORY.md#nonesuch does not resolve",
        "R6: status 'done' is none of ('met differently', 'not met', 'met')",
        "R7: no doc section cited",
        "R7: no test cited",
        "R9: the requirement does not end with its section",
    ]


CONSOLE = re.compile(r"^```console\n(.*?)^```$", re.DOTALL | re.MULTILINE)
HEX = re.compile(r"\b[0-9a-f]{12,64}\b")
EXITS = re.compile(r"#\s*exits (\d+)$")


def session(text: str) -> list[tuple[str, str]]:
    """The page's ``console`` blocks as (command, what it prints): each ``$`` line, and the lines
    up to the next one."""
    steps: list[tuple[str, str]] = []
    for block in CONSOLE.findall(text):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], ""))
            else:
                command, printed = steps[-1]
                steps[-1] = (command, printed + line + "\n")
    return steps


def hexless(text: str) -> str:
    """Digests and call_ids as their lengths: a new tool version gives new ones, the lines stay."""
    return HEX.sub(lambda found: f"<{len(found.group())} hex digits>", text)


def test_the_session_on_the_page_is_what_callproof_prints(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    steps = session(text)
    commands = " ".join(command for command, _ in steps)
    assert all(f"callproof {name} " in commands for name in ("init", "call", "replay", "state")), commands
    # The checkout's writer, in this process's Python, in process: no daemon's socket.
    environment = {name: value for name, value in os.environ.items() if name != "RECEIPTS_WRITER_SOCKET"}
    environment |= {"PYTHONPATH": str(PROJECT), "CALLPROOF_PYTHON": sys.executable}
    define = 'callproof() { "$CALLPROOF_PYTHON" -m receipts "$@"; }\n'
    for command, printed in steps:
        ran = subprocess.run(["bash", "-c", define + command], cwd=tmp_path, env=environment,
                             capture_output=True, text=True, check=False)  # fmt: skip
        exits = EXITS.search(command)
        assert ran.returncode == (int(exits.group(1)) if exits else 0), (command, ran.stderr)
        assert hexless(ran.stdout + ran.stderr) == hexless(printed), command


def test_r11_says_it_is_met_only_under_the_writer_daemon():
    """By default the writer runs in the agent's process, as the agent's user: it can write the
    receipts. The row must not say "met" alone."""
    status = rows(PAGE.read_text(encoding="utf-8"))["R11"][1]
    assert status.startswith("met only under `callproof serve`") and "agent's user" in status


def test_each_line_and_refusal_of_the_article_has_its_difference_on_the_page():
    text = PAGE.read_text(encoding="utf-8")
    for seed in (
        "call_id=54703f6f4ab1 receipt=54703f6f4ab1a892.json reused=True",
        "receipt_ok=True status=committed tool=apply_patch",
        "state forbids tools: finished",
    ):
        assert f"```text\n{seed}\n```" in text, seed
