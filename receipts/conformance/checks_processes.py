"""The checks that take several processes: normalise the same in each, calls at once, and SIGKILL
at every window of the write followed by a clean resume."""

from __future__ import annotations

import functools
import json
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from receipts import protocol
from receipts.conformance.child import STEP_TIMEOUT, Ended
from receipts.conformance.effects import count_text
from receipts.conformance.report import NOT_APPLICABLE, Check, short_text, verdict
from receipts.crashes import CALL_EFFECT_DONE_UNRECORDED, CALL_FAILPOINTS, call_window, ledger_events
from receipts.tools import Rejected

if TYPE_CHECKING:
    from receipts.conformance.kit import Kit

# Random kills are drawn up to this multiple of a clean call's time (ready to exit), so some
# land after the write is done (a reuse, the exit) and the whole of it is covered.
SPAN_MARGIN = 1.5
CALIBRATION_RUNS = 3
MAX_KILLS = 3
RANDOM = "random"  # a kill at a random moment, not at a failpoint
KILL_PLAN = (*CALL_FAILPOINTS, RANDOM)


def normalise_in_general(kit: Kit) -> Check:
    problems, accepted, refused = [], [], 0
    for raw in kit.raw_generated:
        try:
            normalised = kit.adapter.normalise(json.loads(json.dumps(raw)))
        except Rejected:
            refused += 1
            continue
        except Exception as error:  # noqa: BLE001 - a normalise must refuse with Rejected
            problems.append(f"normalise raised {type(error).__name__} on {short_text(raw)}: refuse with Rejected")
            continue
        try:
            again = kit.adapter.normalise(json.loads(json.dumps(normalised)))
        except Exception as error:  # noqa: BLE001 - said as the fault it is
            again = {"refused": f"{type(error).__name__}: {error}"}
        if protocol.canonical_json(again) != protocol.canonical_json(normalised):
            twice, once = short_text(again), short_text(normalised)
            problems.append(f"normalising {short_text(raw)} twice gives {twice}, not {once}: a resume from "
                            "the receipt's args gets a new call_id")  # fmt: skip
        accepted.append((raw, normalised))
    elsewhere = kit.child(kit.root, mode="normalise", args_list=[raw for raw, _ in accepted]).end()
    theirs = elsewhere.output.get("normalised")
    if not isinstance(theirs, list) or len(theirs) != len(accepted):
        problems.append(f"normalising in another process ended {elsewhere.describe()}")
    else:
        for (raw, normalised), other in zip(accepted, theirs, strict=True):
            if protocol.canonical_json(other) != protocol.canonical_json(normalised):
                problems.append(f"{short_text(raw)} normalises to {short_text(other)} in another process, not "
                                f"{short_text(normalised)}: each process computes another call_id")  # fmt: skip
                break
    said = [f"{len(kit.raw_generated)} arg sets (the example's and {kit.generated_by}): {len(accepted)} "
            f"accepted, {refused} refused; each normalised twice, and once in another process"]  # fmt: skip
    return verdict("normalise_in_general", problems[:5], said)


def concurrency(kit: Kit) -> Check:
    run_dir, call_id = kit.new_run("together")
    children = [kit.child(run_dir, wait_for_go=True) for _ in range(kit.concurrency)]
    for child in children:
        child.wait_ready()
    for child in children:
        child.go()
    ended = [child.end() for child in children]
    effects = kit.count(run_dir, call_id)
    outcomes = Counter(
        "reused" if end.committed and end.output.get("reused") else "committed" if end.committed else end.describe()
        for end in ended
    )
    problems = []
    if effects != 1:
        problems.append(f"{kit.concurrency} calls at once left {count_text(effects)}")
    if not all(end.committed for end in ended):
        problems.append("not every call ended committed")
    said = [f"{kit.concurrency} processes at once: " + ", ".join(f"{n} {what}" for what, n in outcomes.items()),
            count_text(effects)]  # fmt: skip
    return verdict("concurrency", problems, said)


def random_kills(kit: Kit) -> Check:
    if kit.trials == 0:
        return Check("random_kills", NOT_APPLICABLE, "--trials 0: no kill was tried")
    span = calibrate(kit)
    windows: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    sent = landed = 0
    for trial in range(kit.trials):
        rng = random.Random(kit.seed + trial)  # noqa: S311 - kill plans, not secrets
        run_dir, call_id = kit.new_run("kills")
        plan = [KILL_PLAN[trial % len(KILL_PLAN)]]  # every window once in the first trials
        plan += [rng.choice(KILL_PLAN) for _ in range(rng.randrange(MAX_KILLS))]
        steps = []
        for where in plan:
            sent += 1
            ended = kill(kit, run_dir, where, rng.uniform(0, span))
            effects = kit.count(run_dir, call_id)
            if ended.killed:
                landed += 1
                window = call_window(run_dir, call_id, {ended.pid}, functools.partial(bool, effects))
                windows[window] += 1
                steps.append(f"{where}: {window}")
            else:
                steps.append(f"{where}: {ended.describe()}")
                if ended.hung or not kit.settled_as_it_may(ended):
                    problems.append(f"trial {trial} (seed {kit.seed + trial}): a call the kill missed "
                                    f"ended {ended.describe()}")  # fmt: skip
            if effects is None or effects > 1:
                problems.append(f"trial {trial} (seed {kit.seed + trial}): {count_text(effects)} after "
                                f"{' / '.join(steps)}")  # fmt: skip
        final = kit.call(run_dir)
        effects = kit.count(run_dir, call_id)
        outcomes[kit.resume_text(final) if final.committed or final.awaiting else "other"] += 1
        ok = (final.committed and effects == 1) or (
            not kit.queryable and final.awaiting and effects is not None and effects <= 1
        )
        if not ok:
            problems.append(f"trial {trial} (seed {kit.seed + trial}): after {' / '.join(steps)} the clean "
                            f"resume ended {final.describe()} with {count_text(effects)}")  # fmt: skip
        if "Traceback" in final.stderr:
            problems.append(f"trial {trial}: the clean resume printed a traceback")
        problems += [f"trial {trial}: {problem}" for problem in run_problems(run_dir)]
    starred = sum(windows[window] for window in CALL_EFFECT_DONE_UNRECORDED)
    said = [
        f"{kit.trials} trials (seed {kit.seed}), {sent} kills sent, {landed} landed, {starred} of them "
        "with the effect done and its receipt not yet committed",
        "windows: " + ", ".join(f"{window} {n}" for window, n in sorted(windows.items())),
        "clean resumes: " + ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items())),
    ]
    return verdict("random_kills", problems, said)


def kill(kit: Kit, run_dir: Path, where: str, delay: float) -> Ended:
    """One call, SIGKILLed at the failpoint ``where`` (stopped there first), or ``delay`` s after it is ready."""
    from receipts.crashes import kill_at_failpoint

    if where != RANDOM:
        child = kit.child(run_dir, failpoint=f"{where}:stop")
        return child.end(killed=kill_at_failpoint(child.popen, STEP_TIMEOUT) == "killed")
    child = kit.child(run_dir, wait_for_go=True)
    child.wait_ready()
    child.go()
    time.sleep(delay)
    child.popen.send_signal(signal.SIGKILL)  # polls first: a child that has ended is never signalled
    return child.end()


def calibrate(kit: Kit) -> float:
    """How long a clean call takes, from ready to exit (the median of a few), times the margin."""
    times = []
    for _ in range(CALIBRATION_RUNS):
        run_dir, _ = kit.new_run("calibrate")
        child = kit.child(run_dir, wait_for_go=True)
        child.wait_ready()
        started = time.monotonic()
        child.go()
        child.end()
        times.append(time.monotonic() - started)
    times.sort()
    return SPAN_MARGIN * times[len(times) // 2]


def run_problems(run_dir: Path) -> list[str]:
    """What the run directory must show after any resume: the ledger's chain, and no reader finding."""
    from receipts.reader import read_run

    _, problems = ledger_events(run_dir)
    files, ledger_findings = read_run(run_dir, keep_events=False)
    problems += [f"reader finding {finding.code}: {finding.detail}" for finding in files.findings]
    problems += [f"ledger finding {finding.code}: {finding.detail}" for finding in ledger_findings]
    return problems
