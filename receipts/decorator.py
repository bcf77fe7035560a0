"""``@receipted``: a plain Python function as a receipted tool. Standard library only.

The decorated function keeps its name, docstring, signature and type hints
(less ``call_id``), so an agent framework that builds a tool from a typed
function builds it from this one. Calling it runs through the writer
(``runtime.Executor``) with the function made into an adapter: the call_id is
computed from the run's contract, attempt, the tool's name and version and the
bound arguments, as for any adapter; the function gets it as its keyword-only
``call_id`` argument, to pass on as the target's idempotency key; the receipt
records what it returns (``{"returned": value}``, JSON). A committed call is
never run again: calling it again returns what was recorded.

The run is bound by ``use_run(run_dir)`` (a context variable: each thread, and
each asyncio task, sees its own binding) or given per call with
``tool.call_in(run_dir, ...)``.

An ``async def`` function makes an ``async def`` tool: awaiting it runs the
writer in a thread of its own (its files and locks block) and the function's
coroutine on the caller's event loop, awaited inside the receipt: the receipt
says prepared before the coroutine starts and committed only once it returned.
``query`` and ``evidence`` may be coroutines too.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import decimal
import enum
import functools
import inspect
import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

from receipts.runtime import CallOutcome, Executor
from receipts.tools import NOT_DONE, Evidence, Fact, OutcomeUnknown, Rejected

__all__ = [
    "CallInDoubt",
    "FunctionAdapter",
    "NoRunBound",
    "ReceiptedTool",
    "SettledWithoutAnswer",
    "receipted",
    "use_run",
]

CALL_ID = "call_id"


class NoRunBound(RuntimeError):  # noqa: N818 - says what is missing, as LookupError would
    """A receipted tool was called with no run directory bound (``use_run``) or given (``call_in``)."""


class CallInDoubt(OutcomeUnknown):
    """The call did not end committed or rejected: a person decides (``outcome`` says what the writer saw)."""

    def __init__(self, message: str, outcome: CallOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class SettledWithoutAnswer(RuntimeError):  # noqa: N818 - an outcome, said to the caller
    """A person settled the call as done, and no answer of the function's was recorded: it is not
    in doubt (nobody need decide again, and it never runs again), and there is nothing to return.
    ``outcome`` carries the call_id and the confirmation."""

    def __init__(self, message: str, outcome: CallOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclasses.dataclass(frozen=True)
class _Binding:
    run_dir: Path
    attempt: int | None
    override_unsettled: str | None


_BOUND: contextvars.ContextVar[_Binding] = contextvars.ContextVar("receipts_bound_run")
# The event loop of the task awaiting an async tool: its coroutine runs there (it may hold clients
# bound to that loop), while the writer works in a thread beside it.
_CALLER_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop] = contextvars.ContextVar("receipts_caller_loop")


# How often the writer's thread, waiting for a coroutine on the caller's loop, looks whether that
# loop still runs.
_LOOP_LOOK_SECONDS = 0.1


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _settled(value: Any) -> Any:
    """``value``, or what it gives once awaited: on the caller's loop from the writer's thread, or
    on a loop of its own for a call with no loop awaiting it (``call_in`` from plain code)."""
    if not inspect.isawaitable(value):
        return value
    loop = _CALLER_LOOP.get(None)
    if loop is None:
        return asyncio.run(_awaited(value))
    future = asyncio.run_coroutine_threadsafe(_awaited(value), loop)
    while True:
        try:
            return future.result(timeout=_LOOP_LOOK_SECONDS)
        except TimeoutError:
            if future.done():
                raise  # the coroutine's own TimeoutError
            if loop.is_running():
                continue
        # The caller's loop stopped with the coroutine unfinished (an agent framework's run_sync
        # ended while a call beside this one was in doubt): it will never finish, and waiting
        # would keep the process from exiting. How far it went, nobody knows.
        future.cancel()
        raise OutcomeUnknown(
            "the event loop running the function stopped before it finished: it may have had its effect"
        )


async def _in_a_thread_of_its_own(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a new thread carrying this context, awaited.

    Not the loop's default thread pool (``asyncio.to_thread``): the writer's thread waits for the
    function's coroutine, and a coroutine that needs that pool (``asyncio.to_thread``, asyncio's
    ``getaddrinfo``) would wait for a thread that the writer's threads of the calls made at once
    all hold. Cancelled, the caller stops waiting and the call goes on in its thread."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def hand_over(settle: Callable[[Any], None], value: Any) -> None:
        if not answered.done():  # the caller was cancelled: nobody waits for the answer
            settle(value)

    def work() -> None:
        try:
            result = context.run(function, *args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller, as to_thread does
            settle, value = answered.set_exception, error
        else:
            settle, value = answered.set_result, result
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for the answer
            loop.call_soon_threadsafe(hand_over, settle, value)

    writer = threading.Thread(target=work, name="receipts-writer")
    writer.start()
    try:
        return await answered
    except asyncio.CancelledError:
        # asyncio.run waits for its default pool before it returns: a thread of it waits for this
        # call's thread to end (not only its function: the thread still hands the answer over
        # after it), so that the receipt says how the call ended once the loop's runner is done.
        with contextlib.suppress(RuntimeError):  # the pool is shut down already: nothing will wait
            loop.run_in_executor(None, writer.join)
        raise


@contextlib.contextmanager
def use_run(
    run_dir: Path | str, *, attempt: int | None = None, override_unsettled: str | None = None
) -> Iterator[Path]:
    """Receipted tools called inside this block write their receipts to ``run_dir``.

    The binding is a context variable, so concurrent runs in threads do not mix:
    a thread (or asyncio task) sees the run it bound itself. A new
    ``threading.Thread`` starts with no binding; ``asyncio.to_thread`` and tasks
    carry the caller's. ``attempt`` and ``override_unsettled`` go to
    ``Executor.call``.
    """
    token = _BOUND.set(_Binding(Path(run_dir), attempt, override_unsettled))
    try:
        yield Path(run_dir)
    finally:
        _BOUND.reset(token)


# The objects of the function's arguments as its caller gave them, for this call: the function (and
# its query and evidence) gets those, while the receipt records their JSON form.
_GIVEN: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("receipts_given_arguments")


def _json_copy(value: Any, what: str, as_json: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as JSON gives it back (tuples become lists, a pydantic model its dump: ``as_json``,
    ``_as_json`` by default), or ``ValueError`` naming ``what``."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=as_json or _as_json))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} is not JSON: {error}") from None


def _as_json(value: Any) -> Any:
    """The JSON form of an argument an agent framework hands over as an object, the same every time
    it is given again: a pydantic model as its JSON dump, a dataclass as its fields, an enum as its
    value, a date, time, UUID or Decimal as its text. Anything else (a set, whose order is not
    stable, an open file) cannot be recorded: ``TypeError``, as ``json.dumps`` says it."""
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):
        return model_dump(mode="json")  # pydantic 2: dates, enums and nested models as JSON
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _argument_as_json(value: Any) -> Any:
    """``_as_json`` for an argument, whose JSON form is what its call_id is computed from: a
    pydantic model must be given back by its dump. One that is not (a field ``exclude=True``, a
    ``SecretStr`` dumped as stars, a lossy serializer) would make two intents one call, the second
    answered with the first one's result: ``TypeError``."""
    dumped = _as_json(value)
    validate = getattr(type(value), "model_validate", None)
    if callable(validate) and hasattr(value, "model_dump"):
        try:
            again = validate(dumped)
        except Exception:  # noqa: BLE001 - any failure to rebuild it says the same
            again = None
        if again != value:
            raise TypeError(
                f"its JSON form leaves out what makes it this object: {type(value).__name__} is not given back by "
                "its model_dump(mode='json') (a field excluded, a secret, a lossy serializer), so two different "
                "calls could share one call_id"
            )
    return dumped


def _arguments_as_json(arguments: dict[str, Any], what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arguments as the receipt records them, and those whose object is not its JSON form (a
    model, a tuple, a date), to hand to the function as they were given."""
    values = _json_copy(arguments, what, _argument_as_json)
    given = {
        name: value
        for name, value in arguments.items()
        if type(value) is not type(values[name]) or value != values[name]
    }
    return values, given


def _as_given(args: Mapping[str, Any]) -> dict[str, Any]:
    """The recorded arguments, with the objects the caller gave in place of their JSON form."""
    return {**args, **{name: value for name, value in _GIVEN.get({}).items() if name in args}}


class FunctionAdapter:
    """The adapter ``@receipted`` builds around a function: what the executor runs.

    ``query`` and ``evidence`` take the function's arguments by name plus
    ``call_id`` (and ``result=``, the recorded return value, for ``evidence``).
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str,
        version: str,
        query: Callable[..., Any] | None = None,
        evidence: Callable[..., Evidence] | None = None,
        normalise: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.function = function
        self.name = name
        self.version = version
        self._normalise = normalise
        self._query = query
        self._evidence = evidence
        # Optional methods, present only when given: the executor asks ``callable(adapter.query)``.
        self.query: Callable[..., Any] | None = self._run_query if query is not None else None
        self.evidence: Callable[..., Evidence] | None = self._run_evidence if evidence is not None else None

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args, Mapping):
            raise Rejected("args must be a JSON object")
        try:
            values = _json_copy(dict(args), "the arguments")
        except ValueError as error:
            raise Rejected(str(error)) from None
        if CALL_ID in values:
            raise Rejected("call_id is given by the writer, never as an argument")
        return self._normalise(values) if self._normalise is not None else values

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        returned = _settled(self.function(**_as_given(args), call_id=call_id))
        try:
            return {"returned": _json_copy(returned, f"what {self.name} returned")}
        except ValueError as error:
            # The effect happened and its answer cannot be recorded: a person settles it.
            raise OutcomeUnknown(f"{error}: the effect may be done, but the receipt cannot hold its answer") from None

    def _run_query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        assert self._query is not None
        answer = _settled(self._query(**_as_given(args), call_id=call_id))
        if answer is NOT_DONE:
            return NOT_DONE
        try:
            return {"returned": _json_copy(answer, f"what {self.name}'s query returned")}
        except ValueError as error:
            raise OutcomeUnknown(str(error)) from None

    def _run_evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        assert self._evidence is not None
        given = _as_given(args)
        if result is not None:
            if not isinstance(result, Mapping) or "returned" not in result:
                return Evidence("unclear", (Fact("result_not_returned"),))
            return cast(Evidence, _settled(self._evidence(**given, call_id=call_id, result=result["returned"])))
        return cast(Evidence, _settled(self._evidence(**given, call_id=call_id)))


class ReceiptedTool(Protocol):
    """What ``@receipted`` returns: a real function (``inspect.isfunction``), called as the function itself.

    Committed: it returns what the function returned (now, or when the call was
    first made). Rejected: it raises ``Rejected`` (``kind`` kept). Anything else
    (unknown, a person must decide): ``CallInDoubt``, an ``OutcomeUnknown``.
    """

    adapter: FunctionAdapter
    __wrapped__: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def call_in(self, run_dir: Path | str, *args: Any, **kwargs: Any) -> CallOutcome:
        """Run the call through the receipt in ``run_dir``: the writer's ``CallOutcome``, never raised."""

    def arguments(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The call's arguments by name, defaults filled in: what the call_id is computed from."""


def _tool_signature(function: Callable[..., Any]) -> inspect.Signature:
    """What a framework sees: the function's own parameters, less the one the writer fills in.

    Annotations are evaluated when they can be (a module with postponed
    annotations): a framework reading the signature gets types, as from the function.
    """
    try:
        signature = inspect.signature(function, eval_str=True)
    except Exception:  # noqa: BLE001 - a name defined later: the annotations stay as written
        signature = inspect.signature(function)
    parameter = signature.parameters.get(CALL_ID)
    if parameter is None or parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
        raise TypeError(
            f"{function.__qualname__} must take a keyword-only argument `call_id` (after `*`): "
            "the writer passes it, and the function hands it on as the target's idempotency key"
        )
    refused = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)]
    if refused:
        raise TypeError(f"{function.__qualname__}: arguments are recorded by name, so these cannot be: {refused}")
    return signature.replace(parameters=[p for p in signature.parameters.values() if p.name != CALL_ID])


def _arguments(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            values.update(value)
        else:
            values[name] = value
    return values


def _answer(name: str, outcome: CallOutcome) -> Any:
    """What the decorated function gives its caller for the writer's outcome."""
    if outcome.status == "committed" and not outcome.needs:
        result = outcome.result or {}
        if "returned" in result:
            return result["returned"]
        # A person settled it as done: there is their decision, and no answer to give back.
        raise SettledWithoutAnswer(
            f"{name} ({outcome.call_id}): settled as done by a person; the function's answer was never recorded",
            outcome,
        )
    error = outcome.error or {}
    message = f"{name} ({outcome.call_id}): {error.get('message') or outcome.status}"
    if outcome.status == "rejected" and not outcome.needs:
        kind = error.get("kind")
        rejection = Rejected(message, kind=kind if kind in ("retryable", "permanent") else "permanent")
        rejection.outcome = outcome  # type: ignore[attr-defined]
        raise rejection
    raise CallInDoubt(f"{message}: a person decides", outcome)


def _make_tool(function: Callable[..., Any], adapter: FunctionAdapter) -> ReceiptedTool:
    signature = _tool_signature(function)

    def call(binding: _Binding, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallOutcome:
        executor = Executor(binding.run_dir, {adapter.name: adapter})
        # A call_id is computed over JSON: arguments with no JSON form cannot have a receipt at all.
        values, given = _arguments_as_json(_arguments(signature, args, kwargs), f"an argument of {adapter.name}")
        token = _GIVEN.set(given)
        try:
            return executor.call(
                adapter.name, values, attempt=binding.attempt, override_unsettled=binding.override_unsettled
            )
        finally:
            _GIVEN.reset(token)

    @functools.wraps(function)
    def tool(*args: Any, **kwargs: Any) -> Any:
        binding = _BOUND.get(None)
        if binding is None:
            raise NoRunBound(f"{adapter.name}: no run directory bound; call it inside `with use_run(run_dir):`")
        return _answer(adapter.name, call(binding, args, kwargs))

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def awaited_tool(*args: Any, **kwargs: Any) -> Any:
            binding = _BOUND.get(None)
            if binding is None:
                raise NoRunBound(f"{adapter.name}: no run directory bound; call it inside `with use_run(run_dir):`")
            token = _CALLER_LOOP.set(asyncio.get_running_loop())
            try:
                # The writer blocks (files, locks): a thread, carrying this context (the binding, the loop).
                outcome = await _in_a_thread_of_its_own(call, binding, args, kwargs)
            finally:
                _CALLER_LOOP.reset(token)
            return _answer(adapter.name, outcome)

        tool = awaited_tool

    def call_in(run_dir: Path | str, *args: Any, **kwargs: Any) -> CallOutcome:
        return call(_Binding(Path(run_dir), None, None), args, kwargs)

    def arguments(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return _arguments(signature, args, kwargs)

    tool.__signature__ = signature  # type: ignore[attr-defined]
    tool.__annotations__ = {key: value for key, value in function.__annotations__.items() if key != CALL_ID}
    tool.adapter = adapter  # type: ignore[attr-defined]
    tool.call_in = call_in  # type: ignore[attr-defined]
    tool.arguments = arguments  # type: ignore[attr-defined]
    return cast(ReceiptedTool, tool)


def receipted(
    *,
    name: str | None = None,
    version: str,
    query: Callable[..., Any] | None = None,
    evidence: Callable[..., Evidence] | None = None,
    normalise: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[Callable[..., Any]], ReceiptedTool]:
    """Make a function a receipted tool.

    ``name`` (the function's name by default) and ``version`` go into the
    call_id. ``query(**args, call_id=...)`` answers a call in doubt: what the
    function would have returned, ``NOT_DONE`` only on positive evidence that
    the effect did not happen, or ``OutcomeUnknown``. ``evidence(**args,
    call_id=..., result=None) -> Evidence`` says what the target shows.
    ``normalise(args) -> args`` runs before the call_id is computed.
    """

    def decorate(function: Callable[..., Any]) -> ReceiptedTool:
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            # Its body runs as the caller iterates, after the receipt would say committed (or never).
            raise TypeError(f"{function.__name__} is a generator: a receipted tool returns its answer")
        adapter = FunctionAdapter(
            function,
            name=name or function.__name__,
            version=version,
            query=query,
            evidence=evidence,
            normalise=normalise,
        )
        return _make_tool(function, adapter)

    return decorate
