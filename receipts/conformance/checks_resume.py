"""The checks of a call resumed: after its answer was lost, the same call again, a call over a
receipt that is not its own, and a resume under the original identity while a new attempt waits."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from receipts import protocol, runtime
from receipts.conformance.effects import count_text
from receipts.conformance.report import Check, verdict

if TYPE_CHECKING:
    from receipts.conformance.kit import Kit


def restart_after_lost_response(kit: Kit) -> Check:
    problems, said = [], []
    for how in ("killed after the effect", "the answer lost after the effect"):
        run_dir, call_id = kit.new_run("restart")
        if how.startswith("killed"):
            first = kit.killed_after_effect(run_dir)
            if not first.killed:
                problems.append(f"{how}: the call never reached its effect ({first.describe()})")
                continue
        else:
            first = kit.call(run_dir, lose_response=True)
            if first.output.get("status") != "unknown":
                problems.append(f"{how}: the receipt is not unknown ({first.describe()})")
        before = kit.count(run_dir, call_id)
        resumed = kit.call(run_dir)
        after = kit.count(run_dir, call_id)
        said.append(f"{how}: {count_text(before)}; the restart {kit.resume_text(resumed)}, {count_text(after)}")
        if before != 1:
            problems.append(f"{how}: the target shows {count_text(before)} after the effect, not 1")
        if after != 1:
            problems.append(f"{how}: after the restart {count_text(after)}")
        if not kit.settled_as_it_may(resumed):
            problems.append(f"{how}: the restart ended {resumed.describe()}")
    return verdict("restart_after_lost_response", problems, said)


def same_request_reuse(kit: Kit) -> Check:
    run_dir, call_id = kit.new_run("reuse")
    first, again = kit.call(run_dir), kit.call(run_dir)
    effects = kit.count(run_dir, call_id)
    problems = []
    if not first.committed:
        problems.append(f"the first call ended {first.describe()}")
    if not (again.committed and again.output.get("reused")):
        problems.append(f"the same call again ended {again.describe()}, not reused")
    elif again.output.get("result") != first.output.get("result"):
        problems.append("the same call again gave another result than the first")
    if effects != 1:
        problems.append(f"{count_text(effects)} after the same call twice")
    said = [f"first {kit.resume_text(first)}, again {kit.resume_text(again)}, {count_text(effects)}"]
    return verdict("same_request_reuse", problems, said)


def identity_mismatch(kit: Kit) -> Check:
    run_dir, call_id = kit.new_run("mismatch")
    other = {**kit.args, "conformance_other": "another request under this call_id"}
    path = kit.plant_receipt(run_dir, call_id, other, protocol.format_time(protocol.utc_now()))
    planted = path.read_bytes()
    ended = kit.call(run_dir)
    effects = kit.count(run_dir, call_id)
    problems = []
    if not ended.awaiting:
        problems.append(f"the call under that id ended {ended.describe()}, not a conflict for a person")
    if effects != 0:
        problems.append(f"{count_text(effects)}: the call ran over a receipt that is not its own")
    if path.read_bytes() != planted:
        problems.append("the receipt on record was changed")
    said = [f"the call {kit.resume_text(ended)}, {count_text(effects)}, the receipt on record kept"]
    return verdict("identity_mismatch", problems, said)


def resume_original_identity(kit: Kit) -> Check:
    problems, said = [], []
    again = kit.adapter.normalise(json.loads(json.dumps(kit.args)))
    if again != kit.args:
        problems.append("normalising the normalised args gives other args: a runtime resuming from a "
                        "receipt's args would get a new call_id")  # fmt: skip
    run_dir, call_id = kit.new_run("resume")
    first = kit.killed_after_effect(run_dir)
    on_disk = sorted(path.stem for path in (run_dir / "receipts").glob("*.json"))
    if on_disk != [call_id]:
        problems.append(f"the call in another process has the call_id(s) {on_disk}, not {call_id}: "
                        "normalise is not the same in every process")  # fmt: skip
    if not first.killed:
        problems.append(f"the call never reached its effect ({first.describe()})")
    try:
        runtime.run_set_state(run_dir, state="retrying", attempts=1)
        problems.append("a new attempt was allowed while the call is in doubt (its intent would get a new id)")
    except runtime.UnsettledCalls as refused:
        if call_id not in refused.call_ids:
            problems.append("a new attempt was refused without naming the call in doubt")
        said.append("a new attempt is refused while the call is in doubt")
    resumed = kit.call(run_dir)
    effects = kit.count(run_dir, call_id)
    if resumed.output.get("call_id") != call_id:
        problems.append(f"the resume ran under {resumed.output.get('call_id')}, not the original {call_id}")
    if not kit.settled_as_it_may(resumed):
        problems.append(f"the resume ended {resumed.describe()}")
    if effects != 1:
        problems.append(f"after the resume {count_text(effects)}")
    said.append(f"the resume under the original call_id {kit.resume_text(resumed)}, {count_text(effects)}")
    if resumed.committed:
        try:
            runtime.run_set_state(run_dir, state="retrying", attempts=1)
            said.append("then the new attempt starts")
        except runtime.UnsettledCalls:
            problems.append("the call is committed, and still a new attempt is refused")
    return verdict("resume_original_identity", problems, said)
