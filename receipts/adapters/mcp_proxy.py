"""``callproof mcp-proxy``: receipts for the side-effecting tools of any MCP server.

Needs the ``mcp`` extra (``pip install 'callproof[mcp]'``, the official SDK).
The SDK (and anyio, which it brings) is imported only inside the functions
that run the proxy: this module loads with the standard library alone, as
every module under ``receipts/`` must, and the writer needs nothing more.

The proxy is an MCP server to its client (over its own stdin and stdout) and an
MCP client to the real server, a subprocess it starts. Listings of tools,
resources, prompts and templates, reads, prompts and completions pass through
unchanged, and so does a call to any tool the configuration does not name. A
call to a tool it names goes through the writer (``receipts.runtime.Executor``)
with a ``McpTool`` adapter whose ``execute`` forwards the call to the real
server: a call_id, a prepared receipt before the server sees the call, a
committed one with the server's answer after, and the same call again (same
tool, same identifying arguments, same attempt) is answered from its receipt
without reaching the server. A call whose outcome nobody knows (the proxy died
between the server's effect and the answer) is answered with an error result
saying a person must settle it, with its call_id, and waits on the dashboard.

The call_id reaches the server in the request's ``_meta`` under
``callproof/call_id`` always, and also as an argument when the configuration
names one (``call_id_argument``): a server can use it as its idempotency key.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from receipts import protocol, signing
from receipts.runtime import CallOutcome, Executor, OutcomeUnknown, RecordingIncomplete, Rejected

if TYPE_CHECKING:  # the SDK (and anyio, which it brings) is imported where the proxy runs, never at import
    from mcp import ClientSession, types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server

CALL_ID_META_KEY = "callproof/call_id"
# The answer's _meta says what the writer did; a client that does not look ignores it.
STATUS_META_KEY = "callproof/status"
REUSED_META_KEY = "callproof/reused"
NEEDS_META_KEY = "callproof/needs"

_CONFIG_KEYS = {"version", "identity_arguments", "call_id_argument", "idempotent", "errors_before_effect"}


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says why, for a person."""


@dataclasses.dataclass(frozen=True)
class ToolRule:
    """What the configuration says of one side-effecting tool."""

    name: str
    version: str
    # Only these arguments make the call_id (None: all of them but call_id_argument).
    identity_arguments: tuple[str, ...] | None = None
    # The argument the proxy fills with the call_id, for a server that takes its key there.
    call_id_argument: str | None = None
    # The server answers a call_id it has seen with its first result and no second effect:
    # the proxy may then send a call in doubt again to learn its outcome.
    idempotent: bool = False
    # JSON-RPC error codes this tool's server answers only before any effect: such an answer is
    # "not run". Any other error comes after the call went out, and the official SDK answers
    # -32602 (invalid params) for a pydantic error the tool raised after its effect too: in doubt.
    errors_before_effect: frozenset[int] = frozenset()


def load_config(path: Path | None) -> dict[str, ToolRule]:
    """The side-effecting tools named in ``path`` (none without a file); ``ConfigError`` when it is wrong."""
    if path is None:
        return {}
    try:
        document = protocol.load_json_strict(Path(path).read_bytes())
    except OSError as error:
        raise ConfigError(f"the configuration {path} cannot be read: {error.strerror or error}") from None
    except ValueError as error:
        raise ConfigError(f"the configuration {path} is not JSON: {error}") from None
    return parse_config(document, str(path))


def parse_config(document: Any, source: str = "the configuration") -> dict[str, ToolRule]:
    if not isinstance(document, dict) or set(document) - {"tools"} or not isinstance(document.get("tools"), dict):
        raise ConfigError(f'{source} must be a JSON object {{"tools": {{"<tool name>": {{"version": ...}}}}}}')
    rules = {}
    for name, entry in document["tools"].items():
        where = f"{source}, tool {name!r}"
        if not name:
            raise ConfigError(f"{source}: a tool name is empty")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be an object with at least a version")
        unknown = set(entry) - _CONFIG_KEYS
        if unknown:
            # A misspelt "idempotent" must not silently mean "not idempotent".
            known = ", ".join(sorted(_CONFIG_KEYS))
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {known})")
        version = entry.get("version")
        if not isinstance(version, str) or not version.strip():
            raise ConfigError(f"{where}: 'version' must be a non-empty string (it is part of the call_id)")
        identity = entry.get("identity_arguments")
        if identity is not None and (
            not isinstance(identity, list)
            or not all(isinstance(item, str) and item for item in identity)
            or len(set(identity)) != len(identity)
        ):
            raise ConfigError(f"{where}: 'identity_arguments' must be a list of distinct argument names")
        if identity == []:
            # No argument identifying the call would make every call of the tool one call.
            raise ConfigError(f"{where}: 'identity_arguments' must name at least one argument (or be left out)")
        call_id_argument = entry.get("call_id_argument")
        if call_id_argument is not None and (not isinstance(call_id_argument, str) or not call_id_argument):
            raise ConfigError(f"{where}: 'call_id_argument' must be an argument name")
        if call_id_argument is not None and identity is not None and call_id_argument in identity:
            raise ConfigError(f"{where}: the call_id argument {call_id_argument!r} cannot also identify the call")
        idempotent = entry.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise ConfigError(f"{where}: 'idempotent' must be true or false")
        before_effect = entry.get("errors_before_effect", [])
        if not isinstance(before_effect, list) or not all(
            isinstance(code, int) and not isinstance(code, bool) and -(2**31) <= code < 2**31 for code in before_effect
        ):
            raise ConfigError(f"{where}: 'errors_before_effect' must be a list of JSON-RPC error codes (integers)")
        rules[name] = ToolRule(
            name,
            version,
            tuple(identity) if identity is not None else None,
            call_id_argument,
            idempotent,
            frozenset(before_effect),
        )
    return rules


class UnreadableAnswer(Exception):  # noqa: N818 - an answer, not our failure
    """The server sent what no MCP message could be read from while a request waited for its answer."""


# Sends one call to the real server: (arguments, call_id) -> the server's result as JSON, or raises.
Forward = Callable[[dict[str, Any], str], dict[str, Any]]


class McpTool:
    """The adapter for one call of a side-effecting MCP tool: ``execute`` forwards it to the real server.

    Made per call, holding the call's whole arguments: the receipt keeps (and the
    call_id is made of) the identifying ones, the server gets all of them.
    """

    def __init__(self, rule: ToolRule, arguments: Mapping[str, Any], forward: Forward) -> None:
        self.rule = rule
        self.arguments = copy.deepcopy(dict(arguments))
        self.forward = forward
        self.sent = False  # whether this call went to the server now (not only answered from a receipt)

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def version(self) -> str:
        return self.rule.version

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args, Mapping):
            raise Rejected("arguments must be a JSON object")
        wanted = self.rule.identity_arguments
        kept = {
            key: value
            for key, value in args.items()
            if key != self.rule.call_id_argument and (wanted is None or key in wanted)
        }
        try:
            protocol.canonical_json(kept)
        except (TypeError, ValueError) as error:
            raise Rejected(f"arguments that JSON cannot hold: {error}") from None
        return kept

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        arguments = copy.deepcopy(self.arguments)
        if self.rule.call_id_argument is not None:
            arguments[self.rule.call_id_argument] = call_id
        self.sent = True
        return self.forward(arguments, call_id)


class IdempotentMcpTool(McpTool):
    """A tool whose server answers a call_id it has seen with the first result and no second effect."""

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        """Send the call in doubt again, under its call_id: the server answers with the first
        result (and makes the effect now only if it never did, so it is there once either way).
        Any other answer tells nothing, and a person decides."""
        try:
            return self.execute(run_dir, args, call_id)
        except Rejected as refused:
            raise OutcomeUnknown(f"the server refused the call sent again: {refused}") from None


def adapter_for(rule: ToolRule, arguments: Mapping[str, Any], forward: Forward) -> McpTool:
    kind = IdempotentMcpTool if rule.idempotent else McpTool
    return kind(rule, arguments, forward)


# --- answers to the client ------------------------------------------------------


def _text_answer(text: str, meta: dict[str, Any], *, is_error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error, "_meta": meta}


def answer_for(tool: str, outcome: CallOutcome, run_dir: Path, *, sent: bool = False) -> dict[str, Any]:
    """What the client is told (a tools/call result, as JSON) of a call the writer ran, reused,
    refused, or left to a person. ``_meta`` says which, with the call_id. ``sent``: the call went
    to the server in this request, so its answer is not a reuse (an idempotent tool's call in
    doubt is sent again, and the server may make the effect only now)."""
    meta: dict[str, Any] = {CALL_ID_META_KEY: outcome.call_id, STATUS_META_KEY: outcome.status}
    error = outcome.error or {}
    if outcome.needs:
        meta[NEEDS_META_KEY] = outcome.needs
        reason = f" ({error['message']})" if error.get("message") else ""
        others = error.get("call_ids") or []
        return _text_answer(
            f"in doubt: a person must settle it. The call to {tool} (call_id {outcome.call_id}) may or may "
            f"not have taken effect{reason}, so it is neither run again nor answered until a person decides "
            f"on the Callproof dashboard (or: callproof confirm {run_dir} {outcome.call_id} ...)."
            + (f" Calls in doubt: {', '.join(others)}." if others else "")
            + " Do not make the same change another way in the meantime.",
            meta,
            is_error=True,
        )
    if outcome.status == "committed":
        meta[REUSED_META_KEY] = outcome.reused and not sent
        result = outcome.result or {}
        if not isinstance(result.get("content"), list):
            # A person's decision ("it happened") carries no server answer to give back.
            return _text_answer(f"done: {json.dumps(result, sort_keys=True)}", meta, is_error=False)
        answer = copy.deepcopy(result)
        answer["_meta"] = (answer.get("_meta") or {}) | meta
        return answer
    message = error.get("message") or "the call was not run"
    return _text_answer(f"not run: {message} (call_id {outcome.call_id})", meta, is_error=True)


# --- the proxy ------------------------------------------------------------------


def _forwarded_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The client's own _meta keys: the protocol's (and a progress token, as progress is not
    relayed) belong to the client's session, and the downstream session sets its own."""
    return {
        key: value
        for key, value in (meta or {}).items()
        if not key.startswith("io.modelcontextprotocol/") and key not in ("progressToken", "progress_token")
    }


class Proxy:
    """Handlers of the proxy's server side, over one session with the real server."""

    def __init__(self, run_dir: Path, rules: Mapping[str, ToolRule], session: ClientSession) -> None:
        self.run_dir = run_dir
        self.rules = dict(rules)
        self.session = session
        self.calls_under_way = 0  # marked calls in the writer's hands
        # Requests sent to the server and not yet answered: a line from it that cannot be read
        # may have been the answer to any of them, so each is ended (see ``unreadable_answer``).
        self.awaiting_answers: dict[Any, str | None] = {}  # CancelScope -> why it was ended

    def unreadable_answer(self, error: Exception) -> None:
        """The server sent a line no MCP message could be read from: it may have been the answer
        to any request under way, which would otherwise wait for ever (a marked call holding its
        lock). Each ends: a marked call is in doubt, a passed-through request an error."""
        for scope in list(self.awaiting_answers):
            self.awaiting_answers[scope] = f"{type(error).__name__}: {str(error)[:200]}"
            scope.cancel()

    async def _request(self, request: Any, result_type: type[Any]) -> Any:
        """``send_request``, ended with ``UnreadableAnswer`` when the server answers what cannot be read."""
        import anyio

        reason = None
        with anyio.CancelScope() as scope:
            self.awaiting_answers[scope] = None
            try:
                return await self.session.send_request(request, result_type)
            finally:
                reason = self.awaiting_answers.pop(scope, None)
        raise UnreadableAnswer(reason or "the request was cancelled")

    async def _send(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
        """One call of a marked tool, its answer as JSON. ``send_request``, not ``call_tool``: the
        answer is recorded and given back as the server gave it, not validated here."""
        from mcp import types

        wire_meta = cast("types.RequestParamsMeta", meta) if meta else None
        params = types.CallToolRequestParams(name=name, arguments=arguments, _meta=wire_meta)
        result = await self._request(types.CallToolRequest(params=params), types.CallToolResult)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        import anyio.from_thread
        import anyio.to_thread
        from mcp import types
        from mcp.shared.exceptions import MCPError

        rule = self.rules.get(params.name)
        if rule is None:
            return await self._pass(types.CallToolRequest, types.CallToolResult, params)
        meta = _forwarded_meta(params.meta)

        def forward(arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
            # In the writer's worker thread: the call goes out on the event loop's session.
            try:
                return anyio.from_thread.run(self._send, rule.name, arguments, meta | {CALL_ID_META_KEY: call_id})
            except UnreadableAnswer as unreadable:
                raise OutcomeUnknown(f"the server answered a line that could not be read ({unreadable}): the "
                                     "call may have taken effect") from None  # fmt: skip
            except MCPError as error:
                # Sent is sent: only what the configuration says this server raises before any
                # effect is "not run"; any other error may have come after the effect.
                if error.code in rule.errors_before_effect:
                    raise Rejected(f"the server refused the call: {error.message}") from None
                raise OutcomeUnknown(f"the server's answer was an error ({error.code}): {error.message}") from None

        adapter = adapter_for(rule, params.arguments or {}, forward)

        def run() -> CallOutcome:
            return Executor(self.run_dir, {rule.name: adapter}).call(rule.name, adapter.arguments)

        self.calls_under_way += 1
        try:
            answer = answer_for(params.name, await anyio.to_thread.run_sync(run), self.run_dir, sent=adapter.sent)
        except RecordingIncomplete as incomplete:
            # The effect is done: the client gets its answer; the same call again completes the record.
            sys.stderr.write(f"callproof mcp-proxy: {params.name}: {incomplete}\n")
            answer = answer_for(params.name, incomplete.outcome, self.run_dir, sent=adapter.sent)
        except (ValueError, OSError) as error:
            # Refused before anything was sent (a run that takes no call, a record the writer cannot read).
            answer = _text_answer(f"not run: the writer refused the call: {error}", {}, is_error=True)
        finally:
            self.calls_under_way -= 1
        return types.CallToolResult.model_validate(answer, by_name=False)

    async def _pass(self, request: type[Any], result: type[Any], params: Any) -> Any:
        """One request passed through as it came (less the client's session _meta), the answer as it went."""
        if params is not None:
            params = params.model_copy(update={"meta": _forwarded_meta(params.meta) or None})
        try:
            return await self._request(request(params=params), result)
        except UnreadableAnswer as unreadable:
            from mcp import types
            from mcp.shared.exceptions import MCPError

            message = f"the server's answer could not be read: {unreadable}"
            raise MCPError(code=types.INTERNAL_ERROR, message=message) from None

    def _passing(self, request: type[Any], result: type[Any]) -> Callable[..., Awaitable[Any]]:
        """A handler that passes ``request`` through to the real server."""

        async def handler(ctx: ServerRequestContext[Any], params: Any) -> Any:
            return await self._pass(request, result, params)

        return handler

    def server(self, init: types.InitializeResult) -> Server[Any]:
        """A server offering what the real one offers (its capabilities, name and instructions)."""
        from mcp import types
        from mcp.server.lowlevel import Server

        offered, info, passing = init.capabilities, init.server_info, self._passing
        tools, resources, prompts = (x is not None for x in (offered.tools, offered.resources, offered.prompts))
        return Server(
            info.name,
            version=info.version,
            title=info.title,
            instructions=init.instructions,
            on_list_tools=passing(types.ListToolsRequest, types.ListToolsResult) if tools else None,
            on_call_tool=self.call_tool if tools else None,
            on_list_resources=passing(types.ListResourcesRequest, types.ListResourcesResult) if resources else None,
            on_list_resource_templates=(
                passing(types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult) if resources else None
            ),
            on_read_resource=passing(types.ReadResourceRequest, types.ReadResourceResult) if resources else None,
            on_list_prompts=passing(types.ListPromptsRequest, types.ListPromptsResult) if prompts else None,
            on_get_prompt=passing(types.GetPromptRequest, types.GetPromptResult) if prompts else None,
            on_completion=(
                passing(types.CompleteRequest, types.CompleteResult) if offered.completions is not None else None
            ),
        )


class ServerEnded(Exception):  # noqa: N818 - an outcome, said to the person who started the proxy
    """The real server could not be started, or did not start an MCP session."""


async def serve(run_dir: Path, rules: Mapping[str, ToolRule], command: Sequence[str]) -> None:
    """Run the proxy until its client closes the connection; the proxy ends (exit 1) if its server goes first."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage

    # The server gets the proxy's environment: what a client sets for the server (keys, paths) is
    # set on the proxy's command. All but the writer's signing key: the server is the agent's side,
    # and a key it held could sign receipts the writer never made.
    server_env = {name: value for name, value in os.environ.items() if name != signing.KEY_ENV}
    parameters = StdioServerParameters(command=command[0], args=list(command[1:]), env=server_env)
    try:
        async with stdio_client(parameters) as (read, write), anyio.create_task_group() as relaying:
            # The server's messages go through a relay that notices when they end.
            relay_send, relay_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            serving = False

            async def relay() -> None:
                async with read, relay_send:
                    async for item in read:
                        if isinstance(item, Exception) and serving:
                            proxy.unreadable_answer(item)
                        await relay_send.send(item)
                if serving:
                    await _end_with_the_server(proxy)

            relaying.start_soon(relay)
            async with ClientSession(relay_read, write) as session:
                try:
                    init = await session.initialize()
                except MCPError as error:
                    raise ServerEnded(f"the server did not start an MCP session: {error.message}") from None
                proxy = Proxy(run_dir, rules, session)
                server = proxy.server(init)
                serving = True
                async with stdio_server() as (client_read, client_write):
                    await server.run(client_read, client_write, server.create_initialization_options())
                serving = False
            relaying.cancel_scope.cancel()
    except OSError as error:
        raise ServerEnded(f"the server command {command[0]!r} cannot be run: {error.strerror or error}") from None


async def _end_with_the_server(proxy: Proxy) -> None:
    """The server is gone while the client is still connected: end, so the client sees it (and
    can start another), rather than answer every call with an error for as long as it is open.

    The marked calls under way end first (the closed connection fails them at once, and their
    receipts say so). Then the process exits: the SDK's reader of the client's standard input
    waits in a thread that nothing can cancel, so there is no orderly way out while it is open.
    """
    import anyio

    while proxy.calls_under_way:
        await anyio.sleep(0.05)
    sys.stderr.write("error: the server ended before its client did\n")
    sys.stderr.flush()
    os._exit(1)


def run_proxy(run_dir: Path, config: Path | None, command: Sequence[str]) -> int:
    """The subcommand: 0 when the client closed the connection, 1 when the proxy could not serve, 2 usage."""
    import anyio

    if not command:
        sys.stderr.write("error: no server command: mcp-proxy --run RUN_DIR [--config FILE] -- COMMAND [ARG...]\n")
        return 2
    try:
        rules = load_config(config)
    except ConfigError as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    if not rules:
        sys.stderr.write("callproof mcp-proxy: no side-effecting tool configured: every call passes through\n")
    _quiet_sdk_logs()
    try:
        anyio.run(serve, run_dir, rules, list(command))
    except (ServerEnded, BaseExceptionGroup) as error:
        # The SDK's task groups wrap what ends the session: the reason is the one leaf we raised.
        ended = error.subgroup(ServerEnded) if isinstance(error, BaseExceptionGroup) else error
        while isinstance(ended, BaseExceptionGroup):
            ended = ended.exceptions[0]
        if ended is None:
            raise
        sys.stderr.write(f"error: {ended}\n")
        return 1
    return 0


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # The SDK logs a server's bad line with a traceback; the person reading needs the sentence.
        return f"callproof mcp-proxy: {record.name}: {record.getMessage()}"


def _quiet_sdk_logs() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    sdk = logging.getLogger("mcp")
    sdk.addHandler(handler)
    sdk.propagate = False
