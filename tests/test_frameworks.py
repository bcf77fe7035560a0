"""Receipted tools inside PydanticAI, LangGraph and the OpenAI Agents SDK, killed and started again.

Each agent (``tests/framework_agents``) runs in a child process with its framework's own
offline model, scripted to ask for ``place_order``. The kill is real: the writer's
failpoint SIGKILLs the child after the tool's effect and before its receipt commits. The
agent started again with the same run must not place the order again, must stop with the
call in doubt for a person, and once a person has settled it (``callproof confirm``, what
the dashboard's form does) must go on without running the tool.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from receipts.crashes import kill_at_failpoint
from receipts.integrations import SETTLED_AS_DONE
from tests.helpers import PROJECT

# Each framework, the module its agent imports (skipped with the extra's name when absent).
FRAMEWORKS = {
    "pydantic_ai": ("pydantic_ai", "pydantic-ai"),
    "langgraph": ("langgraph", "langgraph"),
    "openai_agents": ("agents", "openai-agents"),
}
MODES = ["sync", "async"]


@pytest.fixture(params=list(FRAMEWORKS))
def framework(request) -> str:
    module, extra = FRAMEWORKS[request.param]
    pytest.importorskip(module, reason=f"the {extra} extra is not installed (pip install 'callproof[{extra}]')")
    return request.param


@pytest.fixture
def effects(tmp_path) -> Path:
    return tmp_path / "orders.jsonl"  # the shop's side: one line each time place_order's body ran


def environment(effects: Path, **more: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT),
        "EFFECTS_FILE": str(effects),
        "HOME": str(effects.parent),
        **more,
    }


def command(framework: str, run_dir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", f"tests.framework_agents.{framework}", str(run_dir), *flags]


def agent(framework: str, run_dir: Path, effects: Path, *flags: str) -> dict[str, Any]:
    """Run the framework's agent once in a child: its JSON line and exit status."""
    completed = subprocess.run(command(framework, run_dir, *flags), env=environment(effects), capture_output=True,
                               text=True, timeout=120, check=False, cwd=PROJECT)  # fmt: skip
    said = json.loads(completed.stdout.splitlines()[-1]) if completed.stdout.strip() else {}
    return {"exit": completed.returncode, "stderr": completed.stderr[-3000:], **said}


def killed_after_the_effect(framework: str, run_dir: Path, effects: Path, *flags: str) -> str:
    """Start the agent, and SIGKILL it where the writer stopped it: after the tool's effect,
    before its receipt commits (``RECEIPTS_FAILPOINT=after_effect:stop``)."""
    with subprocess.Popen(command(framework, run_dir, *flags), cwd=PROJECT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=environment(effects, RECEIPTS_FAILPOINT="after_effect:stop"),
                          ) as child:  # fmt: skip
        ending = kill_at_failpoint(child, timeout=120)
        return ending if ending == "killed" else f"{ending}: {child.stderr.read().decode()[-3000:]}"  # type: ignore[union-attr]


def effect_lines(effects: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in effects.read_text().splitlines()] if effects.exists() else []


def callproof(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "receipts", *args], capture_output=True, text=True, check=False,
                          cwd=PROJECT)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_killed_after_the_effect_the_agent_stops_in_doubt_and_goes_on_once_a_person_settles(
    framework, mode, run_dir, effects
):
    flags = ["--async"] if mode == "async" else []
    assert killed_after_the_effect(framework, run_dir, effects, *flags) == "killed"
    [placed] = effect_lines(effects)
    [receipt_path] = (run_dir / "receipts").glob("*.json")
    assert json.loads(receipt_path.read_bytes())["status"] == "prepared"

    resumed = agent(framework, run_dir, effects, *flags)
    assert resumed["exit"] == 3 and resumed["in_doubt"] == placed["call_id"], resumed
    assert len(effect_lines(effects)) == 1, "the agent started again never placed the order again"
    replay = json.loads(callproof("replay", "--json", str(run_dir)).stdout)
    [decision] = replay["decisions"]
    assert (decision["call_id"], decision["decision"]) == (placed["call_id"], "confirm"), "shown to a person"

    receipt = receipt_path.read_bytes()
    confirmed = callproof("confirm", str(run_dir), placed["call_id"], "--resolution", "committed",
                          "--reason", "the shop shows the order", "--actor", "ops",
                          "--receipt-sha256", hashlib.sha256(receipt).hexdigest())  # fmt: skip
    assert confirmed.returncode == 0, confirmed.stderr

    settled = agent(framework, run_dir, effects, *flags)
    assert settled["exit"] == 0, settled
    assert json.loads(settled["output"]) == [SETTLED_AS_DONE], "the model was told the call is done"
    assert len(effect_lines(effects)) == 1, "a settled call never runs again"
    assert len(list((run_dir / "receipts").glob("*.json"))) == 1, "one intent, one call_id, in every process"


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_call_asked_for_again_is_answered_from_its_receipt(framework, mode, run_dir, effects):
    flags = ["--async"] if mode == "async" else []
    first = agent(framework, run_dir, effects, "--twice", *flags)
    assert first["exit"] == 0, first
    [placed] = effect_lines(effects)
    answers = json.loads(first["output"])
    assert answers == [f"order {placed['call_id'][:12]}: 2 x A-1"] * 2, "the same answer, from the receipt"

    again = agent(framework, run_dir, effects, *flags)  # a new process, the same run: the same call_id
    assert again["exit"] == 0, again
    assert json.loads(again["output"]) == answers[:1]
    assert len(effect_lines(effects)) == 1
    [receipt] = [json.loads(path.read_bytes()) for path in (run_dir / "receipts").glob("*.json")]
    assert receipt["status"] == "committed"
    assert receipt["args"] == {"order": {"sku": "A-1", "quantity": 2}, "note": "rush"}, "a model, as its JSON"
