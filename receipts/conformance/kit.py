"""The kit: one adapter put through every check, each in scratch run directories of its own, with
the children that make its calls (``Kit``); ``run_kit`` runs it in a scratch folder."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from receipts import protocol, runtime
from receipts.conformance import checks_processes, checks_resume, checks_target
from receipts.conformance.args import derive_args, draw_args, prefix_args
from receipts.conformance.child import STEP_TIMEOUT, Child, Ended
from receipts.conformance.effects import Effects
from receipts.conformance.loading import load_adapter, load_object
from receipts.conformance.report import CHECKS, FAIL, Check, KitError, Report
from receipts.durable import json_file
from receipts.tools import adapter_can_query

# The folder that holds the receipts package: a child imports it from there.
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)


class Kit:
    """Runs every check against one adapter, each in scratch run directories of its own."""

    def __init__(
        self,
        spec: str,
        *,
        args: dict[str, Any] | None = None,
        counter: str | None = None,
        trials: int = 10,
        concurrency: int = 8,
        seed: int | None = None,
        generated: int = 8,
        key_wait: float = 5.0,
        failing_args: dict[str, Any] | None = None,
        root: Path,
    ) -> None:
        if trials < 0 or concurrency < 2:
            raise KitError("--trials must be 0 or more, --concurrency 2 or more")
        if not 3 <= generated <= 1000:
            raise KitError("--generated must be from 3 to 1000 (two calls made and one never made, at least)")
        if not 0 <= key_wait <= 24 * 3600:
            raise KitError("--key-wait must be from 0 to 86400 seconds")
        self.spec = spec
        self.adapter = load_adapter(spec)
        raw = args if args is not None else getattr(self.adapter, "example_args", None)
        if not isinstance(raw, dict):
            raise KitError(
                f"the kit needs the args of one call of {self.adapter.name}: give --args JSON, "
                "or an example_args attribute (a dict) on the adapter"
            )
        self.raw_args = raw
        try:
            self.args = self.adapter.normalise(json.loads(json.dumps(raw)))
        except Exception as error:  # noqa: BLE001 - the user's normalise, on the user's args
            raise KitError(f"{self.adapter.name} refuses the args {raw}: {type(error).__name__}: {error}") from None
        self.queryable = adapter_can_query(self.adapter)
        raw_failing = failing_args if failing_args is not None else getattr(self.adapter, "failing_args", None)
        if raw_failing is not None and not isinstance(raw_failing, dict):
            raise KitError("the failing args (--failing-args, or failing_args on the adapter) must be a JSON object")
        self.raw_failing = raw_failing
        self.failing: dict[str, Any] | None = None
        if raw_failing is not None:
            try:
                self.failing = self.adapter.normalise(json.loads(json.dumps(raw_failing)))
            except Exception as error:  # noqa: BLE001 - the user's normalise, on the user's args
                refusal = f"{type(error).__name__}: {error}"
                raise KitError(f"{self.adapter.name} refuses the failing args {raw_failing} before the target "
                               f"sees them ({refusal}): give args the target itself fails on") from None  # fmt: skip
        self.generated, self.key_wait = generated, key_wait
        count_function = load_object(counter, "the counter") if counter else None
        if count_function is not None and not callable(count_function):
            raise KitError(f"the counter {counter} is not callable")
        self.effects = Effects(self.adapter, self.args, count_function, counter)
        self.trials, self.concurrency = trials, concurrency
        self.seed = random.SystemRandom().randrange(10**6) if seed is None else seed
        strategy = getattr(self.adapter, "args_strategy", None)
        if strategy is not None:
            self.generated_by = "drawn from the adapter's args_strategy"
            self.raw_generated = [raw, *draw_args(strategy, generated, self.seed)]
        else:
            self.generated_by = "derived from the example's"
            self.raw_generated = [raw] + [derive_args(raw, number) for number in range(1, generated + 1)]
        self.root = root
        self.nonce = os.urandom(8).hex()  # call_ids of this run of the kit are its own, on any shared target
        self.runs = 0
        self.env = dict(os.environ)
        self.env.pop("RECEIPTS_FAILPOINT", None)
        # The child imports MODULE as this process did: from the current folder first.
        paths = [os.getcwd(), PACKAGE_PARENT, self.env.get("PYTHONPATH")]
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))

    # --- helpers -------------------------------------------------------------------------

    def new_run(self, label: str) -> tuple[Path, str]:
        """A fresh run directory, with a contract of its own: the call's id there is new to every target."""
        self.runs += 1
        run_dir = self.root / f"{label}-{self.runs}"
        contract = protocol.sha256_hex(f"callproof conformance {self.nonce} {label} {self.runs}".encode())
        runtime.run_init(run_dir, contract_sha256=contract)
        call_id = protocol.make_call_id(
            contract, 1, self.adapter.name, self.args, self.adapter.version, protocol.IDENTITY_V2
        )
        return run_dir, call_id

    def call_id_for(self, run_dir: Path, args: Mapping[str, Any]) -> str:
        """The call_id the writer gives a call of these normalised args, at the run's first attempt."""
        return protocol.make_call_id(
            runtime.run_contract(run_dir), 1, self.adapter.name, args, self.adapter.version, protocol.IDENTITY_V2
        )

    def prefixed_args(self, number: int, *, longer: bool) -> Any:
        """The example's args made to begin alike with another call's (``args.prefix_args``)."""
        return prefix_args(self.raw_args, number, longer=longer)

    def distinct_calls(self) -> list[tuple[Any, dict[str, Any]]]:
        """(raw, normalised) of the generated sets normalise accepts, each unlike the others and the example."""
        seen = {protocol.canonical_json(self.args)}
        found = []
        for raw in self.raw_generated[1:]:
            try:
                normalised = self.adapter.normalise(json.loads(json.dumps(raw)))
                key = protocol.canonical_json(normalised)
            except Exception:  # noqa: BLE001, S112 - refused args are not calls; normalise_in_general judges them
                continue
            if key not in seen:
                seen.add(key)
                found.append((raw, normalised))
        return found

    def plant_receipt(self, run_dir: Path, call_id: str, args: Mapping[str, Any], created_at: str) -> Path:
        """A receipt as the writer writes one, ``prepared``: the call was begun, its outcome in doubt."""
        planted = {
            "call_id": call_id,
            "identity": protocol.IDENTITY_V2,
            "contract_sha256": runtime.run_contract(run_dir),
            "attempt": 1,
            "tool": self.adapter.name,
            "tool_version": self.adapter.version,
            "args": dict(args),
            "input_sha256": protocol.input_sha256(dict(args)),
            "queryable": self.queryable,
            "status": "prepared",
            # As the writer dates every receipt: a target that forgets keys reads the call's age from it.
            "created_at": created_at,
        }
        path = run_dir / "receipts" / f"{call_id}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(json_file(planted))
        return path

    def child(self, run_dir: Path, *, mode: str = "call", failpoint: str | None = None, **extra: Any) -> Child:
        extra.setdefault("args", self.raw_args)
        request = {"adapter": self.spec, "run_dir": str(run_dir), "mode": mode, **extra}
        env = dict(self.env)
        if failpoint is not None:
            env["RECEIPTS_FAILPOINT"] = failpoint
        return Child(request, env)

    def call(self, run_dir: Path, **extra: Any) -> Ended:
        return self.child(run_dir, **extra).end()

    def killed_after_effect(self, run_dir: Path) -> Ended:
        """A call stopped right after its effect, before its committed receipt, and SIGKILLed there."""
        from receipts.crashes import kill_at_failpoint

        child = self.child(run_dir, failpoint="after_effect:stop")
        landed = kill_at_failpoint(child.popen, STEP_TIMEOUT)
        return child.end(killed=landed == "killed")

    def count(self, run_dir: Path, call_id: str, args: Mapping[str, Any] | None = None) -> int | None:
        return self.effects.count(run_dir, call_id, args)

    def settled_as_it_may(self, ended: Ended) -> bool:
        """A resume's allowed end: committed, or (no query) waiting for a person."""
        return ended.committed or (not self.queryable and ended.awaiting)

    def resume_text(self, ended: Ended) -> str:
        if ended.committed:
            return "committed" + (" (reused: nothing ran again)" if ended.output.get("reused") else "")
        if ended.awaiting:
            return "waits for a person (exit 4)"
        return ended.describe()

    # --- running the checks --------------------------------------------------------------

    def run(self) -> Report:
        checks = []
        for name in CHECKS:
            try:
                checks.append(CHECK_FUNCTIONS[name](self))
            except Exception as error:  # noqa: BLE001 - one check that breaks must not hide the others
                checks.append(Check(name, FAIL, f"the check itself stopped: {type(error).__name__}: {error}"))
        return Report(self.spec, self.adapter.name, self.adapter.version, self.queryable, self.effects.by, checks)


# Each check of the checklist, by its name.
CHECK_FUNCTIONS: dict[str, Callable[[Kit], Check]] = {
    "restart_after_lost_response": checks_resume.restart_after_lost_response,
    "same_request_reuse": checks_resume.same_request_reuse,
    "identity_mismatch": checks_resume.identity_mismatch,
    "idempotency_key": checks_target.idempotency_key,
    "query_answers_truly": checks_target.query_answers_truly,
    "calls_kept_apart": checks_target.calls_kept_apart,
    "evidence_matches_target": checks_target.evidence_matches_target,
    "failing_target": checks_target.failing_target,
    "keys_kept": checks_target.keys_kept,
    "past_key_retention": checks_target.past_key_retention,
    "normalise_in_general": checks_processes.normalise_in_general,
    "concurrency": checks_processes.concurrency,
    "resume_original_identity": checks_resume.resume_original_identity,
    "random_kills": checks_processes.random_kills,
}


def run_kit(spec: str, *, keep: bool = False, **options: Any) -> Report:
    """Run the kit in a scratch folder (removed afterwards unless ``keep`` or a check failed)."""
    root = Path(tempfile.mkdtemp(prefix="callproof-conformance-"))
    try:
        report = Kit(spec, root=root, **options).run()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    if keep or not report.passed:
        report.kept = root
    else:
        shutil.rmtree(root, ignore_errors=True)
    return report
