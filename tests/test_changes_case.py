"""apply_changes never makes a version whose paths collide on a case-insensitive filesystem.

``A.txt`` and ``a.txt`` are two files on Linux and one on macOS' and Windows' default
filesystems: a tree holding both cannot be checked out there (the content mode's build
aside would find one file where it planned two, and leave the call in doubt). The change
set, or the version it would make from the tree as it stands, is refused before anything is
written: a rejection, nothing made current. Issue 55, case 10. Real writer processes, real git.
"""

from __future__ import annotations

import json

import pytest

from receipts.changes import ApplyChanges, planned_manifest
from receipts.tools import Rejected
from tests.test_changes import MODES, call, files
from tests.writer import receipt_of


def rejected(completed, run_dir) -> str:
    """The rejection's message, from the call's output and its receipt (which says rejected)."""
    outcome = json.loads(completed.stdout)
    assert completed.returncode != 0 and outcome["status"] == "rejected", completed.stdout
    assert receipt_of(run_dir, outcome["call_id"])["status"] == "rejected"
    return outcome["error"]["message"]


@pytest.mark.parametrize("mode", MODES)
def test_two_paths_of_one_change_set_that_differ_only_by_case_are_refused(run_dir, mode):
    for pair in (["A.txt", "a.txt"], ["Docs/a.txt", "docs/b.txt"], ["README", "readme/notes.txt"]):
        changes = [{"path": path, "content": f"{path}\n"} for path in pair]
        said = rejected(call(run_dir, mode, changes), run_dir)
        assert "case" in said and all(path.split("/")[0] in said for path in pair), said
    assert not (run_dir / "workspace" / "site").exists() and not (run_dir / "workspace" / "site.git").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_path_that_differs_only_by_case_from_one_the_tree_holds_is_refused(run_dir, mode):
    assert call(run_dir, mode, [{"path": "Notes/A.txt", "content": "a\n"}]).returncode == 0
    before = files(run_dir, mode)
    for path in ("Notes/a.txt", "notes/b.txt", "NOTES"):
        said = rejected(call(run_dir, mode, [{"path": path, "content": "b\n"}]), run_dir)
        assert "case" in said and path.split("/")[0] in said, said
    assert files(run_dir, mode) == before, "nothing made current"
    # A rename by case (the old name removed in the same change set) is no collision.
    renamed = call(run_dir, mode, [{"path": "Notes/A.txt", "remove": True}, {"path": "Notes/a.txt", "content": "a\n"}])
    assert renamed.returncode == 0, renamed.stdout
    assert list(files(run_dir, mode)) == ["Notes/a.txt"]


def test_the_rule_is_the_adapters_own_before_anything_is_written():
    adapter = ApplyChanges()
    with pytest.raises(Rejected, match="case"):
        adapter.normalise(
            {"tree": "site", "changes": [{"path": "A.txt", "content": ""}, {"path": "a.txt", "content": ""}]}
        )
    # One removed and one written is a rename: the adapter takes it; the tree decides.
    adapter.normalise(
        {"tree": "site", "changes": [{"path": "A.txt", "remove": True}, {"path": "a.txt", "content": ""}]}
    )
    with pytest.raises(Rejected, match="case"):
        planned_manifest({"A.txt": "0" * 64}, [{"path": "a.txt", "content": "x"}])
    # Case-folding, not only lower case: the German sharp s folds to "ss".
    with pytest.raises(Rejected, match="case"):
        planned_manifest({"STRASSE.txt": "0" * 64}, [{"path": "straße.txt", "content": "x"}])
    assert list(planned_manifest({"A.txt": "0" * 64}, [{"path": "b.txt", "content": "x"}])) == ["A.txt", "b.txt"]
