"""The checks of what the target answers: the call_id as its key, its query, calls kept apart,
its evidence against a counter, its failures, and how long it keeps keys."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from receipts import protocol
from receipts.conformance.effects import count_text
from receipts.conformance.report import FAIL, NEEDS_A_PERSON, NOT_APPLICABLE, Check, short_text, verdict
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, OutcomeUnknown

if TYPE_CHECKING:
    from receipts.conformance.child import Ended
    from receipts.conformance.kit import Kit


def idempotency_key(kit: Kit) -> Check:
    if not kit.queryable:
        return Check("idempotency_key", NEEDS_A_PERSON, "no query: the writer never hands the target the same "
                     "call_id twice; a call in doubt waits for a person")  # fmt: skip
    run_dir, call_id = kit.new_run("key")
    # A retry at once in the process that made the effect (a runtime retrying a lost answer), then one
    # in a new process: a target whose reads lag its writes passes the second and not the first.
    at_once = kit.call(run_dir, mode="steps", call_id=call_id, steps=[{"do": "execute"}, {"do": "execute"}])
    counts = [kit.count(run_dir, call_id)]
    said = [f"execute twice at once in one process: {_steps_text(at_once)}, {count_text(counts[-1])}"]
    again = kit.call(run_dir, mode="execute", call_id=call_id)
    counts.append(kit.count(run_dir, call_id))
    said.append(f"execute again in a new process: {again.describe()}, {count_text(counts[-1])}")
    problems = []
    if counts[0] != 1:
        problems.append(
            f"the same call_id executed twice at once in one process (a retry right after a lost response) "
            f"left {count_text(counts[0])}: the target does not take the call_id as its key, or it knows a key "
            "only some time after it was given (a dedupe or a lookup whose reads lag its writes)"
        )
    if counts[1] != counts[0]:
        problems.append(
            f"the same call_id executed again in a new process (a retry after a lost response) left "
            f"{count_text(counts[1])}: the target does not take the call_id as its idempotency key"
        )
    return verdict("idempotency_key", problems, said)


def _steps(ended: Ended) -> list[dict[str, Any]]:
    """What each step of a ``steps`` child said (none when the child broke)."""
    steps = ended.output.get("steps")
    return [step if isinstance(step, dict) else {} for step in steps] if isinstance(steps, list) else []


def _steps_text(ended: Ended) -> str:
    steps = _steps(ended)
    if not steps:
        return ended.describe()
    return ", ".join(_step_text(step) for step in steps)


def _step_text(step: Mapping[str, Any]) -> str:
    if "error" in step:
        return f"raised {short_text(step['error'])}"
    if "answer" in step:
        return {"NOT_DONE": "NOT_DONE", "result": "the result"}.get(step["answer"], f"cannot tell ({step.get('why')})")
    return "returned a result" if "result" in step else short_text(step)


def query_answers_truly(kit: Kit) -> Check:
    if not kit.queryable:
        return Check("query_answers_truly", NEEDS_A_PERSON, "no query: whether a call in doubt happened is a "
                     "person's decision")  # fmt: skip
    run_dir, call_id = kit.new_run("query")
    problems, said = [], []
    before = ask(kit, run_dir, call_id)
    if isinstance(before, dict):
        problems.append("before any effect the query returns a result: it claims an effect that never happened")
    if kit.count(run_dir, call_id) != 0:
        problems.append("the query made an effect where there was none")
    said.append(f"before the effect: {_answer_text(before)}")
    executed = kit.call(run_dir, mode="execute", call_id=call_id)
    if executed.returncode != 0 or kit.count(run_dir, call_id) != 1:
        problems.append(f"execute ended {executed.describe()}, {count_text(kit.count(run_dir, call_id))}")
        return verdict("query_answers_truly", problems, said)
    after = ask(kit, run_dir, call_id)
    effects = kit.count(run_dir, call_id)
    said.append(f"after the effect: {_answer_text(after)}, {count_text(effects)}")
    if after is NOT_DONE:
        problems.append("the query answers NOT_DONE while the effect is there: the writer would make it again")
    elif isinstance(after, OutcomeUnknown):
        problems.append("the query cannot tell about an effect that is there: every call killed after its "
                        "effect would wait for a person")  # fmt: skip
    elif not isinstance(after, dict):
        problems.append(f"the query gives no answer the writer can act on: {_answer_text(after)}")
    if effects != 1:
        problems.append(f"after the query {count_text(effects)}: the query made an effect (it re-executes)")
    return verdict("query_answers_truly", problems, said)


def ask(kit: Kit, run_dir: Path, call_id: str, args: Mapping[str, Any] | None = None) -> Any:
    try:
        return kit.adapter.query(run_dir, json.loads(json.dumps(kit.args if args is None else args)), call_id)
    except OutcomeUnknown as unknown:
        return unknown
    except Exception as error:  # noqa: BLE001 - the writer counts any failure as "cannot tell"
        return OutcomeUnknown(f"{type(error).__name__}: {error}")


def calls_kept_apart(kit: Kit) -> Check:
    calls = kit.distinct_calls()
    if len(calls) < 3:
        return Check("calls_kept_apart", FAIL, f"normalise accepted {len(calls)} other arg sets of "
                     f"{len(kit.raw_generated) - 1} ({kit.generated_by}): the kit needs three (two made, one "
                     "never made); give an args_strategy on the adapter, or --generated more")  # fmt: skip
    problems, said = [], []
    # Through the writer, one after another on one target: each its own effect.
    run_dir, _ = kit.new_run("apart")
    *made, never = calls[:3]
    for number, (raw, normalised) in enumerate(made, 1):
        ended = kit.call(run_dir, args=raw)
        call_id = kit.call_id_for(run_dir, normalised)
        effects = kit.count(run_dir, call_id, normalised)
        said.append(f"call {number} {kit.resume_text(ended)}, {count_text(effects)}")
        if not ended.committed:
            problems.append(f"call {number} ({short_text(raw)}) ended {ended.describe()}")
        if effects != 1:
            problems.append(f"call {number} ({short_text(raw)}) committed with {count_text(effects)} of its own: "
                            "the target took it for another call's")  # fmt: skip
    first_effects = kit.count(run_dir, kit.call_id_for(run_dir, made[0][1]), made[0][1])
    if first_effects != 1:
        problems.append(f"after the later calls the first shows {count_text(first_effects)}")
    never_id = kit.call_id_for(run_dir, never[1])
    if kit.queryable:
        answer = ask(kit, run_dir, never_id, never[1])
        said.append(f"the query of a call never made, beside them: {_answer_text(answer)}")
        if isinstance(answer, dict):
            problems.append("the query answers with a result for a call never made while others were: the "
                            "writer would take a call that never happened for done")  # fmt: skip
    if kit.count(run_dir, never_id, never[1]) != 0:
        problems.append("the target shows an effect of a call never made")
    # Beneath the writer: call_ids one character apart are two keys, two effects.
    run_dir, _ = kit.new_run("apart-keys")
    base = kit.call_id_for(run_dir, made[0][1])
    keys = [base, base[:-1] + _other_hex(base[-1]), _other_hex(base[0]) + base[1:]]
    counts = []
    for (raw, normalised), key in zip(calls[:3], keys, strict=True):
        ended = kit.call(run_dir, mode="execute", call_id=key, args=raw)
        counts.append(kit.count(run_dir, key, normalised))
        if ended.returncode != 0:
            problems.append(f"execute under a call_id one character from another's ended {ended.describe()}")
    said.append("execute under call_ids one character apart (the last, the first): "
                + ", ".join(count_text(count) for count in counts))  # fmt: skip
    if counts != [1, 1, 1]:
        problems.append("call_ids one character apart are not kept apart: the target keys on part of the call_id")
    problems += _prefixes_kept_apart(kit, said)
    return verdict("calls_kept_apart", problems, said)


def _prefixes_kept_apart(kit: Kit, said: list[str]) -> list[str]:
    """Calls whose args begin alike: each text of one the beginning of the other's ("Fix login 1",
    "Fix login 12"). A lookup by a prefix (a search box's match) finds the other call's effect."""
    calls: dict[str, tuple[Any, dict[str, Any]]] = {}
    # The second pair is tried the other way round: its shorter call made, its longer never made.
    for label, number, longer in (("short", 1, False), ("long", 1, True), ("short 2", 3, False), ("long 2", 3, True)):
        raw = kit.prefixed_args(number, longer=longer)
        try:
            calls[label] = (raw, kit.adapter.normalise(json.loads(json.dumps(raw))))
        except Exception as error:  # noqa: BLE001 - the user's normalise: nothing tried, and said so
            said.append(f"args that begin alike ({short_text(raw, 40)}): normalise refused them "
                        f"({type(error).__name__}), not tried")  # fmt: skip
            return []
    if len({protocol.canonical_json(normalised) for _, normalised in calls.values()}) != len(calls):
        said.append(f"args that begin alike ({short_text(calls['short'][0], 40)}): normalise made two of them one, "
                    "not tried")  # fmt: skip
        return []
    run_dir, _ = kit.new_run("apart-prefix")
    ids = {label: kit.call_id_for(run_dir, normalised) for label, (_, normalised) in calls.items()}
    # In one process, beneath the writer: the longer call made, the shorter asked (never made yet);
    # the shorter of the other pair made, its longer asked (never made); then the first shorter
    # made, and both of the first pair asked.
    plan = [("execute", "long"), ("query", "short"), ("execute", "short 2"), ("query", "long 2"),
            ("execute", "short"), ("query", "short"), ("query", "long")]  # fmt: skip
    if not kit.queryable:
        plan = [(do, label) for do, label in plan if do == "execute"]
    steps = [{"do": do, "args": calls[label][0], "call_id": ids[label]} for do, label in plan]
    ended = kit.call(run_dir, mode="steps", steps=steps)
    done = _steps(ended)
    if len(done) != len(steps):
        return [f"calls whose args begin alike, in one process: {ended.describe()}"]
    said.append(f"args that begin alike ({short_text(calls['short'][0], 40)}, {short_text(calls['long'][0], 40)}, "
                "each way round), in one process: " + _steps_text(ended))  # fmt: skip
    problems = []
    # The last answer of each (step, call): the first pair is asked twice, before and after both are made.
    first_answers: dict[tuple[str, str], dict[str, Any]] = {}
    answers: dict[tuple[str, str], dict[str, Any]] = {}
    for (do, label), answer in zip(plan, done, strict=True):
        first_answers.setdefault((do, label), answer)
        answers[do, label] = answer
        if "error" in answer:
            problems.append(f"execute of {short_text(calls[label][0], 60)} (args that begin alike) raised "
                            f"{short_text(answer['error'])}")  # fmt: skip
    if kit.queryable:
        for asked, made, how in (("short", "long", "begin"), ("long 2", "short 2", "are the beginning of")):
            if first_answers["query", asked].get("answer") == "result":
                problems.append(
                    f"the query of a call never made ({short_text(calls[asked][0], 60)}) answers with a result "
                    f"while a call whose args its own {how} was made ({short_text(calls[made][0], 60)}): it "
                    "looks up by part of the args, and the writer would take a call that never happened for done"
                )
        for asked, other in (("short", "long"), ("long", "short")):
            found = answers["query", asked].get("result")
            own, others = answers["execute", asked].get("result"), answers["execute", other].get("result")
            if found is not None and found == others and others != own:
                problems.append(f"with both made, the query of {short_text(calls[asked][0], 60)} answers with the "
                                "other call's result: it looks up by part of the args")  # fmt: skip
    for label, wanted in (("short", 1), ("long", 1), ("short 2", 1), ("long 2", 0)):
        effects = kit.count(run_dir, ids[label], calls[label][1])
        if effects != wanted:
            made = "made" if wanted else "never made, whose args begin as a call made"
            problems.append(f"{short_text(calls[label][0], 60)} ({made}) shows {count_text(effects)} on the target")
    return problems


def evidence_matches_target(kit: Kit) -> Check:
    if not callable(getattr(kit.adapter, "evidence", None)):
        return Check("evidence_matches_target", NOT_APPLICABLE, "the adapter has no evidence")
    if getattr(kit.adapter, "checks_commits", True) is False:
        return Check("evidence_matches_target", NOT_APPLICABLE, "its evidence cannot look at the target "
                     "(checks_commits = False)")  # fmt: skip
    if kit.effects.counter is None:
        return Check("evidence_matches_target", NOT_APPLICABLE, "effects are counted by the evidence itself: "
                     "give --counter to check it against the target")  # fmt: skip
    calls = kit.distinct_calls()
    if len(calls) < 3:
        return Check("evidence_matches_target", FAIL, "normalise accepted fewer than three other arg sets")
    run_dir, _ = kit.new_run("evidence")
    problems, said, results = [], [], []
    for raw, _ in calls[:2]:
        ended = kit.call(run_dir, args=raw)
        results.append(ended.output.get("result"))
        if not ended.committed:
            problems.append(f"the call ended {ended.describe()}")
    looks = [  # (what, args, call_id, result given to evidence, whether it must not be present)
        ("a call made", calls[0][1], None, False),
        ("a call made, with its result", calls[0][1], results[0], False),
        ("another call's result", calls[0][1], results[1] if results[1] != results[0] else None, True),
        ("a call never made", calls[2][1], None, True),
    ]
    for what, args, result, foreign in looks:
        if foreign and what == "another call's result" and result is None:
            continue
        call_id = kit.call_id_for(run_dir, args)
        effects = kit.count(run_dir, call_id, args)
        shown = look(kit, run_dir, args, call_id, result)
        said.append(f"{what}: evidence {shown}, the counter {count_text(effects)}")
        if shown == PRESENT and (effects == 0 or foreign):
            problems.append(f"{what}: the evidence says present where the target shows {count_text(effects)}"
                            + (" of that result" if foreign and effects else ""))  # fmt: skip
        elif shown == ABSENT and effects and not foreign:
            problems.append(f"{what}: the evidence says absent where the target shows {count_text(effects)}")
        elif shown not in (PRESENT, ABSENT, UNCLEAR):
            problems.append(f"{what}: the evidence gives no verdict ({shown})")
    return verdict("evidence_matches_target", problems, said)


def look(kit: Kit, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Any) -> str:
    try:
        found = kit.adapter.evidence(run_dir, json.loads(json.dumps(args)), call_id, result)
    except Exception as error:  # noqa: BLE001 - said in the check's evidence
        return f"raised {type(error).__name__}: {error}"
    return str(getattr(found, "verdict", found))


def failing_target(kit: Kit) -> Check:
    hook = callable(getattr(kit.adapter, "break_target", None))
    if kit.failing is None and not hook:
        return Check("failing_target", NOT_APPLICABLE, "skipped: nothing makes the target fail; give "
                     "--failing-args JSON (or failing_args on the adapter), args the target itself refuses or "
                     "fails on, or a break_target() on the adapter, which makes its target fail in the process "
                     "it is called in")  # fmt: skip
    problems: list[str] = []
    said: list[str] = []
    if kit.failing is not None:
        run_dir, _ = kit.new_run("failing")
        call_id = kit.call_id_for(run_dir, kit.failing)
        for how in ("the call", "the same call again"):
            ended = kit.call(run_dir, args=kit.raw_failing)
            _judge_failure(
                kit, ended, kit.count(run_dir, call_id, kit.failing), how, "the failing args", problems, said
            )
    if hook:
        run_dir, call_id = kit.new_run("broken")
        tries = (("the call, its target broken", True), ("the same call again, the target no longer broken", False))
        for how, broken in tries:
            ended = kit.call(run_dir, break_target=broken)
            _judge_failure(kit, ended, kit.count(run_dir, call_id), how, "break_target()", problems, said)
            if broken and ended.returncode == 1 and ended.output.get("error"):
                break  # the hook itself failed: said by _judge_failure
    return verdict("failing_target", problems, said)


def _judge_failure(kit: Kit, ended: Ended, effects: int | None, how: str, by: str, problems: list[str],
                   said: list[str]) -> None:  # fmt: skip
    """A call whose target was made to fail (``by``): never committed without its effect."""
    said.append(f"{how} {kit.resume_text(ended)}, {count_text(effects)}")
    first = not how.startswith("the same call again")
    if ended.committed and effects != 1:
        problems.append(f"{how} ended committed with {count_text(effects)}: execute returned a result "
                        "for the target's failure")  # fmt: skip
    elif ended.committed and first:
        problems.append(f"{how} ended committed: {by} did not make the target fail")
    if first and by == "break_target()" and ended.returncode == 1 and ended.output.get("error"):
        problems.append(f"{how}: {ended.output['error']}")  # the hook raised
    if "Traceback" in ended.stderr:
        problems.append(f"{how} printed a traceback")
    if ended.hung:
        problems.append(f"{how} hung")


# How far the kit moves the clock: a key stamped with the minute, the hour, the day or the month
# it was sent is another key after each (in any time zone).
CLOCK_MOVES = ((61.0, "a minute"), (3661.0, "an hour"), (86461.0, "a day"), (32 * 86400.0, "32 days"))


def keys_kept(kit: Kit) -> Check:
    if not kit.queryable:
        return Check("keys_kept", NEEDS_A_PERSON, "no query: the writer never hands the target the same call_id "
                     "twice")  # fmt: skip
    declared = getattr(kit.adapter, "key_retention", None)
    problems: list[str] = []
    said: list[str] = []
    moved = _clock_moved_on(kit, declared, problems, said)
    if kit.key_wait == 0:
        said.append("--key-wait 0: no wait was tried")
    elif isinstance(declared, (int, float)) and declared < kit.key_wait:
        said.append(f"the adapter declares keys kept {declared:g} s, less than --key-wait {kit.key_wait:g} s: no "
                    "wait was tried (past_key_retention checks what follows)")  # fmt: skip
    else:
        _keys_kept_a_wait(kit, declared, problems, said)
        moved = True
    if not moved:
        return Check("keys_kept", NOT_APPLICABLE, "; ".join(said))
    return verdict("keys_kept", problems, said)


def _clock_moved_on(kit: Kit, declared: Any, problems: list[str], said: list[str]) -> bool:
    """Execute; then, in another process, the clock moved on (``RECEIPTS_CLOCK``) by a minute, an
    hour, a day and 32 days, within the retention the adapter declares: the query still finds the
    call, and execute again makes no second effect. ``False`` when no move was within it."""
    limit = float("inf")
    if isinstance(declared, (int, float)) and not isinstance(declared, bool):
        limit = declared - min(declared / 10, 3600.0)  # the margin the HTTP adapter allows its service's clock
    moves = [(seconds, label) for seconds, label in CLOCK_MOVES if seconds < limit]
    if not moves:
        said.append(f"the adapter declares keys kept {declared:g} s: the clock was not moved")
        return False
    run_dir, call_id = kit.new_run("clock")
    first = kit.call(run_dir, mode="execute", call_id=call_id)
    now = protocol.utc_now()
    # Then in another process (the effect's is over): the query before the clock moves, and after each move
    # the query and execute again, at once. A target that forgets keys forgets them by its own clock.
    steps: list[dict[str, Any]] = [{"do": "query"}]
    for seconds, _ in moves:
        at = protocol.format_time(now + dt.timedelta(seconds=seconds))
        steps += [{"do": "clock", "at": at}, {"do": "query"}, {"do": "execute"}]
    ended = kit.call(run_dir, mode="steps", call_id=call_id, steps=steps)
    done = _steps(ended)
    effects = kit.count(run_dir, call_id)
    spans = ", ".join(label for _, label in moves)
    if first.returncode != 0 or len(done) != len(steps):
        problems.append(f"execute ended {first.describe()}; then, the clock moved on, {_steps_text(ended)}")
        return True
    said.append(f"execute, then in another process the query ({_step_text(done[0])}) and with the clock moved on "
                f"(RECEIPTS_CLOCK) {spans}, each time the query and execute again: {count_text(effects)}")  # fmt: skip
    if done[0].get("answer") == "NOT_DONE":
        said.append("the query does not find the call before the clock moved (query_answers_truly): the clock's "
                    "moves were not judged")  # fmt: skip
        return True
    for (_, label), answer in zip(moves, done[2::3], strict=True):
        if answer.get("answer") == "NOT_DONE":
            problems.append(f"with the clock moved on {label}, the query answers NOT_DONE: the key moved with the "
                            "clock (a key stamped with the time it was sent?), and the writer would make the call "
                            "again")  # fmt: skip
            break
    if effects != 1:
        problems.append(f"with the clock moved on {spans}, the same call_id made {count_text(effects)}: the key "
                        "the target was given changes with the clock")  # fmt: skip
    return True


def _keys_kept_a_wait(kit: Kit, declared: Any, problems: list[str], said: list[str]) -> None:
    """Execute, a real wait (``--key-wait``), the query and execute again: one effect."""
    run_dir, call_id = kit.new_run("kept")
    first = kit.call(run_dir, mode="execute", call_id=call_id)
    before = kit.count(run_dir, call_id)
    time.sleep(kit.key_wait)
    answer = ask(kit, run_dir, call_id)
    again = kit.call(run_dir, mode="execute", call_id=call_id)
    after = kit.count(run_dir, call_id)
    said.append(f"then execute: {first.describe()}, {count_text(before)}; {kit.key_wait:g} s later the query: "
                f"{_answer_text(answer)}; execute again: {again.describe()}, {count_text(after)}")  # fmt: skip
    if before != 1:
        problems.append(f"the first execute left {count_text(before)}")
    if answer is NOT_DONE:
        problems.append(f"{kit.key_wait:g} s after the effect the query answers NOT_DONE: the target forgot the "
                        "call_id, and the writer would make the call again")  # fmt: skip
    if after != 1:
        problems.append(f"{kit.key_wait:g} s later the same call_id made another effect: the target forgot its "
                        "key sooner than the adapter declares (key_retention: "
                        f"{'for ever' if declared is None else f'{declared:g} s'})")  # fmt: skip


def past_key_retention(kit: Kit) -> Check:
    declared = getattr(kit.adapter, "key_retention", None)
    if not kit.queryable:
        return Check("past_key_retention", NEEDS_A_PERSON, "no query: a call in doubt waits for a person at any age")
    if not isinstance(declared, (int, float)) or isinstance(declared, bool) or declared <= 0:
        return Check("past_key_retention", NOT_APPLICABLE, "the adapter declares no key_retention: its target "
                     "keeps keys for ever (keys_kept waits to see)")  # fmt: skip
    run_dir, call_id = kit.new_run("retention")
    # The clock moved past the retention: the call was begun that long ago, and its answer lost.
    begun = protocol.utc_now() - dt.timedelta(seconds=declared * 1.1 + 60)
    kit.plant_receipt(run_dir, call_id, kit.args, protocol.format_time(begun))
    ended = kit.call(run_dir)
    effects = kit.count(run_dir, call_id)
    said = [f"a call begun {_span(declared * 1.1 + 60)} ago (keys kept {_span(declared)}), its target showing "
            f"nothing: the resume {kit.resume_text(ended)}, {count_text(effects)}"]  # fmt: skip
    problems = []
    if not ended.awaiting:
        problems.append("past the retention the adapter declares, the target's \"not found\" was taken for "
                        f"\"not done\" ({ended.describe()}): a call whose key it forgot is made twice")  # fmt: skip
    if effects:
        problems.append(f"the resume made {count_text(effects)}")
    return verdict("past_key_retention", problems, said)


def _other_hex(character: str) -> str:
    return "0" if character != "0" else "1"


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.3g} s"


def _answer_text(answer: Any) -> str:
    if answer is NOT_DONE:
        return "NOT_DONE"
    if isinstance(answer, OutcomeUnknown):
        return f"cannot tell ({answer})"
    if isinstance(answer, dict):
        return "the result"
    return f"a {type(answer).__name__}"
