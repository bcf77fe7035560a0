"""The runtime authors' examples (the decorator, the SQL and HTTP adapters) run and print what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.helpers import PROJECT
from tests.idempotent_service import Service

GUIDE = PROJECT / "docs" / "runtime-authors.md"


def example(name: str) -> tuple[str, str]:
    """The block under ``<!-- example: NAME -->`` and what its last line says it prints."""
    [code] = re.findall(rf"<!-- example: {name} -->\n```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    said = re.search(r"  # (.+)$", code.rstrip().splitlines()[-1])
    assert said is not None, "the example says what it prints"
    return code, said.group(1)


def run(code: str, cwd, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {"PYTHONPATH": str(PROJECT), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=environment,
                          check=False)  # fmt: skip


# Each example, and the package it needs beyond the writer (an agent framework's extra).
EXAMPLES = {"decorator": None, "sql": None, "pydantic_ai": "pydantic_ai", "langgraph": "langgraph",
            "openai_agents": "agents"}  # fmt: skip


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_the_example_runs_in_an_empty_folder(tmp_path, name):
    needs = EXAMPLES[name]
    if needs:
        pytest.importorskip(needs, reason=f"{needs} is not installed (its callproof extra)")
    code, promised = example(name)
    completed = run(code, tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == promised
    assert len(list((tmp_path / "runs" / "run-1" / "receipts").glob("*.json"))) == 1


def test_the_http_example_runs_against_a_service_that_drops_its_first_answer(tmp_path):
    code, promised = example("http")
    with Service() as service:
        service.script = ["drop"]
        completed = run(code, tmp_path, CALLPROOF_HTTP_URL=f"{service.url}/v1/charges")
        charges = list(service.charges)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == promised
    assert len(charges) == 1, "the retry was answered from the key"


def test_the_test_service_runs_on_its_own_and_prints_its_address():
    with subprocess.Popen([sys.executable, "-m", "tests.idempotent_service"], cwd=PROJECT, stdout=subprocess.PIPE,
                          text=True) as served:  # fmt: skip
        try:
            address = served.stdout.readline().strip()  # type: ignore[union-attr]
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+", address), address
            lookup = f"{address}/v1/charges?idempotency_key=none"
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(lookup, timeout=10)  # noqa: S310 - the address it printed
            answer.value.close()
            assert answer.value.code == 404, "no charge was made"
        finally:
            served.terminate()
