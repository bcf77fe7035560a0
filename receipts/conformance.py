"""The conformance kit: does a tool's adapter keep the receipts' promises when processes die?

Standard library only. ``callproof conformance MODULE:ADAPTER`` runs one call of
the adapter through the real writer in scratch run directories, in real child
processes, and checks what a runtime's retries depend on (the checklist "for
every tool with a side effect": a restart after the effect, the same id with the
same and with another request, calls at once, a resume under the original
identity), then kills children with SIGKILL at every window of the write and
resumes. Effects are counted on the target: by a counter given with
``--counter MODULE:FUNC``, else by the adapter's ``evidence``, else its ``query``.

Each check is ``pass``, ``fail`` or ``not applicable``. A tool with no ``query``
cannot answer for a call in doubt, and the writer never hands its target the
same call_id twice: a person decides. The checks about the target's answers are
then "not applicable: needs a person", which is not a failure.

The child processes are this module run as ``python -m receipts.conformance
REQUEST_JSON``; docs/runtime-authors.md ("The conformance kit") is the guide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from receipts import protocol, runtime
from receipts.crashes import CALL_EFFECT_DONE_UNRECORDED, CALL_FAILPOINTS, call_window, ledger_events
from receipts.durable import json_file
from receipts.tools import ABSENT, NOT_DONE, PRESENT, OutcomeUnknown, adapter_can_query

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not applicable"
NEEDS_A_PERSON = "not applicable: needs a person"
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
STEP_TIMEOUT = 60.0
# Random kills are drawn up to this multiple of a clean call's time (ready to exit), so some
# land after the write is done (a reuse, the exit) and the whole of it is covered.
SPAN_MARGIN = 1.5
CALIBRATION_RUNS = 3
MAX_KILLS = 3
RANDOM = "random"  # a kill at a random moment, not at a failpoint
KILL_PLAN = (*CALL_FAILPOINTS, RANDOM)

# The checks, in the order of the checklist; each name is what a failure is reported by.
CHECKS = {
    "restart_after_lost_response": "a restart after the effect, its answer lost, makes no second effect",
    "same_request_reuse": "the same call again reuses the first result",
    "identity_mismatch": "a receipt for this call_id with other args: a conflict, zero effects",
    "idempotency_key": "the target takes the call_id as its key: the same call_id twice makes one effect",
    "query_answers_truly": "the query says NOT_DONE only when nothing happened, and changes nothing",
    "concurrency": "calls at once in real processes make one effect",
    "resume_original_identity": "a resume keeps the original call_id; a new attempt waits for it",
    "random_kills": "SIGKILL at every window, then a clean resume: one effect at most, nothing broken",
}
Counter_ = Callable[[Path, Mapping[str, Any], str], int]


class KitError(ValueError):
    """The kit cannot run: a bad MODULE:NAME, no args for a call, nothing to count effects with."""


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # PASS, FAIL, NEEDS_A_PERSON
    evidence: str

    @property
    def title(self) -> str:
        return CHECKS[self.name]

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "title": self.title, "verdict": self.verdict, "evidence": self.evidence}


@dataclasses.dataclass
class Report:
    adapter: str  # MODULE:ADAPTER as given
    tool: str
    version: str
    queryable: bool
    counted_by: str
    checks: list[Check]
    kept: Path | None = None  # the scratch run directories, when kept

    @property
    def passed(self) -> bool:
        return not any(check.failed for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "adapter": self.adapter,
            "tool": self.tool,
            "version": self.version,
            "queryable": self.queryable,
            "counted_by": self.counted_by,
            "passed": self.passed,
            "checks": [check.as_dict() for check in self.checks],
            "run_directories": str(self.kept) if self.kept else None,
        }


# --- loading what the user names --------------------------------------------------------


def load_object(spec: str, what: str) -> Any:
    """``MODULE:NAME`` (NAME may be dotted), imported as ``python -m`` would from the current folder."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise KitError(f"{what} must be MODULE:NAME, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script's path starts at its own folder
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - the user's module may fail in any way as it loads
        raise KitError(f"{what}: cannot import {module_name!r}: {type(error).__name__}: {error}") from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise KitError(f"{what}: {module_name!r} has no {attribute!r}") from None
    return found


def load_adapter(spec: str) -> Any:
    """The adapter ``spec`` names: an instance as it is, a class or zero-argument factory called."""
    found = load_object(spec, "the adapter")
    if not _is_adapter(found) and callable(found):
        try:
            inspect.signature(found).bind()
        except (TypeError, ValueError):
            raise KitError(f"{spec} needs arguments: name an instance or a zero-argument factory") from None
        found = found()
    if not _is_adapter(found):
        raise KitError(
            f"{spec} is not an adapter: it needs name and version (text), normalise and execute "
            "(receipts/tools.py, Adapter)"
        )
    return found


def _is_adapter(value: Any) -> bool:
    if isinstance(value, type):
        return False
    names = [getattr(value, attribute, None) for attribute in ("name", "version")]
    methods = [getattr(value, attribute, None) for attribute in ("normalise", "execute")]
    return all(isinstance(name, str) and name for name in names) and all(callable(method) for method in methods)


# --- counting effects --------------------------------------------------------------------


class Effects:
    """How many effects of one call the target holds: ``None`` when it cannot be told."""

    def __init__(self, adapter: Any, args: dict[str, Any], counter: Counter_ | None, counter_spec: str | None):
        self.adapter, self.args, self.counter = adapter, args, counter
        if counter is not None:
            self.by = f"the counter {counter_spec}"
        elif callable(getattr(adapter, "evidence", None)):
            self.by = "the adapter's evidence (present or absent: a counter would tell one effect from two)"
        elif adapter_can_query(adapter):
            self.by = "the adapter's query (happened or not: a counter would tell one effect from two)"
        else:
            raise KitError(
                f"nothing counts {adapter.name}'s effects: it has neither evidence nor query; "
                "give --counter MODULE:FUNC, FUNC(run_dir, args, call_id) -> int"
            )

    def count(self, run_dir: Path, call_id: str) -> int | None:
        args = json.loads(json.dumps(self.args))  # each look gets its own copy
        try:
            if self.counter is not None:
                found = self.counter(run_dir, args, call_id)
                return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else None
            if callable(getattr(self.adapter, "evidence", None)):
                verdict = getattr(self.adapter.evidence(run_dir, args, call_id), "verdict", None)
                return {PRESENT: 1, ABSENT: 0}.get(str(verdict))
            answer = self.adapter.query(run_dir, args, call_id)
        except Exception:  # noqa: BLE001 - a count that fails is a count nobody has
            return None
        if answer is NOT_DONE:
            return 0
        return 1 if isinstance(answer, dict) else None


def _count_text(count: int | None) -> str:
    if count is None:
        return "effects not countable"
    return f"{count} effect" + ("" if count == 1 else "s")


# --- the child processes ------------------------------------------------------------------


@dataclasses.dataclass
class Ended:
    """One child as it ended."""

    pid: int
    returncode: int
    output: dict[str, Any]
    stderr: str
    killed: bool = False
    hung: bool = False

    def describe(self) -> str:
        if self.hung:
            return f"hung past {STEP_TIMEOUT:.0f} s"
        if self.killed:
            return "killed"
        said = self.output.get("error") or self.output.get("status")
        if isinstance(said, dict):
            said = said.get("message")
        extra = f", needs {self.output['needs']}" if self.output.get("needs") else ""
        reused = ", reused" if self.output.get("reused") else ""
        tail = "" if self.output else f": {self.stderr.strip()[-300:]!r}"
        words = f"{said or ''}{reused}{extra}".strip(", ")
        return f"exit {self.returncode}" + (f" ({words})" if words else "") + tail

    @property
    def committed(self) -> bool:
        return self.returncode == 0 and self.output.get("status") == "committed" and not self.output.get("needs")

    @property
    def awaiting(self) -> bool:
        return self.returncode == 4 and self.output.get("needs") == "confirmation"


class Child:
    """``python -m receipts.conformance REQUEST``: prints ``ready`` once the adapter is loaded, then one JSON line."""

    def __init__(self, request: dict[str, Any], env: Mapping[str, str]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "receipts.conformance", json.dumps(request)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
        )
        self.early = b""
        self.ready_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self) -> bool:
        """Block until the child says ready (its adapter loaded); ``False`` when it ended first."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + STEP_TIMEOUT
        while b"\n" not in self.early and time.monotonic() < deadline:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self.early += chunk
        self.ready_at = time.monotonic()
        return self.early.startswith(b"ready\n")

    def go(self) -> None:
        assert self.popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.popen.stdin.write(b"go\n")
            self.popen.stdin.flush()

    def end(self, *, killed: bool = False) -> Ended:
        hung = False
        try:
            stdout, stderr = self.popen.communicate(timeout=STEP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            stdout, stderr = self.popen.communicate()
            hung = True
        lines = (self.early + stdout).decode(errors="replace").splitlines()
        try:
            output = json.loads(lines[-1]) if lines and lines[-1] != "ready" else {}
        except ValueError:
            output = {}
        killed = killed or self.popen.returncode == -signal.SIGKILL
        return Ended(self.pid, self.popen.returncode, output if isinstance(output, dict) else {},
                     stderr.decode(errors="replace"), killed, hung)  # fmt: skip


def _child_main(request: dict[str, Any]) -> int:
    """One step in a child process: a call through the writer, or the adapter's execute alone."""
    try:
        adapter = load_adapter(request["adapter"])
    except KitError as error:
        _say({"error": str(error)})
        return 1
    if request.get("lose_response"):
        adapter = _AnswerLost(adapter)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if request.get("wait_for_go"):
        sys.stdin.readline()
    run_dir = Path(request["run_dir"])
    if request["mode"] == "execute":
        args = adapter.normalise(request["args"])
        try:
            result = adapter.execute(run_dir, args, request["call_id"])
        except Exception as error:  # noqa: BLE001 - said to the kit, which judges it
            _say({"error": f"{type(error).__name__}: {error}"})
            return 3
        _say({"result": result})
        return 0
    try:
        outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, request["args"])
    except runtime.RecordingIncomplete as incomplete:
        _say(incomplete.outcome.as_dict() | {"recording_incomplete": str(incomplete.cause)})
        return 5
    except (ValueError, OSError) as error:
        _say({"error": f"{type(error).__name__}: {error}"})
        return 1
    _say(outcome.as_dict())
    if outcome.needs:
        return 4
    return 0 if outcome.status == "committed" else 3


def _say(document: Any) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


class _AnswerLost:
    """The adapter, whose answer is lost after the effect (a timeout after sending): ``OutcomeUnknown``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        self._inner.execute(run_dir, args, call_id)
        raise OutcomeUnknown("the conformance kit dropped the answer after the effect (a lost response)")


# --- the kit ---------------------------------------------------------------------------------


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
        root: Path,
    ) -> None:
        if trials < 0 or concurrency < 2:
            raise KitError("--trials must be 0 or more, --concurrency 2 or more")
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
        count_function = load_object(counter, "the counter") if counter else None
        if count_function is not None and not callable(count_function):
            raise KitError(f"the counter {counter} is not callable")
        self.effects = Effects(self.adapter, self.args, count_function, counter)
        self.trials, self.concurrency = trials, concurrency
        self.seed = random.SystemRandom().randrange(10**6) if seed is None else seed
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

    def child(self, run_dir: Path, *, mode: str = "call", failpoint: str | None = None, **extra: Any) -> Child:
        request = {"adapter": self.spec, "run_dir": str(run_dir), "args": self.raw_args, "mode": mode, **extra}
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

    def count(self, run_dir: Path, call_id: str) -> int | None:
        return self.effects.count(run_dir, call_id)

    def settled_as_it_may(self, ended: Ended) -> bool:
        """A resume's allowed end: committed, or (no query) waiting for a person."""
        return ended.committed or (not self.queryable and ended.awaiting)

    def resume_text(self, ended: Ended) -> str:
        if ended.committed:
            return "committed" + (" (reused: nothing ran again)" if ended.output.get("reused") else "")
        if ended.awaiting:
            return "waits for a person (exit 4)"
        return ended.describe()

    # --- the checks ----------------------------------------------------------------------

    def run(self) -> Report:
        checks = []
        for name in CHECKS:
            try:
                checks.append(getattr(self, f"check_{name}")())
            except Exception as error:  # noqa: BLE001 - one check that breaks must not hide the others
                checks.append(Check(name, FAIL, f"the check itself stopped: {type(error).__name__}: {error}"))
        return Report(self.spec, self.adapter.name, self.adapter.version, self.queryable, self.effects.by, checks)

    def check_restart_after_lost_response(self) -> Check:
        problems, said = [], []
        for how in ("killed after the effect", "the answer lost after the effect"):
            run_dir, call_id = self.new_run("restart")
            if how.startswith("killed"):
                first = self.killed_after_effect(run_dir)
                if not first.killed:
                    problems.append(f"{how}: the call never reached its effect ({first.describe()})")
                    continue
            else:
                first = self.call(run_dir, lose_response=True)
                if first.output.get("status") != "unknown":
                    problems.append(f"{how}: the receipt is not unknown ({first.describe()})")
            before = self.count(run_dir, call_id)
            resumed = self.call(run_dir)
            after = self.count(run_dir, call_id)
            said.append(f"{how}: {_count_text(before)}; the restart {self.resume_text(resumed)}, {_count_text(after)}")
            if before != 1:
                problems.append(f"{how}: the target shows {_count_text(before)} after the effect, not 1")
            if after != 1:
                problems.append(f"{how}: after the restart {_count_text(after)}")
            if not self.settled_as_it_may(resumed):
                problems.append(f"{how}: the restart ended {resumed.describe()}")
        return self.verdict("restart_after_lost_response", problems, said)

    def check_same_request_reuse(self) -> Check:
        run_dir, call_id = self.new_run("reuse")
        first, again = self.call(run_dir), self.call(run_dir)
        effects = self.count(run_dir, call_id)
        problems = []
        if not first.committed:
            problems.append(f"the first call ended {first.describe()}")
        if not (again.committed and again.output.get("reused")):
            problems.append(f"the same call again ended {again.describe()}, not reused")
        elif again.output.get("result") != first.output.get("result"):
            problems.append("the same call again gave another result than the first")
        if effects != 1:
            problems.append(f"{_count_text(effects)} after the same call twice")
        said = [f"first {self.resume_text(first)}, again {self.resume_text(again)}, {_count_text(effects)}"]
        return self.verdict("same_request_reuse", problems, said)

    def check_identity_mismatch(self) -> Check:
        run_dir, call_id = self.new_run("mismatch")
        contract = runtime.run_contract(run_dir)
        other = {**self.args, "conformance_other": "another request under this call_id"}
        planted = {
            "call_id": call_id,
            "identity": protocol.IDENTITY_V2,
            "contract_sha256": contract,
            "attempt": 1,
            "tool": self.adapter.name,
            "tool_version": self.adapter.version,
            "args": other,
            "input_sha256": protocol.input_sha256(other),
            "queryable": self.queryable,
            "status": "prepared",
        }
        path = run_dir / "receipts" / f"{call_id}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(json_file(planted))
        ended = self.call(run_dir)
        effects = self.count(run_dir, call_id)
        problems = []
        if not ended.awaiting:
            problems.append(f"the call under that id ended {ended.describe()}, not a conflict for a person")
        if effects != 0:
            problems.append(f"{_count_text(effects)}: the call ran over a receipt that is not its own")
        if path.read_bytes() != json_file(planted):
            problems.append("the receipt on record was changed")
        said = [f"the call {self.resume_text(ended)}, {_count_text(effects)}, the receipt on record kept"]
        return self.verdict("identity_mismatch", problems, said)

    def check_idempotency_key(self) -> Check:
        if not self.queryable:
            return Check("idempotency_key", NEEDS_A_PERSON, "no query: the writer never hands the target the same "
                         "call_id twice; a call in doubt waits for a person")  # fmt: skip
        run_dir, call_id = self.new_run("key")
        counts, said, problems = [], [], []
        for _ in range(2):
            ended = self.call(run_dir, mode="execute", call_id=call_id)
            counts.append(self.count(run_dir, call_id))
            said.append(f"execute in a new process: {ended.describe()}, {_count_text(counts[-1])}")
        if counts != [1, 1]:
            problems.append(
                f"the same call_id executed twice (a retry after a lost response) left {_count_text(counts[-1])}: "
                "the target does not take the call_id as its idempotency key"
            )
        return self.verdict("idempotency_key", problems, said)

    def check_query_answers_truly(self) -> Check:
        if not self.queryable:
            return Check("query_answers_truly", NEEDS_A_PERSON, "no query: whether a call in doubt happened is a "
                         "person's decision")  # fmt: skip
        run_dir, call_id = self.new_run("query")
        problems, said = [], []
        before = self.ask(run_dir, call_id)
        if isinstance(before, dict):
            problems.append("before any effect the query returns a result: it claims an effect that never happened")
        if self.count(run_dir, call_id) != 0:
            problems.append("the query made an effect where there was none")
        said.append(f"before the effect: {_answer_text(before)}")
        executed = self.call(run_dir, mode="execute", call_id=call_id)
        if executed.returncode != 0 or self.count(run_dir, call_id) != 1:
            problems.append(f"execute ended {executed.describe()}, {_count_text(self.count(run_dir, call_id))}")
            return self.verdict("query_answers_truly", problems, said)
        after = self.ask(run_dir, call_id)
        effects = self.count(run_dir, call_id)
        said.append(f"after the effect: {_answer_text(after)}, {_count_text(effects)}")
        if after is NOT_DONE:
            problems.append("the query answers NOT_DONE while the effect is there: the writer would make it again")
        elif isinstance(after, OutcomeUnknown):
            problems.append("the query cannot tell about an effect that is there: every call killed after its "
                            "effect would wait for a person")  # fmt: skip
        elif not isinstance(after, dict):
            problems.append(f"the query gives no answer the writer can act on: {_answer_text(after)}")
        if effects != 1:
            problems.append(f"after the query {_count_text(effects)}: the query made an effect (it re-executes)")
        return self.verdict("query_answers_truly", problems, said)

    def ask(self, run_dir: Path, call_id: str) -> Any:
        try:
            return self.adapter.query(run_dir, json.loads(json.dumps(self.args)), call_id)
        except OutcomeUnknown as unknown:
            return unknown
        except Exception as error:  # noqa: BLE001 - the writer counts any failure as "cannot tell"
            return OutcomeUnknown(f"{type(error).__name__}: {error}")

    def check_concurrency(self) -> Check:
        run_dir, call_id = self.new_run("together")
        children = [self.child(run_dir, wait_for_go=True) for _ in range(self.concurrency)]
        for child in children:
            child.wait_ready()
        for child in children:
            child.go()
        ended = [child.end() for child in children]
        effects = self.count(run_dir, call_id)
        outcomes = Counter(
            "reused" if end.committed and end.output.get("reused") else "committed" if end.committed else end.describe()
            for end in ended
        )
        problems = []
        if effects != 1:
            problems.append(f"{self.concurrency} calls at once left {_count_text(effects)}")
        if not all(end.committed for end in ended):
            problems.append("not every call ended committed")
        said = [f"{self.concurrency} processes at once: " + ", ".join(f"{n} {what}" for what, n in outcomes.items()),
                _count_text(effects)]  # fmt: skip
        return self.verdict("concurrency", problems, said)

    def check_resume_original_identity(self) -> Check:
        problems, said = [], []
        again = self.adapter.normalise(json.loads(json.dumps(self.args)))
        if again != self.args:
            problems.append("normalising the normalised args gives other args: a runtime resuming from a "
                            "receipt's args would get a new call_id")  # fmt: skip
        run_dir, call_id = self.new_run("resume")
        first = self.killed_after_effect(run_dir)
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
        resumed = self.call(run_dir)
        effects = self.count(run_dir, call_id)
        if resumed.output.get("call_id") != call_id:
            problems.append(f"the resume ran under {resumed.output.get('call_id')}, not the original {call_id}")
        if not self.settled_as_it_may(resumed):
            problems.append(f"the resume ended {resumed.describe()}")
        if effects != 1:
            problems.append(f"after the resume {_count_text(effects)}")
        said.append(f"the resume under the original call_id {self.resume_text(resumed)}, {_count_text(effects)}")
        if resumed.committed:
            try:
                runtime.run_set_state(run_dir, state="retrying", attempts=1)
                said.append("then the new attempt starts")
            except runtime.UnsettledCalls:
                problems.append("the call is committed, and still a new attempt is refused")
        return self.verdict("resume_original_identity", problems, said)

    def check_random_kills(self) -> Check:
        if self.trials == 0:
            return Check("random_kills", NOT_APPLICABLE, "--trials 0: no kill was tried")
        span = self.calibrate()
        windows: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        problems: list[str] = []
        sent = landed = 0
        for trial in range(self.trials):
            rng = random.Random(self.seed + trial)  # noqa: S311 - kill plans, not secrets
            run_dir, call_id = self.new_run("kills")
            plan = [KILL_PLAN[trial % len(KILL_PLAN)]]  # every window once in the first trials
            plan += [rng.choice(KILL_PLAN) for _ in range(rng.randrange(MAX_KILLS))]
            steps = []
            for where in plan:
                sent += 1
                ended = self.kill(run_dir, where, rng.uniform(0, span))
                effects = self.count(run_dir, call_id)
                if ended.killed:
                    landed += 1
                    window = call_window(run_dir, call_id, {ended.pid}, functools.partial(bool, effects))
                    windows[window] += 1
                    steps.append(f"{where}: {window}")
                else:
                    steps.append(f"{where}: {ended.describe()}")
                    if ended.hung or not self.settled_as_it_may(ended):
                        problems.append(f"trial {trial} (seed {self.seed + trial}): a call the kill missed "
                                        f"ended {ended.describe()}")  # fmt: skip
                if effects is None or effects > 1:
                    problems.append(f"trial {trial} (seed {self.seed + trial}): {_count_text(effects)} after "
                                    f"{' / '.join(steps)}")  # fmt: skip
            final = self.call(run_dir)
            effects = self.count(run_dir, call_id)
            outcomes[self.resume_text(final) if final.committed or final.awaiting else "other"] += 1
            ok = (final.committed and effects == 1) or (
                not self.queryable and final.awaiting and effects is not None and effects <= 1
            )
            if not ok:
                problems.append(f"trial {trial} (seed {self.seed + trial}): after {' / '.join(steps)} the clean "
                                f"resume ended {final.describe()} with {_count_text(effects)}")  # fmt: skip
            if "Traceback" in final.stderr:
                problems.append(f"trial {trial}: the clean resume printed a traceback")
            problems += [f"trial {trial}: {problem}" for problem in self.run_problems(run_dir)]
        starred = sum(windows[window] for window in CALL_EFFECT_DONE_UNRECORDED)
        said = [
            f"{self.trials} trials (seed {self.seed}), {sent} kills sent, {landed} landed, {starred} of them "
            "with the effect done and its receipt not yet committed",
            "windows: " + ", ".join(f"{window} {n}" for window, n in sorted(windows.items())),
            "clean resumes: " + ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items())),
        ]
        return self.verdict("random_kills", problems, said)

    def kill(self, run_dir: Path, where: str, delay: float) -> Ended:
        """One call, SIGKILLed at the failpoint ``where`` (stopped there first), or ``delay`` s after it is ready."""
        from receipts.crashes import kill_at_failpoint

        if where != RANDOM:
            child = self.child(run_dir, failpoint=f"{where}:stop")
            return child.end(killed=kill_at_failpoint(child.popen, STEP_TIMEOUT) == "killed")
        child = self.child(run_dir, wait_for_go=True)
        child.wait_ready()
        child.go()
        time.sleep(delay)
        child.popen.send_signal(signal.SIGKILL)  # polls first: a child that has ended is never signalled
        return child.end()

    def calibrate(self) -> float:
        """How long a clean call takes, from ready to exit (the median of a few), times the margin."""
        times = []
        for _ in range(CALIBRATION_RUNS):
            run_dir, _ = self.new_run("calibrate")
            child = self.child(run_dir, wait_for_go=True)
            child.wait_ready()
            started = time.monotonic()
            child.go()
            child.end()
            times.append(time.monotonic() - started)
        times.sort()
        return SPAN_MARGIN * times[len(times) // 2]

    def run_problems(self, run_dir: Path) -> list[str]:
        """What the run directory must show after any resume: the ledger's chain, and no reader finding."""
        from receipts.reader import read_run

        _, problems = ledger_events(run_dir)
        files, ledger_findings = read_run(run_dir, keep_events=False)
        problems += [f"reader finding {finding.code}: {finding.detail}" for finding in files.findings]
        problems += [f"ledger finding {finding.code}: {finding.detail}" for finding in ledger_findings]
        return problems

    @staticmethod
    def verdict(name: str, problems: Sequence[str], said: Sequence[str]) -> Check:
        if problems:
            return Check(name, FAIL, "; ".join(problems) + (" (" + "; ".join(said) + ")" if said else ""))
        return Check(name, PASS, "; ".join(said))


def _answer_text(answer: Any) -> str:
    if answer is NOT_DONE:
        return "NOT_DONE"
    if isinstance(answer, OutcomeUnknown):
        return f"cannot tell ({answer})"
    if isinstance(answer, dict):
        return "the result"
    return f"a {type(answer).__name__}"


# --- counters for the built-in targets ------------------------------------------------------


def count_outbox_lines(run_dir: Path, args: Mapping[str, Any], call_id: str) -> int:
    """``send_message``'s effects: the lines of outbox.jsonl that carry the call_id (torn ones too)."""
    try:
        data = (Path(run_dir) / "outbox.jsonl").read_bytes()
    except FileNotFoundError:
        return 0
    return sum(call_id.encode() in line for line in data.splitlines())


# --- the table ---------------------------------------------------------------------------------


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


def format_table(report: Report) -> str:
    kind = "queryable" if report.queryable else "not queryable (a call in doubt waits for a person)"
    lines = [
        f"{report.tool} {report.version} ({report.adapter}): {kind}",
        f"effects counted by {report.counted_by}",
        "",
        f"{'check':<28} {'verdict':<31} evidence",
    ]
    for check in report.checks:
        verdict = check.verdict.upper() if check.verdict in (PASS, FAIL) else check.verdict
        lines.append(f"{check.name:<28} {verdict:<31} {check.evidence}")
    tally = Counter("failed" if check.failed else "passed" if check.verdict == PASS else "not applicable"
                    for check in report.checks)  # fmt: skip
    lines += ["", ", ".join(f"{tally[what]} {what}" for what in ("passed", "failed", "not applicable"))]
    if report.kept:
        lines.append(f"run directories kept under {report.kept}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_child_main(json.loads(sys.argv[1])))
