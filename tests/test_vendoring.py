"""The runtime authors' guide names the modules a runtime copies to vendor the writer: with those alone, it writes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from tests.helpers import PROJECT

GUIDE = PROJECT / "docs" / "runtime-authors.md"

CALL = """
from pathlib import Path
from receipts import runtime
runtime.run_init(Path("runs/run-1"), contract_sha256="0" * 64)
print(runtime.Executor(Path("runs/run-1")).call("write_file", {"path": "a.txt", "content": "hi"}).status)
import receipts.serve  # the daemon, with the module the guide adds for it
"""


def test_the_modules_the_guide_names_are_enough_to_write(tmp_path):
    text = " ".join(GUIDE.read_text(encoding="utf-8").split())
    [listed] = re.findall(r"The writer \(`receipts\.runtime`\) needs (.*?) \(the daemon adds `([\w.]+)`", text)
    names = [*re.findall(r"`([\w./]+\.py)`", listed[0]), listed[1]]
    package = tmp_path / "vendored" / "receipts"
    package.mkdir(parents=True)
    for name in names:
        (package / name).parent.mkdir(parents=True, exist_ok=True)  # runtime/ is a package of its own
        shutil.copy(PROJECT / "receipts" / name, package / name)
    # -S: no site-packages, where the editable install of the checkout would supply any module the
    # guide forgot (its finder answers for receipts.* that the vendored copy lacks).
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, 'vendored')\n{CALL}"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, (names, done.stderr)
    assert done.stdout.strip() == "committed"
