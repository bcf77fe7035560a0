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
import datetime as dt
import functools
import importlib
import inspect
import json
import os
import random
import re
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
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, OutcomeUnknown, Rejected, adapter_can_query

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
    "calls_kept_apart": "several calls on one target: each its own effect; a call never made is not found",
    "evidence_matches_target": "the evidence says present or absent as the counter finds the target",
    "failing_target": "a target that fails: the call is never committed without its effect",
    "keys_kept": "the target still knows a call_id after a wait: the same call_id again makes no second effect",
    "past_key_retention": 'past the key retention the adapter declares, "not found" is not taken for "not done"',
    "normalise_in_general": "on generated args, normalise is stable and the same in every process",
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
        try:
            found = found()
        except Exception as error:  # noqa: BLE001 - the user's factory may fail in any way
            raise KitError(f"{spec} could not build the adapter: {type(error).__name__}: {error}") from None
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
        elif callable(getattr(adapter, "evidence", None)) and getattr(adapter, "checks_commits", True) is not False:
            self.by = "the adapter's evidence (present or absent: a counter would tell one effect from two)"
        elif adapter_can_query(adapter):
            self.by = "the adapter's query (happened or not: a counter would tell one effect from two)"
        else:
            raise KitError(
                f"nothing counts {adapter.name}'s effects: it has neither a query nor evidence that looks at its "
                "target (checks_commits = False); "
                "give --counter MODULE:FUNC, FUNC(run_dir, args, call_id) -> int"
            )

    def count(self, run_dir: Path, call_id: str, args: Mapping[str, Any] | None = None) -> int | None:
        """The effects of the call ``call_id`` (of ``args``, normalised; the example's by default)."""
        args = json.loads(json.dumps(self.args if args is None else args))  # each look gets its own copy
        try:
            if self.counter is not None:
                found = self.counter(run_dir, args, call_id)
                return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else None
            if self.by.startswith("the adapter's evidence"):
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


# --- generated argument sets -----------------------------------------------------------------

# Text a target or a normalise may treat unlike the example's: runs of spaces, tabs, accents,
# another script, an emoji, another case. Each generated set carries its number too, so that
# the sets differ from each other and from the example.
_TEXT_VARIANTS: tuple[Callable[[str, int], str], ...] = (
    lambda text, n: f"{text} {n}",
    lambda text, n: f"  {text}   {n}  ",
    lambda text, n: f"{text}\t{n}",
    lambda text, n: f"{text} é{n}",
    lambda text, n: f"{text} 日本 {n}",
    lambda text, n: f"{text.upper()} {n}",
    lambda text, n: f"{text} 🙂 {n}",
    lambda text, n: f"{text}    x    {n}",
)


# An e-mail address stays one: a target that validates addresses (the SMTP adapter) would refuse
# every set derived the text way, and the checks that need other sets would learn nothing.
_ADDRESS_SHAPE = re.compile(r"([^\s@]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)")
_ADDRESS_VARIANTS: tuple[Callable[[str, str, int], str], ...] = (
    lambda local, domain, n: f"{local}+{n}@{domain}",
    lambda local, domain, n: f"{local.upper()}+{n}@{domain}",
    lambda local, domain, n: f"{local}+{n}@{domain.upper()}",
)


def derive_args(example: Any, number: int) -> Any:
    """The example's args made the ``number``-th other way: every text and number changed, the shape kept.

    Text shaped like an e-mail address stays an address (``ops@example.com`` becomes
    ``ops+1@example.com``); other text gets spaces, accents, another script, another case.
    """
    if isinstance(example, dict):
        return {key: derive_args(value, number) for key, value in example.items()}
    if isinstance(example, list):
        return [derive_args(value, number) for value in example]
    if isinstance(example, str):
        if address := _ADDRESS_SHAPE.fullmatch(example):
            variant = _ADDRESS_VARIANTS[(number - 1) % len(_ADDRESS_VARIANTS)]
            return variant(address.group(1), address.group(2), number)
        return _TEXT_VARIANTS[(number - 1) % len(_TEXT_VARIANTS)](example, number)
    if isinstance(example, bool) or example is None:
        return example
    if isinstance(example, int):
        return example + number if example >= 0 else example - number
    if isinstance(example, float):
        return example + number / 8
    return example


def draw_args(strategy: Any, count: int, seed: int) -> list[Any]:
    """``count`` examples of a hypothesis strategy (the adapter's ``args_strategy``), reproducible by ``seed``."""
    try:
        import hypothesis
        from hypothesis import strategies
    except ImportError:
        raise KitError("the adapter's args_strategy is a hypothesis strategy: pip install hypothesis") from None
    if not isinstance(strategy, strategies.SearchStrategy):
        raise KitError(f"args_strategy must be a hypothesis strategy, not a {type(strategy).__name__}")
    drawn: list[Any] = []

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=count, database=None, deadline=None, phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
    @hypothesis.given(strategy)
    def collect(args: Any) -> None:
        drawn.append(json.loads(json.dumps(args)))

    try:
        collect()
    except Exception as error:  # noqa: BLE001 - the user's strategy may fail in any way
        raise KitError(f"args_strategy could not draw args: {type(error).__name__}: {error}") from None
    return drawn[:count]


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
    if request["mode"] == "normalise":
        _say({"normalised": [_normalised_or_refusal(adapter, args) for args in request["args_list"]]})
        return 0
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


def _normalised_or_refusal(adapter: Any, args: Any) -> Any:
    try:
        return adapter.normalise(args)
    except Exception as error:  # noqa: BLE001 - compared with the kit's own attempt
        return {"refused": type(error).__name__}


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
        other = {**self.args, "conformance_other": "another request under this call_id"}
        path = self.plant_receipt(run_dir, call_id, other, protocol.format_time(protocol.utc_now()))
        planted = path.read_bytes()
        ended = self.call(run_dir)
        effects = self.count(run_dir, call_id)
        problems = []
        if not ended.awaiting:
            problems.append(f"the call under that id ended {ended.describe()}, not a conflict for a person")
        if effects != 0:
            problems.append(f"{_count_text(effects)}: the call ran over a receipt that is not its own")
        if path.read_bytes() != planted:
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

    def ask(self, run_dir: Path, call_id: str, args: Mapping[str, Any] | None = None) -> Any:
        try:
            return self.adapter.query(run_dir, json.loads(json.dumps(self.args if args is None else args)), call_id)
        except OutcomeUnknown as unknown:
            return unknown
        except Exception as error:  # noqa: BLE001 - the writer counts any failure as "cannot tell"
            return OutcomeUnknown(f"{type(error).__name__}: {error}")

    def check_calls_kept_apart(self) -> Check:
        calls = self.distinct_calls()
        if len(calls) < 3:
            return Check("calls_kept_apart", FAIL, f"normalise accepted {len(calls)} other arg sets of "
                         f"{len(self.raw_generated) - 1} ({self.generated_by}): the kit needs three (two made, one "
                         "never made); give an args_strategy on the adapter, or --generated more")  # fmt: skip
        problems, said = [], []
        # Through the writer, one after another on one target: each its own effect.
        run_dir, _ = self.new_run("apart")
        *made, never = calls[:3]
        for number, (raw, normalised) in enumerate(made, 1):
            ended = self.call(run_dir, args=raw)
            call_id = self.call_id_for(run_dir, normalised)
            effects = self.count(run_dir, call_id, normalised)
            said.append(f"call {number} {self.resume_text(ended)}, {_count_text(effects)}")
            if not ended.committed:
                problems.append(f"call {number} ({short_text(raw)}) ended {ended.describe()}")
            if effects != 1:
                problems.append(f"call {number} ({short_text(raw)}) committed with {_count_text(effects)} of its own: "
                                "the target took it for another call's")  # fmt: skip
        first_effects = self.count(run_dir, self.call_id_for(run_dir, made[0][1]), made[0][1])
        if first_effects != 1:
            problems.append(f"after the later calls the first shows {_count_text(first_effects)}")
        never_id = self.call_id_for(run_dir, never[1])
        if self.queryable:
            answer = self.ask(run_dir, never_id, never[1])
            said.append(f"the query of a call never made, beside them: {_answer_text(answer)}")
            if isinstance(answer, dict):
                problems.append("the query answers with a result for a call never made while others were: the "
                                "writer would take a call that never happened for done")  # fmt: skip
        if self.count(run_dir, never_id, never[1]) != 0:
            problems.append("the target shows an effect of a call never made")
        # Beneath the writer: call_ids one character apart are two keys, two effects.
        run_dir, _ = self.new_run("apart-keys")
        base = self.call_id_for(run_dir, made[0][1])
        keys = [base, base[:-1] + _other_hex(base[-1]), _other_hex(base[0]) + base[1:]]
        counts = []
        for (raw, normalised), key in zip(calls[:3], keys, strict=True):
            ended = self.call(run_dir, mode="execute", call_id=key, args=raw)
            counts.append(self.count(run_dir, key, normalised))
            if ended.returncode != 0:
                problems.append(f"execute under a call_id one character from another's ended {ended.describe()}")
        said.append("execute under call_ids one character apart (the last, the first): "
                    + ", ".join(_count_text(count) for count in counts))  # fmt: skip
        if counts != [1, 1, 1]:
            problems.append("call_ids one character apart are not kept apart: the target keys on part of the call_id")
        return self.verdict("calls_kept_apart", problems, said)

    def check_evidence_matches_target(self) -> Check:
        if not callable(getattr(self.adapter, "evidence", None)):
            return Check("evidence_matches_target", NOT_APPLICABLE, "the adapter has no evidence")
        if getattr(self.adapter, "checks_commits", True) is False:
            return Check("evidence_matches_target", NOT_APPLICABLE, "its evidence cannot look at the target "
                         "(checks_commits = False)")  # fmt: skip
        if self.effects.counter is None:
            return Check("evidence_matches_target", NOT_APPLICABLE, "effects are counted by the evidence itself: "
                         "give --counter to check it against the target")  # fmt: skip
        calls = self.distinct_calls()
        if len(calls) < 3:
            return Check("evidence_matches_target", FAIL, "normalise accepted fewer than three other arg sets")
        run_dir, _ = self.new_run("evidence")
        problems, said, results = [], [], []
        for raw, _ in calls[:2]:
            ended = self.call(run_dir, args=raw)
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
            call_id = self.call_id_for(run_dir, args)
            effects = self.count(run_dir, call_id, args)
            verdict = self.look(run_dir, args, call_id, result)
            said.append(f"{what}: evidence {verdict}, the counter {_count_text(effects)}")
            if verdict == PRESENT and (effects == 0 or foreign):
                problems.append(f"{what}: the evidence says present where the target shows {_count_text(effects)}"
                                + (" of that result" if foreign and effects else ""))  # fmt: skip
            elif verdict == ABSENT and effects and not foreign:
                problems.append(f"{what}: the evidence says absent where the target shows {_count_text(effects)}")
            elif verdict not in (PRESENT, ABSENT, UNCLEAR):
                problems.append(f"{what}: the evidence gives no verdict ({verdict})")
        return self.verdict("evidence_matches_target", problems, said)

    def look(self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Any) -> str:
        try:
            found = self.adapter.evidence(run_dir, json.loads(json.dumps(args)), call_id, result)
        except Exception as error:  # noqa: BLE001 - said in the check's evidence
            return f"raised {type(error).__name__}: {error}"
        return str(getattr(found, "verdict", found))

    def check_failing_target(self) -> Check:
        if self.failing is None:
            return Check("failing_target", NOT_APPLICABLE, "no failing args: give --failing-args JSON (or "
                         "failing_args on the adapter), args the target itself refuses or fails on")  # fmt: skip
        run_dir, _ = self.new_run("failing")
        call_id = self.call_id_for(run_dir, self.failing)
        problems, said = [], []
        for how in ("the call", "the same call again"):
            ended = self.call(run_dir, args=self.raw_failing)
            effects = self.count(run_dir, call_id, self.failing)
            said.append(f"{how} {self.resume_text(ended)}, {_count_text(effects)}")
            if ended.committed and effects != 1:
                problems.append(f"{how} ended committed with {_count_text(effects)}: execute returned a result "
                                "for the target's failure")  # fmt: skip
            elif ended.committed and how == "the call":
                problems.append("the call ended committed: the target did not fail on the failing args")
            if "Traceback" in ended.stderr:
                problems.append(f"{how} printed a traceback")
            if ended.hung:
                problems.append(f"{how} hung")
        return self.verdict("failing_target", problems, said)

    def check_keys_kept(self) -> Check:
        if not self.queryable:
            return Check("keys_kept", NEEDS_A_PERSON, "no query: the writer never hands the target the same call_id "
                         "twice")  # fmt: skip
        declared = getattr(self.adapter, "key_retention", None)
        if self.key_wait == 0:
            return Check("keys_kept", NOT_APPLICABLE, "--key-wait 0: no wait was tried")
        if isinstance(declared, (int, float)) and declared < self.key_wait:
            return Check("keys_kept", NOT_APPLICABLE, f"the adapter declares keys kept {declared:g} s, less than "
                         f"--key-wait {self.key_wait:g} s (past_key_retention checks what follows)")  # fmt: skip
        run_dir, call_id = self.new_run("kept")
        first = self.call(run_dir, mode="execute", call_id=call_id)
        before = self.count(run_dir, call_id)
        time.sleep(self.key_wait)
        answer = self.ask(run_dir, call_id)
        again = self.call(run_dir, mode="execute", call_id=call_id)
        after = self.count(run_dir, call_id)
        said = [f"execute: {first.describe()}, {_count_text(before)}; {self.key_wait:g} s later the query: "
                f"{_answer_text(answer)}; execute again: {again.describe()}, {_count_text(after)}"]  # fmt: skip
        problems = []
        if before != 1:
            problems.append(f"the first execute left {_count_text(before)}")
        if answer is NOT_DONE:
            problems.append(f"{self.key_wait:g} s after the effect the query answers NOT_DONE: the target forgot the "
                            "call_id, and the writer would make the call again")  # fmt: skip
        if after != 1:
            problems.append(f"{self.key_wait:g} s later the same call_id made another effect: the target forgot its "
                            "key sooner than the adapter declares (key_retention: "
                            f"{'for ever' if declared is None else f'{declared:g} s'})")  # fmt: skip
        return self.verdict("keys_kept", problems, said)

    def check_past_key_retention(self) -> Check:
        declared = getattr(self.adapter, "key_retention", None)
        if not self.queryable:
            return Check(
                "past_key_retention", NEEDS_A_PERSON, "no query: a call in doubt waits for a person at any age"
            )
        if not isinstance(declared, (int, float)) or isinstance(declared, bool) or declared <= 0:
            return Check("past_key_retention", NOT_APPLICABLE, "the adapter declares no key_retention: its target "
                         "keeps keys for ever (keys_kept waits to see)")  # fmt: skip
        run_dir, call_id = self.new_run("retention")
        # The clock moved past the retention: the call was begun that long ago, and its answer lost.
        begun = protocol.utc_now() - dt.timedelta(seconds=declared * 1.1 + 60)
        self.plant_receipt(run_dir, call_id, self.args, protocol.format_time(begun))
        ended = self.call(run_dir)
        effects = self.count(run_dir, call_id)
        said = [f"a call begun {_span(declared * 1.1 + 60)} ago (keys kept {_span(declared)}), its target showing "
                f"nothing: the resume {self.resume_text(ended)}, {_count_text(effects)}"]  # fmt: skip
        problems = []
        if not ended.awaiting:
            problems.append("past the retention the adapter declares, the target's \"not found\" was taken for "
                            f"\"not done\" ({ended.describe()}): a call whose key it forgot is made twice")  # fmt: skip
        if effects:
            problems.append(f"the resume made {_count_text(effects)}")
        return self.verdict("past_key_retention", problems, said)

    def check_normalise_in_general(self) -> Check:
        problems, accepted, refused = [], [], 0
        for raw in self.raw_generated:
            try:
                normalised = self.adapter.normalise(json.loads(json.dumps(raw)))
            except Rejected:
                refused += 1
                continue
            except Exception as error:  # noqa: BLE001 - a normalise must refuse with Rejected
                problems.append(f"normalise raised {type(error).__name__} on {short_text(raw)}: refuse with Rejected")
                continue
            try:
                again = self.adapter.normalise(json.loads(json.dumps(normalised)))
            except Exception as error:  # noqa: BLE001 - said as the fault it is
                again = {"refused": f"{type(error).__name__}: {error}"}
            if protocol.canonical_json(again) != protocol.canonical_json(normalised):
                twice, once = short_text(again), short_text(normalised)
                problems.append(f"normalising {short_text(raw)} twice gives {twice}, not {once}: a resume from "
                                "the receipt's args gets a new call_id")  # fmt: skip
            accepted.append((raw, normalised))
        elsewhere = self.child(self.root, mode="normalise", args_list=[raw for raw, _ in accepted]).end()
        theirs = elsewhere.output.get("normalised")
        if not isinstance(theirs, list) or len(theirs) != len(accepted):
            problems.append(f"normalising in another process ended {elsewhere.describe()}")
        else:
            for (raw, normalised), other in zip(accepted, theirs, strict=True):
                if protocol.canonical_json(other) != protocol.canonical_json(normalised):
                    problems.append(f"{short_text(raw)} normalises to {short_text(other)} in another process, not "
                                    f"{short_text(normalised)}: each process computes another call_id")  # fmt: skip
                    break
        said = [f"{len(self.raw_generated)} arg sets (the example's and {self.generated_by}): {len(accepted)} "
                f"accepted, {refused} refused; each normalised twice, and once in another process"]  # fmt: skip
        return self.verdict("normalise_in_general", problems[:5], said)

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


def _other_hex(character: str) -> str:
    return "0" if character != "0" else "1"


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.3g} s"


def short_text(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
