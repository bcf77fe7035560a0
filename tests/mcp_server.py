"""A small real MCP server (the `mcp` SDK's low-level server API, over stdio) for the proxy's tests.

``python tests/mcp_server.py --effects FILE [--idempotent] [--hang-after-effect]``

- ``append_line`` (side-effecting): appends one JSON line to FILE, the effect counter. The line
  holds what the server received: the line, the call_id in ``_meta`` and in the ``request_id``
  argument, and the pids of this server and of its parent (the proxy), so a test can kill the
  proxy once the effect is seen. With ``--idempotent`` a call_id already seen is answered with
  the first call's result and nothing is appended (the call_id is the idempotency key).
  With ``--hang-after-effect`` the call never answers after its effect. With
  ``--invalid-after-effect`` the tool raises pydantic's ValidationError after its effect, which the
  SDK answers as JSON-RPC -32602 (invalid params), as it answers a refusal before any effect.
  ``--unparseable-answer`` the tool answers, after its effect, with a result that is not a tool's result.
- ``count_lines`` (read-only): how many lines FILE holds.
- one resource, a resource template, one prompt and completions, for what a proxy passes through.
- an empty line is the tool's own error: a result with ``isError``, recorded in FILE all the same.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

CALL_ID_META_KEY = "callproof/call_id"

TOOLS = [
    types.Tool(
        name="append_line",
        description="Append a line to the server's file (a side effect).",
        input_schema={
            "type": "object",
            "properties": {
                "line": {"type": "string"},
                "note": {"type": "string"},
                "request_id": {"type": "string"},
            },
            "required": ["line"],
        },
    ),
    types.Tool(
        name="count_lines",
        description="How many lines the server's file holds (read-only).",
        input_schema={"type": "object", "properties": {}},
    ),
]


def _lines(effects: Path) -> list[dict[str, Any]]:
    if not effects.exists():
        return []
    return [json.loads(line) for line in effects.read_text().splitlines() if line]


def build(
    effects: Path, *, idempotent: bool, hang: bool, invalid_after: bool = False, unparseable: bool = False
) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == "count_lines":
            return types.CallToolResult(content=[types.TextContent(text=f"{len(_lines(effects))} lines")])
        if params.name != "append_line":
            raise MCPError(code=types.INVALID_PARAMS, message=f"no tool named {params.name}")
        meta_call_id = (params.meta or {}).get(CALL_ID_META_KEY)
        key = meta_call_id or arguments.get("request_id")
        if idempotent and key:
            for seen in _lines(effects):
                if seen["call_id"] == key:
                    return types.CallToolResult(content=[types.TextContent(text=seen["answer"])])
        number = len(_lines(effects)) + 1
        line = arguments.get("line")
        # An empty line is the tool's own error (a result with isError): recorded, not appended to.
        answer = f"appended line {number}: {line}" if line else "refused: the line is empty"
        record = {
            "line": line,
            "call_id": key,
            "meta_call_id": meta_call_id,
            "request_id": arguments.get("request_id"),
            "note": arguments.get("note"),
            "answer": answer,
            "server_pid": os.getpid(),
            "proxy_pid": os.getppid(),
            "env_mark": os.environ.get("CALLPROOF_TEST_MARK"),
            "signing_key": os.environ.get("RECEIPTS_SIGNING_KEY"),
        }
        with effects.open("a") as file:
            file.write(json.dumps(record) + "\n")
            file.flush()
            os.fsync(file.fileno())
        if hang:
            await anyio.sleep_forever()
        if invalid_after:
            types.TextContent.model_validate({"type": "text"})  # no text: pydantic's ValidationError
        if unparseable:
            # Built without validation: the answer goes out as JSON no client can read as a tool's result.
            return types.CallToolResult.model_construct(content="not a list of content blocks", isError=False)
        return types.CallToolResult(content=[types.TextContent(text=answer)], is_error=not line)

    async def list_resources(ctx: ServerRequestContext[Any], params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[types.Resource(name="effects", uri="file:///effects", mime_type="text/plain")]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        text = effects.read_text() if effects.exists() else ""
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text=text)])

    async def list_templates(ctx: ServerRequestContext[Any], params: Any) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(name="line", uri_template="file:///effects/{number}")
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> types.CompleteResult:
        names = [name for name in ("Ada", "Alan", "Grace") if name.startswith(params.argument.value)]
        return types.CompleteResult(completion=types.Completion(values=names))

    async def list_prompts(ctx: ServerRequestContext[Any], params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="greet", description="Say hello")])

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        name = (params.arguments or {}).get("name", "you")
        message = types.PromptMessage(role="user", content=types.TextContent(text=f"Hello, {name}"))
        return types.GetPromptResult(messages=[message])

    return Server(
        "callproof-test-server",
        version="1.0",
        instructions="Append lines; count them.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_list_resource_templates=list_templates,
        on_completion=complete,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


async def serve(server: Server[Any]) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--effects", required=True)
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument("--hang-after-effect", action="store_true")
    parser.add_argument("--invalid-after-effect", action="store_true")
    parser.add_argument("--unparseable-answer", action="store_true")
    options = parser.parse_args()
    server = build(
        Path(options.effects),
        idempotent=options.idempotent,
        hang=options.hang_after_effect,
        invalid_after=options.invalid_after_effect,
        unparseable=options.unparseable_answer,
    )
    anyio.run(serve, server)


if __name__ == "__main__":
    main()
