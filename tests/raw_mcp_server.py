"""An MCP server written by hand over stdio, for answers the official SDK will not send.

It speaks just enough JSON-RPC for a client to initialise and list its one tool,
``append_line``, which appends to ``--effects`` (the effect) and then answers with
what ``--answer`` says: ``not-a-result`` (a result that is no tool's result) or
``garbage`` (a line that is not JSON). Run as ``python tests/raw_mcp_server.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TOOL = {"name": "append_line", "description": "Append a line", "inputSchema": {"type": "object"}}


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--effects", required=True)
    parser.add_argument("--answer", choices=["not-a-result", "garbage"], required=True)
    options = parser.parse_args()
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        method, ident = request.get("method"), request["id"]
        if method == "initialize":
            version = request["params"]["protocolVersion"]
            server = {"name": "raw", "version": "1"}
            started = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": server}
            reply({"jsonrpc": "2.0", "id": ident, "result": started})
        elif method == "tools/list":
            reply({"jsonrpc": "2.0", "id": ident, "result": {"tools": [TOOL]}})
        elif method == "tools/call":
            with Path(options.effects).open("a") as effects:
                effects.write(json.dumps({"line": request["params"].get("arguments", {}).get("line")}) + "\n")
            if options.answer == "garbage":
                sys.stdout.write("this is not JSON\n")
                sys.stdout.flush()
            else:
                reply({"jsonrpc": "2.0", "id": ident, "result": {"content": "not a list of content blocks"}})
        else:
            reply({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
