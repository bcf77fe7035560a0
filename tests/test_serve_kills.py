"""The kill harness over the socket: the agent, the daemon or both SIGKILLed at each of a call's failpoints.

Each case is run twice: by the writer in process (the reference, as the rest of the suite
kills it) and through ``callproof serve``. Killing the daemon, or both, leaves the disk
in the window the in-process kill leaves it; killing the agent leaves the call as a
killed writer would at that point or later (the daemon finishes the step it is in).
In every case the next call gives the same outcome as in process, and the effect
happened at most once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from receipts import runtime
from receipts.crashes import CALL_FAILPOINTS, CALL_WINDOWS, call_window, kill_at_failpoint, ledger_events
from receipts.runtime.executor import _new_receipt
from tests.helpers import CONTRACT
from tests.served import Daemon, env_for, python_for
from tests.writer import FILE_ARGS, MESSAGE, outbox_lines

ARGS = {"write_file": FILE_ARGS, "send_message": MESSAGE}
# Where a failpoint stops a process: the client runs the effect, the daemon writes the receipts.
CLIENT_SIDE = {"after_effect"}


def call_command(run: Path, tool: str) -> list[str]:
    return [python_for(None), "-m", "receipts", "call", str(run), "--tool", tool, "--args", json.dumps(ARGS[tool])]


def effects(run: Path, tool: str) -> int:
    if tool == "write_file":
        target = run / "workspace" / FILE_ARGS["path"]
        return int(target.exists() and target.read_text() == FILE_ARGS["content"])
    return len(outbox_lines(run))


def call_id_of(run: Path, tool: str) -> str:
    probe = runtime.Executor(run)  # the id only: computed as the writer does, nothing written
    adapter = probe.adapters[tool]
    return _new_receipt(adapter, CONTRACT, 1, adapter.normalise(dict(ARGS[tool])), "call-id-v2")["call_id"]


def finish(run: Path, tool: str, socket: Path | None) -> dict:
    """The next call, unhindered: what the runtime is told."""
    done = subprocess.run(call_command(run, tool), capture_output=True, env=env_for(socket), check=False, timeout=60)
    assert done.stdout, done.stderr
    outcome = json.loads(done.stdout)
    return {"status": outcome["status"], "needs": outcome.get("needs"), "exit": done.returncode}


def wait_stopped(process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = os.waitid(os.P_PID, process.pid, os.WSTOPPED | os.WNOWAIT | os.WNOHANG)
        if state is not None and state.si_code == os.CLD_STOPPED:
            return
        assert process.poll() is None, "the process ended before its failpoint"
        time.sleep(0.002)
    raise AssertionError("the process never stopped at its failpoint")


def in_process(base: Path, tool: str, failpoint: str) -> tuple[str, dict, int]:
    run = base / "in-process"
    runtime.run_init(run, contract_sha256=CONTRACT, writer_socket="")
    child = subprocess.Popen(call_command(run, tool), env=env_for(RECEIPTS_FAILPOINT=f"{failpoint}:stop"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    assert kill_at_failpoint(child, timeout=30) == "killed"
    window = call_window(run, call_id_of(run, tool), {child.pid}, lambda: effects(run, tool) > 0)
    return window, finish(run, tool, None), effects(run, tool)


def served(base: Path, tool: str, failpoint: str, killed: str) -> tuple[str, dict, int]:
    root = base / "runs"
    root.mkdir()
    socket = base / "writer.sock"
    run = root / "served"
    on_client = failpoint in CLIENT_SIDE
    stop_daemon_at = "" if on_client else f"{failpoint}:{'pause' if killed == 'agent' else 'stop'}"
    daemon = Daemon(root, socket, env={"RECEIPTS_FAILPOINT": stop_daemon_at} if stop_daemon_at else None).start()
    try:
        runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(socket))
        agent_env = env_for(socket, **({"RECEIPTS_FAILPOINT": f"{failpoint}:stop"} if on_client else {}))
        agent = subprocess.Popen(call_command(run, tool), env=agent_env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        assert daemon.process is not None
        pids = {daemon.process.pid}
        wait_stopped(agent if on_client else daemon.process)
        before = len(daemon.events())
        if killed == "both":
            agent.kill()
            daemon.kill()
        elif killed == "daemon":
            daemon.kill()
            agent.send_signal(signal.SIGCONT)  # stopped or not, the agent goes on and finds the daemon gone
        else:
            agent.kill()
            agent.wait(timeout=30)
            # Let go, the daemon finishes the step it stopped in (or reads that the agent is gone)
            # and has nobody to tell.
            if not on_client:
                daemon.process.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 30
            while len(daemon.events()) == before:
                assert time.monotonic() < deadline, daemon.log.read_text()
                time.sleep(0.01)
        agent.wait(timeout=30)
        window = call_window(run, call_id_of(run, tool), pids, lambda: effects(run, tool) > 0)
    finally:
        daemon.stop()
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
    with Daemon(root, socket):
        outcome = finish(run, tool, socket)
    return window, outcome, effects(run, tool)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, dict[str, tuple[str, dict, int]]]:
    """For each tool, by failpoint and by the window it leaves: the in-process kill's window, outcome, effects."""
    table: dict[str, dict[str, tuple[str, dict, int]]] = {}
    for tool in ARGS:
        table[tool] = {}
        for failpoint in CALL_FAILPOINTS:
            window, outcome, count = in_process(tmp_path_factory.mktemp(tool), tool, failpoint)
            table[tool][failpoint] = table[tool][window] = (window, outcome, count)
        clean = tmp_path_factory.mktemp(tool) / "clean"
        runtime.run_init(clean, contract_sha256=CONTRACT, writer_socket="")
        subprocess.run(call_command(clean, tool), env=env_for(), check=True, capture_output=True)
        table[tool]["recorded"] = ("recorded", finish(clean, tool, None), effects(clean, tool))
    return table


@pytest.mark.parametrize("tool", ["write_file", "send_message"])
@pytest.mark.parametrize("failpoint", CALL_FAILPOINTS)
def test_a_kill_over_the_socket_ends_as_the_same_kill_in_process(tool, failpoint, shared_tmp, references):
    window_then, outcome_then, effects_then = references[tool][failpoint]
    for killed in ("daemon", "both"):
        base = shared_tmp / killed
        base.mkdir()
        # The daemon's disk is the writer's: killed there (alone or with the agent), the same window.
        assert served(base, tool, failpoint, killed) == (window_then, outcome_then, effects_then), killed
    base = shared_tmp / "agent"
    base.mkdir()
    window, outcome, count = served(base, tool, failpoint, "agent")
    # The agent killed, the daemon finishes the step it was in: the call is where a writer killed at
    # that point or later leaves it, and goes on as it does from there.
    assert CALL_WINDOWS.index(window) >= CALL_WINDOWS.index(window_then), (window, window_then)
    assert (outcome, count) == references[tool][window][1:], (window, outcome, count)
    assert count <= 1
    if failpoint in CLIENT_SIDE:
        # Killed with the effect done and the daemon not told: the window the kill tests exist for.
        assert window == window_then == "effect_done_receipt_prepared"


# --- random kills ---------------------------------------------------------------------


def random_trial(base: Path, tool: str, rng: random.Random, span: float) -> tuple[str, str, list[str]]:
    """One call through a daemon, SIGKILLed at a random moment (the daemon, the agent or both), then
    finished: which was killed, the window the kill left, and every promise the disk breaks."""
    root = base / "runs"
    root.mkdir(parents=True)
    socket = base / "writer.sock"
    run = root / "served"
    killed = rng.choice(("daemon", "agent", "both"))
    with Daemon(root, socket) as daemon:
        runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(socket))
        agent = subprocess.Popen(call_command(run, tool), env=env_for(socket), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        wait_for_the_call_lock(run, agent)
        time.sleep(rng.uniform(0, span))
        assert daemon.process is not None
        pids = {daemon.process.pid}
        if killed in ("agent", "both"):
            agent.kill()
        if killed in ("daemon", "both"):
            daemon.kill()
        agent.wait(timeout=60)
        window = call_window(run, call_id_of(run, tool), pids, lambda: effects(run, tool) > 0)
    with Daemon(root, socket):
        outcome = finish(run, tool, socket)
    problems = []
    count = effects(run, tool)
    if count > 1:
        problems.append(f"{count} effects")
    if outcome["status"] == "committed" and (count != 1 or outcome["needs"]):
        problems.append(f"committed with {count} effects, needs {outcome['needs']}")
    if outcome["status"] != "committed" and outcome["needs"] != "confirmation":
        problems.append(f"neither committed nor waiting for a person: {outcome}")
    if tool == "write_file" and outcome["status"] != "committed":
        problems.append(f"a queryable call not resumed: {outcome}")
    _, chain = ledger_events(run)
    problems += chain
    return killed, window, problems


def wait_for_the_call_lock(run: Path, agent: subprocess.Popen) -> None:
    """Until the daemon takes the call's lock (its first file for the call), or the agent ends."""
    writer = run / ".writer"
    while agent.poll() is None:
        with contextlib.suppress(FileNotFoundError):
            if any(name.startswith("call-") for name in os.listdir(writer)):
                return
        time.sleep(0.0002)


def call_span(base: Path, tool: str) -> float:
    """How long a call through a daemon takes here from its lock to the agent's exit: kills are drawn
    over 1.5 times it, so that they fall all over the daemon's writes and some past them."""
    root = base / "runs"
    root.mkdir(parents=True)
    spans = []
    with Daemon(root, base / "writer.sock"):
        for number in range(3):
            run = root / f"timed-{number}"
            runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(base / "writer.sock"))
            agent = subprocess.Popen(call_command(run, tool), env=env_for(base / "writer.sock"),
                                     stdout=subprocess.DEVNULL)  # fmt: skip
            wait_for_the_call_lock(run, agent)
            started = time.monotonic()
            agent.wait(timeout=60)
            spans.append(time.monotonic() - started)
    return 1.5 * sorted(spans)[1]


@pytest.mark.parametrize("tool", ["write_file", "send_message"])
def test_random_kills_over_the_socket_break_no_promise(tool, shared_tmp):
    rng = random.Random(f"serve-{tool}")
    span = call_span(shared_tmp / "calibration", tool)
    results = [random_trial(shared_tmp / f"trial-{number}", tool, rng, span) for number in range(4)]
    assert [problems for _, _, problems in results if problems] == []


def main() -> None:
    """``python -m tests.test_serve_kills TRIALS``: the random kills, many times, with the windows they reached."""
    import collections
    import sys
    import tempfile

    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for tool in ("write_file", "send_message"):
        with tempfile.TemporaryDirectory(prefix="serve-kills-") as scratch:
            span = call_span(Path(scratch) / "calibration", tool)
            rng = random.Random(f"serve-{tool}")
            results = [random_trial(Path(scratch) / f"trial-{n}", tool, rng, span) for n in range(trials)]
        windows = collections.Counter((killed, window) for killed, window, _ in results)
        violations = [problems for _, _, problems in results if problems]
        print(f"{tool}: {trials} trials, {len(violations)} with a violation {violations[:3]}")
        for (killed, window), count in sorted(windows.items()):
            print(f"  {killed:<7} {window:<30} {count}")


if __name__ == "__main__":
    main()
