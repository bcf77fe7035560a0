"""apply_changes (receipts/changes.py): several files as one version, made current in one atomic step.

Real run directories, real writer processes killed at the adapter's failpoints, real git. The
kill harness with a reader process is tests/test_torture.py; the conformance kit runs below.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess

import pytest
from django.urls import reverse
from django.utils.html import strip_tags

from evidence.ingest import importer
from receipts import runtime
from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.changes import ApplyChanges, open_tree, planned_manifest, tree_digest
from receipts.demo import writer_command, writer_env
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, OutcomeUnknown, Rejected
from tests.helpers import PROJECT, content
from tests.test_docs_adapters import example, run

MODES = [
    "content",
    pytest.param("git", marks=pytest.mark.skipif(shutil.which("git") is None, reason="git is not on PATH")),
]
FIRST = [{"path": "index.html", "content": "<h1>v0</h1>\n"}, {"path": "old.txt", "content": "old\n"}]
SECOND = [{"path": "old.txt", "remove": True}, {"path": "index.html", "content": "<h1>v1</h1>\n"},
          {"path": "news/today.txt", "content": "new\n"}]  # fmt: skip
ADAPTER = ApplyChanges()


def call(run_dir, mode, changes, **env):
    """``callproof call`` in its own process; ``env`` may set a failpoint."""
    args = json.dumps({"tree": "site", "mode": mode, "changes": changes})
    command = writer_command("call", str(run_dir), "--tool", "apply_changes", "--args", args)
    return subprocess.run(command, capture_output=True, text=True, env=writer_env(**env), check=False)


def files(run_dir, mode) -> dict[str, str]:
    tree = open_tree(run_dir, {"tree": "site", "mode": mode})
    current = tree.current()
    assert current is not None, "the tree has a current version"
    return tree.manifest(current)


def test_normalise_sorts_the_changes_and_refuses_what_leaves_or_repeats():
    one = ADAPTER.normalise({"tree": "site", "changes": SECOND})
    other = ADAPTER.normalise({"tree": "site", "changes": list(reversed(SECOND))})
    assert one == other and [change["path"] for change in one["changes"]] == ["index.html", "news/today.txt", "old.txt"]
    assert one["mode"] == "content"
    for bad in (
        {"tree": "../x", "changes": FIRST},
        {"tree": "site.git", "changes": FIRST},
        {"tree": "site", "changes": []},
        {"tree": "site", "changes": [{"path": "../etc/passwd", "content": "x"}]},
        {"tree": "site", "changes": [{"path": "a", "content": "x"}, {"path": "./a", "remove": True}]},
        {"tree": "site", "changes": [{"path": "a", "content": "x", "remove": True}]},
        {"tree": "site", "changes": FIRST, "mode": "svn"},
        {"tree": "site", "changes": [{"path": str(n), "content": ""} for n in range(1001)]},
    ):
        with pytest.raises(Rejected):
            ADAPTER.normalise(bad)
    with pytest.raises(Rejected, match="both a file and a folder"):
        planned_manifest({"a": "0" * 64}, [{"path": "a/b", "content": "x"}])


@pytest.mark.parametrize("mode", MODES)
def test_the_version_holds_every_change_and_the_result_says_which(run_dir, mode):
    assert call(run_dir, mode, FIRST).returncode == 0
    before = files(run_dir, mode)
    done = call(run_dir, mode, SECOND)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["result"]
    after = files(run_dir, mode)
    assert set(after) == {"index.html", "news/today.txt"} and result["files_sha256"] == tree_digest(after)
    assert result["base"] == (before and json.loads(call(run_dir, mode, FIRST).stdout)["result"]["version"])
    # The same files give the same digest in either mode; the content mode's version is that digest.
    assert result["files_sha256"] == tree_digest(planned_manifest(before, ADAPTER.normalise(
        {"tree": "site", "changes": SECOND})["changes"]))  # fmt: skip
    assert (result["version"] == result["files_sha256"]) == (mode == "content")
    assert "apply_changes" in BUILTIN_ADAPTERS
    # Everything it wrote is under workspace/: nothing of it in the run directory's root or .writer/.
    assert not any(".versions" in str(path) or "site" in path.name for path in (run_dir / ".writer").rglob("*"))


@pytest.mark.parametrize("mode", MODES)
def test_killed_before_the_version_is_current_the_resume_finds_it_not_done_and_makes_it_once(run_dir, mode):
    assert call(run_dir, mode, FIRST).returncode == 0
    before = files(run_dir, mode)
    killed = call(run_dir, mode, SECOND, RECEIPTS_FAILPOINT="apply_before_current")
    assert killed.returncode == 137
    [receipt] = [path for path in (run_dir / "receipts").glob("*.json") if "prepared" in path.read_text()]
    args = json.loads(receipt.read_text())["args"]
    assert files(run_dir, mode) == before, "built aside and recorded, not current"
    found = ADAPTER.evidence(run_dir, args, receipt.stem)
    assert found.verdict == ABSENT and "never made current" in found.facts[0]
    assert ADAPTER.query(run_dir, args, receipt.stem) is NOT_DONE
    resumed = call(run_dir, mode, SECOND)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["status"] == "committed"
    assert set(files(run_dir, mode)) == {"index.html", "news/today.txt"}
    assert ADAPTER.evidence(run_dir, args, receipt.stem, json.loads(resumed.stdout)["result"]).verdict == PRESENT


@pytest.mark.parametrize("mode", MODES)
def test_a_call_whose_tree_moved_on_is_in_doubt_and_one_left_by_a_later_call_was_done(run_dir, mode):
    assert call(run_dir, mode, FIRST).returncode == 0
    assert call(run_dir, mode, SECOND, RECEIPTS_FAILPOINT="apply_before_current").returncode == 137
    [receipt] = [path for path in (run_dir / "receipts").glob("*.json") if "prepared" in path.read_text()]
    args = json.loads(receipt.read_text())["args"]
    # Another call moves the tree before this one is resumed: neither version is current.
    executor = runtime.Executor(run_dir)
    assert executor.call("apply_changes", {"tree": "site", "mode": mode, "changes": [
        {"path": "other.txt", "content": "x"}]}).status == "committed"  # fmt: skip
    assert ADAPTER.evidence(run_dir, args, receipt.stem).verdict == UNCLEAR
    with pytest.raises(OutcomeUnknown):
        ADAPTER.query(run_dir, args, receipt.stem)
    # A call made current, then left by a later call: still done (its version was current).
    third = executor.call("apply_changes", {"tree": "site", "mode": mode, "changes": [{"path": "x", "content": "3"}]})
    executor.call("apply_changes", {"tree": "site", "mode": mode, "changes": [{"path": "x", "content": "4"}]})
    third_args = ADAPTER.normalise({"tree": "site", "mode": mode, "changes": [{"path": "x", "content": "3"}]})
    assert ADAPTER.evidence(run_dir, third_args, third.call_id, third.result).verdict == PRESENT
    assert ADAPTER.query(run_dir, third_args, third.call_id) == third.result


def test_a_tree_kept_one_way_is_refused_the_other_and_a_tampered_version_is_not_taken(run_dir):
    assert call(run_dir, "content", FIRST).returncode == 0
    refused = call(run_dir, "git", FIRST)
    assert refused.returncode == 3 and "call with mode content" in refused.stdout
    [receipt] = [path for path in (run_dir / "receipts").glob("*.json") if '"committed"' in path.read_text()]
    recorded = json.loads(receipt.read_text())
    version = run_dir / "workspace" / os.readlink(run_dir / "workspace" / "site")
    (version / "old.txt").write_text("edited in place\n")
    found = ADAPTER.evidence(run_dir, recorded["args"], receipt.stem, recorded["result"])
    assert found.verdict == UNCLEAR and "no longer holds the files" in found.facts[0]
    # A symlink planted in a version is never followed by a reader of the evidence.
    (version / "old.txt").unlink()
    (version / "old.txt").symlink_to("/etc/passwd")
    assert ADAPTER.evidence(run_dir, recorded["args"], receipt.stem).verdict == UNCLEAR


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not on PATH")
def test_git_is_not_run_on_a_repository_with_settings_it_does_not_make(run_dir):
    assert call(run_dir, "git", FIRST).returncode == 0
    config = run_dir / "workspace" / "site.git" / "config"
    config.write_text(config.read_text() + "\tfsmonitor = touch /tmp/owned\n")
    refused = call(run_dir, "git", SECOND)
    assert refused.returncode == 3 and "settings this tool does not make" in refused.stdout


@pytest.mark.slow
@pytest.mark.parametrize("spec", [
    "receipts.changes:ApplyChanges",
    pytest.param("receipts.changes:apply_changes_git",
                 marks=pytest.mark.skipif(shutil.which("git") is None, reason="git is not on PATH")),
])  # fmt: skip
def test_the_conformance_kit_passes_both_modes(tmp_path, spec):
    completed = subprocess.run(
        writer_command("conformance", spec, "--trials", "6", "--key-wait", "1", "--json"),
        capture_output=True, text=True, cwd=PROJECT, env=writer_env(TMPDIR=str(tmp_path)), check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    verdicts = {check["name"]: check["verdict"] for check in json.loads(completed.stdout)["checks"]}
    # Counted by its evidence (no counter: the content mode keeps no count of swaps); it keeps versions for ever.
    assert {name for name, verdict in verdicts.items() if verdict != "pass"} == {
        "evidence_matches_target", "past_key_retention"}  # fmt: skip


@pytest.mark.django_db
def test_the_call_page_shows_an_apply_changes_call_in_doubt_with_its_evidence(run_dir, logged_in):
    assert call(run_dir, "content", FIRST).returncode == 0
    assert call(run_dir, "content", SECOND, RECEIPTS_FAILPOINT="after_effect").returncode == 137
    [receipt] = [path for path in (run_dir / "receipts").glob("*.json") if "prepared" in path.read_text()]
    importer.run_import(path=run_dir)
    page = content(logged_in.get(reverse("call", args=[run_dir.name, receipt.stem])))
    shown = html.unescape(strip_tags(page))
    assert "This call is in doubt" in page and 'badge-info">present' in page
    assert "workspace/site is at the version this call makes" in shown and "2 files" in shown
    assert "Run the tool apply_changes with" in shown
    chinese = content(logged_in.get(reverse("call", args=[run_dir.name, receipt.stem]), HTTP_ACCEPT_LANGUAGE="zh-hans"))
    assert "处于该调用生成的版本" in html.unescape(strip_tags(chinese))


def test_the_guides_example_runs_in_an_empty_folder_and_prints_what_it_says(tmp_path):
    """docs/runtime-authors.md, "Several files as one version": the block as it stands."""
    code, promised = example("apply_changes")
    completed = run(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == promised
