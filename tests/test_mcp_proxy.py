"""`callproof mcp-proxy` with the real MCP SDK on both ends.

The client is the SDK's (stdio_client + ClientSession); it starts ``python -m receipts mcp-proxy``,
which starts tests/mcp_server.py (the SDK's low-level server) as its own subprocess. The server's
``append_line`` appends a line to a file, the effect counter; ``count_lines`` only reads it.
Kills are real: the proxy process ends at the writer's failpoint after the effect (os._exit, as if
SIGKILLed), or gets SIGKILL from the test once the server's effect is seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.urls import reverse
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.shared.exceptions import MCPError

from evidence.ingest import importer
from receipts import protocol, runtime
from receipts.adapters.mcp_proxy import (
    CALL_ID_META_KEY,
    ConfigError,
    McpTool,
    ToolRule,
    answer_for,
    parse_config,
)
from receipts.cli import build_parser
from receipts.demo import run_writer
from receipts.replay import replay_run
from receipts.runtime import CallOutcome
from tests.helpers import PROJECT, content, first_call_of

SERVER = str(PROJECT / "tests" / "mcp_server.py")
pytestmark = pytest.mark.slow


def effects(path: Path) -> list[dict[str, Any]]:
    """The server's effect counter: one JSON line per append that happened."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def receipts_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_bytes()) for path in sorted((run_dir / "receipts").glob("*.json"))]


def write_config(tmp_path: Path, tools: dict[str, Any]) -> Path:
    path = tmp_path / "mcp-proxy.json"
    path.write_text(json.dumps({"tools": tools}))
    return path


def proxy_command(run_dir: Path, config: Path | None, counter: Path, *server_flags: str) -> list[str]:
    command = [sys.executable, "-m", "receipts", "mcp-proxy", "--run", str(run_dir)]
    if config is not None:
        command += ["--config", str(config)]
    return [*command, "--", sys.executable, SERVER, "--effects", str(counter), *server_flags]


@contextlib.asynccontextmanager
async def connected(command: list[str], errlog: str = os.devnull, **env: str) -> AsyncIterator[ClientSession]:
    """The SDK's client, connected over stdio to the process ``command`` starts (its stderr to ``errlog``)."""
    parameters = StdioServerParameters(command=command[0], args=command[1:], cwd=str(PROJECT), env=env or None)
    with open(errlog, "w") as stderr:
        async with stdio_client(parameters, errlog=stderr) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


def through_proxy(run_dir: Path, config: Path | None, counter: Path, *flags: str, errlog: str = os.devnull, **env: str):
    return connected(proxy_command(run_dir, config, counter, *flags), errlog, **env)


def text(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


APPEND = {"append_line": {"version": "1.0", "call_id_argument": "request_id"}}


def test_a_call_goes_through_once_and_the_same_call_again_is_answered_from_its_receipt(run_dir, tmp_path):
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)

    async def scenario() -> list[types.CallToolResult]:
        async with through_proxy(run_dir, config, counter, CALLPROOF_TEST_MARK="for the server") as session:
            first = await session.call_tool("append_line", {"line": "hello"})
            again = await session.call_tool("append_line", {"line": "hello"})
        # A new proxy (a restarted client, say) answers from the same receipt.
        async with through_proxy(run_dir, config, counter) as session:
            later = await session.call_tool("append_line", {"line": "hello"})
        return [first, again, later]

    first, again, later = anyio.run(scenario)
    [line] = effects(counter)
    [receipt] = receipts_of(run_dir)
    call_id = receipt["call_id"]
    assert receipt["status"] == "committed" and receipt["tool"] == "append_line" and receipt["tool_version"] == "1.0"
    assert receipt["args"] == {"line": "hello"}, "the call_id argument is the proxy's, not an identifying one"
    assert text(first) == text(again) == text(later) == line["answer"] == "appended line 1: hello"
    assert receipt["result"]["content"] == [{"type": "text", "text": "appended line 1: hello"}]
    assert [first.meta, again.meta, later.meta] == [
        {CALL_ID_META_KEY: call_id, "callproof/status": "committed", "callproof/reused": reused}
        for reused in (False, True, True)
    ]
    # The server got the call_id as its idempotency key, in _meta and in the configured argument.
    assert line["meta_call_id"] == line["request_id"] == call_id
    assert line["env_mark"] == "for the server", "the proxy's environment reaches the server"
    assert call_id == protocol.make_call_id(
        runtime.run_contract(run_dir), 1, "append_line", {"line": "hello"}, "1.0", protocol.IDENTITY_V2
    )
    ledger = [json.loads(event) for event in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [event["type"] for event in ledger if event.get("call_id") == call_id] == [
        "receipt",
        "receipt",
        "call_reused",
        "call_reused",
    ]


def test_a_new_attempt_of_the_run_makes_the_same_call_anew(run_dir, tmp_path):
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)

    async def call() -> types.CallToolResult:
        async with through_proxy(run_dir, config, counter) as session:
            return await session.call_tool("append_line", {"line": "hello"})

    anyio.run(call)
    runtime.run_set_state(run_dir, state="retrying", attempts=1)
    second = anyio.run(call)
    assert text(second) == "appended line 2: hello" and len(effects(counter)) == 2
    assert sorted(receipt["attempt"] for receipt in receipts_of(run_dir)) == [1, 2]


def test_arguments_outside_the_identifying_ones_reach_the_server_but_not_the_call_id(run_dir, tmp_path):
    config = write_config(tmp_path, {"append_line": {"version": "1.0", "identity_arguments": ["line"]}})
    counter = tmp_path / "effects.jsonl"

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with through_proxy(run_dir, config, counter) as session:
            first = await session.call_tool("append_line", {"line": "hi", "note": "first try"})
            retry = await session.call_tool("append_line", {"line": "hi", "note": "the model rephrased it"})
            return first, retry

    first, retry = anyio.run(scenario)
    [line] = effects(counter)
    assert line["note"] == "first try" and line["request_id"] is None, "all of the client's arguments, as sent"
    assert text(retry) == text(first) and retry.meta is not None and retry.meta["callproof/reused"] is True
    [receipt] = receipts_of(run_dir)
    assert receipt["args"] == {"line": "hi"}


def test_a_tools_own_error_is_its_recorded_answer_and_the_same_call_gets_it_again(run_dir, tmp_path):
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)

    async def scenario() -> list[types.CallToolResult]:
        async with through_proxy(run_dir, config, counter) as session:
            return [await session.call_tool("append_line", {"line": ""}) for _ in range(2)]

    first, again = anyio.run(scenario)
    assert first.is_error and again.is_error and text(first) == text(again) == "refused: the line is empty"
    assert again.meta is not None and again.meta["callproof/reused"] is True
    assert len(effects(counter)) == 1, "the server saw it once"
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "committed" and receipt["result"]["isError"] is True


def test_read_only_unmarked_and_unknown_tools_pass_through_with_no_receipt(run_dir, tmp_path):
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)

    async def scenario() -> tuple[str, str]:
        async with through_proxy(run_dir, config, counter) as session:
            await session.call_tool("append_line", {"line": "one"})
            counted = await session.call_tool("count_lines", {})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("no_such_tool", {"x": 1})
            return text(counted), refused.value.message

    counted, refusal = anyio.run(scenario)
    assert counted == "1 lines" and refusal == "no tool named no_such_tool", "the server's own answers"
    assert len(receipts_of(run_dir)) == 1, "only the marked tool has a receipt"

    # With no configuration nothing is marked: the same call twice is two effects, and no receipt.
    async def unmarked() -> None:
        async with through_proxy(run_dir, None, counter) as session:
            await session.call_tool("append_line", {"line": "two"})
            await session.call_tool("append_line", {"line": "two"})

    anyio.run(unmarked)
    assert [line["line"] for line in effects(counter)] == ["one", "two", "two"]
    assert [line["meta_call_id"] for line in effects(counter)[1:]] == [None, None], "no call_id on a passed call"
    assert len(receipts_of(run_dir)) == 1


def test_listings_resources_and_prompts_pass_through_unchanged(run_dir, tmp_path):
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)
    counter.write_text(json.dumps({"call_id": None, "answer": "x"}) + "\n")

    async def everything(session: ClientSession) -> list[Any]:
        answers = [
            await session.list_tools(),
            await session.list_resources(),
            await session.read_resource("file:///effects"),
            await session.list_prompts(),
            await session.get_prompt("greet", {"name": "Ada"}),
            await session.list_resource_templates(),
            await session.complete(types.PromptReference(name="greet"), {"name": "name", "value": "A"}),
        ]
        return [answer.model_dump(by_alias=True) for answer in answers]

    async def scenario() -> tuple[list[Any], list[Any], Any, Any]:
        async with connected([sys.executable, SERVER, "--effects", str(counter)]) as session:
            direct = await everything(session)
            direct_info = session.initialize_result
        async with through_proxy(run_dir, config, counter) as session:
            proxied = await everything(session)
            proxied_info = session.initialize_result
        return direct, proxied, direct_info, proxied_info

    direct, proxied, direct_info, proxied_info = anyio.run(scenario)
    assert proxied == direct
    assert [tool["name"] for tool in proxied[0]["tools"]] == ["append_line", "count_lines"]
    assert proxied[4]["messages"][0]["content"]["text"] == "Hello, Ada"
    assert proxied[5]["resourceTemplates"][0]["uriTemplate"] == "file:///effects/{number}"
    assert proxied[6]["completion"]["values"] == ["Ada", "Alan"]
    assert direct_info is not None and proxied_info is not None
    assert proxied_info.server_info.name == direct_info.server_info.name == "callproof-test-server"
    assert proxied_info.server_info.version == direct_info.server_info.version == "1.0"
    assert proxied_info.instructions == direct_info.instructions == "Append lines; count them."
    assert proxied_info.capabilities.model_dump() == direct_info.capabilities.model_dump()
    assert receipts_of(run_dir) == []


def test_an_error_the_configuration_says_comes_before_any_effect_is_a_rejected_receipt(run_dir, tmp_path):
    # Marked in the configuration, but the server has no such tool: it refuses (INVALID_PARAMS),
    # and the configuration says this server raises that code before any effect.
    config = write_config(tmp_path, {"archive_everything": {"version": "1", "errors_before_effect": [-32602]}})

    async def scenario() -> types.CallToolResult:
        async with through_proxy(run_dir, config, tmp_path / "effects.jsonl") as session:
            return await session.call_tool("archive_everything", {"now": True})

    answer = anyio.run(scenario)
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "rejected" and "no tool named archive_everything" in receipt["error"]["message"]
    assert answer.is_error and text(answer).startswith("not run: the server refused the call")
    assert answer.meta is not None and answer.meta["callproof/status"] == "rejected"


def test_an_error_the_server_answers_after_the_effect_leaves_the_call_in_doubt(run_dir, tmp_path):
    """The SDK answers -32602 for any pydantic ValidationError, one the tool raised after its
    effect included: taken for "not run", the call was retried at the next attempt and the line
    appended twice. What the server answered after the call went out is in doubt by default."""
    counter = tmp_path / "effects.jsonl"
    config = write_config(tmp_path, APPEND)

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with through_proxy(run_dir, config, counter, "--invalid-after-effect") as session:
            first = await session.call_tool("append_line", {"line": "once"})
            return first, await session.call_tool("append_line", {"line": "once"})

    first, again = anyio.run(scenario)
    assert [line["line"] for line in effects(counter)] == ["once"]
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "unknown" and "(-32602)" in receipt["error"]["message"]
    for answer in (first, again):
        assert answer.is_error and text(answer).startswith("in doubt: a person must settle it")
    moved_on = run_writer("state", str(run_dir), "retrying", "--attempts", "1")
    assert moved_on.returncode == 4, "a new attempt waits for the call in doubt: nothing is sent again"


def test_an_answer_that_is_no_tools_result_leaves_the_call_in_doubt_and_the_proxy_answering(run_dir, tmp_path):
    """The server made the effect and its answer was no tool's result: the call is in doubt (never
    run again), and the proxy goes on answering, the same call and others."""
    counter = tmp_path / "effects.jsonl"
    config = write_config(tmp_path, APPEND)

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, types.CallToolResult]:
        async with through_proxy(run_dir, config, counter, "--unparseable-answer") as session:
            with anyio.fail_after(60):
                first = await session.call_tool("append_line", {"line": "once"})
                again = await session.call_tool("append_line", {"line": "once"})
                other = await session.call_tool("count_lines", {})
            return first, again, other

    first, again, other = anyio.run(scenario)
    assert [line["line"] for line in effects(counter)] == ["once"]
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "unknown", receipt
    # The SDK's server does not send what fails its own schema: it answers -32603 instead.
    assert "(-32603)" in receipt["error"]["message"]
    for answer in (first, again):
        assert answer.is_error and text(answer).startswith("in doubt: a person must settle it")
    assert text(other) == "1 lines"


@pytest.mark.parametrize("answer", ["not-a-result", "garbage"])
def test_an_answer_no_client_can_read_leaves_the_call_in_doubt_and_the_lock_free(run_dir, tmp_path, answer):
    """A server written by hand (tests/raw_mcp_server.py) makes the effect, then answers a result
    that is no tool's result, or a line that is not JSON at all. The second waited for ever, its
    call's lock held: now the call is in doubt at once, and the same call again says so."""
    counter = tmp_path / "effects.jsonl"
    config = write_config(tmp_path, {"append_line": {"version": "1.0"}})
    command = [sys.executable, "-m", "receipts", "mcp-proxy", "--run", str(run_dir), "--config", str(config), "--",
               sys.executable, str(PROJECT / "tests" / "raw_mcp_server.py"), "--effects", str(counter),
               "--answer", answer]  # fmt: skip

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with connected(command) as session:
            with anyio.fail_after(60):
                first = await session.call_tool("append_line", {"line": "once"})
                return first, await session.call_tool("append_line", {"line": "once"})

    first, again = anyio.run(scenario)
    assert [line["line"] for line in effects(counter)] == ["once"]
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "unknown"
    for said in (first, again):
        assert said.is_error and text(said).startswith("in doubt: a person must settle it")


def test_killed_after_the_effect_an_idempotent_server_gives_the_retry_the_first_result(run_dir, tmp_path):
    counter = tmp_path / "effects.jsonl"
    config = write_config(tmp_path, {"append_line": {"version": "1.0", "idempotent": True}})
    flags = ("--idempotent",)

    async def killed() -> None:
        # The proxy ends right after the server's answer, before the receipt says committed.
        async with through_proxy(run_dir, config, counter, *flags, RECEIPTS_FAILPOINT="after_effect") as session:
            with pytest.raises(MCPError):
                await session.call_tool("append_line", {"line": "pay invoice 7"})

    anyio.run(killed)
    [line] = effects(counter)
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "prepared" and receipt["queryable"] is True

    async def retry() -> types.CallToolResult:
        async with through_proxy(run_dir, config, counter, *flags) as session:
            return await session.call_tool("append_line", {"line": "pay invoice 7"})

    answer = anyio.run(retry)
    assert not answer.is_error and text(answer) == line["answer"] == "appended line 1: pay invoice 7"
    assert len(effects(counter)) == 1, "the effect happened once"
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "committed" and answer.meta is not None
    # The call was sent again to learn its outcome: the proxy cannot tell the server's replay from
    # an effect made now, so it never calls that a reuse.
    assert answer.meta["callproof/reused"] is False


def test_an_idempotent_call_killed_before_its_effect_is_made_by_the_retry_and_not_called_reused(run_dir, tmp_path):
    counter = tmp_path / "effects.jsonl"
    config = write_config(tmp_path, {"append_line": {"version": "1.0", "idempotent": True}})

    async def call() -> types.CallToolResult:
        async with through_proxy(run_dir, config, counter, "--idempotent") as session:
            return await session.call_tool("append_line", {"line": "pay invoice 8"})

    async def killed() -> None:
        # The proxy ends once the prepared receipt is written, before anything is sent.
        async with through_proxy(
            run_dir, config, counter, "--idempotent", RECEIPTS_FAILPOINT="after_prepared"
        ) as session:
            with pytest.raises(MCPError):
                await session.call_tool("append_line", {"line": "pay invoice 8"})

    anyio.run(killed)
    assert effects(counter) == [] and receipts_of(run_dir)[0]["status"] == "prepared"
    answer = anyio.run(call)  # the writer's query sends it again: the server makes the effect now
    assert len(effects(counter)) == 1 and not answer.is_error
    assert answer.meta is not None and answer.meta["callproof/reused"] is False
    again = anyio.run(call)  # now it is answered from the receipt
    assert again.meta is not None and again.meta["callproof/reused"] is True and len(effects(counter)) == 1


def test_a_proxy_whose_server_dies_ends_and_says_so(run_dir, tmp_path):
    counter, config, errlog = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND), tmp_path / "stderr.txt"

    async def scenario() -> None:
        async with through_proxy(run_dir, config, counter, errlog=str(errlog)) as session:
            await session.call_tool("append_line", {"line": "one"})
            [line] = effects(counter)
            _kill(line["server_pid"], signal.SIGKILL)
            with anyio.fail_after(120):  # a guard against a hang, not a measure
                while "the server ended" not in errlog.read_text():
                    await anyio.sleep(0.05)
            with pytest.raises(MCPError):
                await session.call_tool("append_line", {"line": "two"})

    anyio.run(scenario)
    assert "error: the server ended before its client did" in errlog.read_text()
    assert "Traceback" not in errlog.read_text()
    assert [receipt["status"] for receipt in receipts_of(run_dir)] == ["committed"], "no call left in doubt"


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@pytest.mark.django_db
def test_killed_between_the_effect_and_the_answer_the_call_waits_for_a_person(run_dir, tmp_path, logged_in):
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)
    args = {"line": "delete branch main"}

    async def killed() -> None:
        async def kill_when_the_effect_is_seen() -> None:
            while not effects(counter):
                await anyio.sleep(0.05)
            [line] = effects(counter)
            _kill(line["proxy_pid"], signal.SIGKILL)
            _kill(line["server_pid"], signal.SIGKILL)  # it holds its answer forever; nobody is left to read it

        # The server makes the effect and never answers: the proxy is killed while it waits.
        async with through_proxy(run_dir, config, counter, "--hang-after-effect") as session:
            with anyio.fail_after(120):  # a guard against a hang, not a measure
                async with anyio.create_task_group() as group:
                    group.start_soon(kill_when_the_effect_is_seen)
                    with pytest.raises(MCPError):
                        await session.call_tool("append_line", args)

    anyio.run(killed)
    [receipt] = receipts_of(run_dir)
    call_id = receipt["call_id"]
    assert receipt["status"] == "prepared" and receipt["queryable"] is False

    async def retry() -> types.CallToolResult:
        async with through_proxy(run_dir, config, counter) as session:
            return await session.call_tool("append_line", args)

    answer = anyio.run(retry)
    assert answer.is_error and text(answer).startswith("in doubt: a person must settle it")
    assert call_id in text(answer) and answer.meta is not None and answer.meta["callproof/needs"] == "confirmation"
    assert len(effects(counter)) == 1, "not sent again"

    # As any call in doubt: replay says so, and the dashboard shows it to be settled.
    [decision] = [row for row in replay_run(run_dir)["decisions"] if row["call_id"] == call_id]
    assert protocol.in_doubt(decision["decision"])
    importer.run_import(path=run_dir)
    page = content(logged_in.get(reverse("call", args=[run_dir.name, call_id])))
    assert "This call is in doubt" in page and "Run the tool append_line" in page
    assert first_call_of(run_dir.name).decision == "confirm"

    # A person says it happened (the server's file shows the line): the retry is answered, not run.
    receipt_sha256 = protocol.sha256_hex((run_dir / "receipts" / f"{call_id}.json").read_bytes())
    settle = subprocess.run(
        [sys.executable, "-m", "receipts", "confirm", str(run_dir), call_id, "--resolution", "committed",
         "--reason", "the line is in the server's file", "--actor", "alice", "--receipt-sha256", receipt_sha256],
        cwd=PROJECT, capture_output=True, check=False,
    )  # fmt: skip
    assert settle.returncode == 0, settle.stderr
    settled = anyio.run(retry)
    assert not settled.is_error and text(settled).startswith("done: ")
    assert len(effects(counter)) == 1


def test_the_server_never_gets_the_signing_key(tmp_path, monkeypatch):
    """A signed run's key signs what the writer records; the server the proxy starts is the agent's
    side, and with the key it could sign receipts of its own. It got the proxy's whole environment."""
    key_file = tmp_path / "keys" / "callproof.key"
    key_file.parent.mkdir()
    key_file.write_bytes(os.urandom(32).hex().encode())
    monkeypatch.setenv("RECEIPTS_SIGNING_KEY", str(key_file))
    run_dir = tmp_path / "signed-run"
    runtime.run_init(run_dir, contract_sha256=protocol.sha256_hex(b"contract"))
    counter, config = tmp_path / "effects.jsonl", write_config(tmp_path, APPEND)

    async def scenario() -> types.CallToolResult:
        marks = {"CALLPROOF_TEST_MARK": "for the server", "RECEIPTS_SIGNING_KEY": str(key_file)}
        async with through_proxy(run_dir, config, counter, **marks) as session:
            return await session.call_tool("append_line", {"line": "signed"})

    answer = anyio.run(scenario)
    assert not answer.is_error, text(answer)
    [line] = effects(counter)
    assert line["env_mark"] == "for the server" and line["signing_key"] is None
    [receipt] = receipts_of(run_dir)
    assert receipt["status"] == "committed" and receipt["signature"].startswith("hmac-sha256:")


# --- the configuration, and the command line's refusals ---------------------------------------


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ([], "must be a JSON object"),
        ({"tools": {"t": {}}}, "'version' must be a non-empty string"),
        ({"tools": {"t": {"version": "1", "idempotant": True}}}, "unknown key(s) idempotant"),
        ({"tools": {"t": {"version": "1", "identity_arguments": ["a", "a"]}}}, "distinct argument names"),
        ({"tools": {"t": {"version": "1", "identity_arguments": ["k"], "call_id_argument": "k"}}}, "cannot also"),
        ({"tools": {"t": {"version": "1", "idempotent": "yes"}}}, "'idempotent' must be true or false"),
        ({"tools": {"t": {"version": "1", "identity_arguments": []}}}, "at least one argument"),
        ({"tools": {"t": {"version": "1", "errors_before_effect": -32602}}}, "list of JSON-RPC error codes"),
        ({"tools": {"t": {"version": "1", "errors_before_effect": ["-32602"]}}}, "list of JSON-RPC error codes"),
        ({"tools": {"t": {"version": "1", "errors_before_effect": [True]}}}, "list of JSON-RPC error codes"),
    ],
)
def test_a_wrong_configuration_is_refused_with_its_reason(document, says):
    with pytest.raises(ConfigError) as refused:
        parse_config(document)
    assert says in str(refused.value)


def test_the_adapter_keeps_the_identifying_arguments_and_sends_all_with_the_call_id():
    sent = []

    def forward(arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
        sent.append(arguments)
        return {}

    rule = ToolRule("t", "1", identity_arguments=("a",), call_id_argument="key")
    adapter = McpTool(rule, {"a": 1, "b": 2, "key": "from the client"}, forward)
    assert adapter.normalise({"a": 1, "b": 2, "key": "x"}) == {"a": 1}
    adapter.execute(Path("/nonexistent"), {"a": 1}, "c" * 64)
    assert sent == [{"a": 1, "b": 2, "key": "c" * 64}]
    assert not hasattr(adapter, "query"), "only a tool marked idempotent is sent again to learn its outcome"


def proxy_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "receipts", "mcp-proxy", *args],
        cwd=PROJECT, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False, env=env,
    )  # fmt: skip


def test_the_command_line_refuses_clearly(run_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"tools": {"t": {"version": 1}}}')
    refused = proxy_cli("--run", str(run_dir), "--config", str(bad), "--", sys.executable, SERVER)
    assert refused.returncode == 1 and "'version' must be a non-empty string" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = proxy_cli("--run", str(run_dir), "--config", str(tmp_path / "none.json"), "--", "true")
    assert missing.returncode == 1 and "cannot be read" in missing.stderr
    no_command = proxy_cli("--run", str(run_dir), "--")
    assert no_command.returncode == 2 and "no server command" in no_command.stderr
    no_run = proxy_cli("--run", str(tmp_path / "nowhere"), "--", "true")
    assert no_run.returncode == 1 and "is not a run directory" in no_run.stderr
    no_server = proxy_cli("--run", str(run_dir), "--", str(tmp_path / "no-such-server"))
    assert no_server.returncode == 1 and "cannot be run" in no_server.stderr
    assert "Traceback" not in no_server.stderr
    # A command that ends at once, or says something that is not MCP, is not a server.
    for not_a_server in (["true"], ["sh", "-c", "echo not JSON-RPC"]):
        ended = proxy_cli("--run", str(run_dir), "--", *not_a_server)
        assert ended.returncode == 1 and "error: the server did not start an MCP session" in ended.stderr
        assert "Traceback" not in ended.stderr, ended.stderr


def test_without_the_mcp_extra_the_subcommand_says_which_to_install(run_dir):
    # The SDK hidden from this interpreter, as in an install without the extra.
    hidden = (
        "import sys; sys.modules['mcp'] = None; from receipts.cli import main; "
        f"sys.exit(main(['mcp-proxy', '--run', {str(run_dir)!r}, '--', 'true']))"
    )
    completed = subprocess.run([sys.executable, "-c", hidden], cwd=PROJECT, capture_output=True, text=True, check=False)
    assert completed.returncode == 7
    assert "pip install 'callproof[mcp]'" in completed.stderr and "Traceback" not in completed.stderr


def test_the_writer_does_not_import_the_sdk_until_the_subcommand_runs():
    probe = (
        "import sys, receipts.cli, receipts.adapters.mcp_proxy; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types', 'anyio', 'pydantic')))"
    )
    completed = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"


def test_the_answers_say_what_the_writer_did():
    doubt = CallOutcome("c" * 64, "prepared", False, None, {"kind": "unknown", "message": "killed"}, "confirmation")
    answer = answer_for("append_line", doubt, Path("/runs/r1"))
    assert answer["isError"] is True and answer["_meta"]["callproof/needs"] == "confirmation"
    assert answer["content"][0]["text"].startswith("in doubt: a person must settle it. The call to append_line")
    assert f"callproof confirm /runs/r1 {'c' * 64}" in answer["content"][0]["text"]
    # A person said it did not happen: the writer's outcome is a rejection.
    settled_no = CallOutcome("c" * 64, "rejected", False, None, {"kind": "retryable", "message": "confirmed not done"})
    assert answer_for("t", settled_no, Path("r"))["content"][0]["text"].startswith("not run: confirmed not done")
    # A person said it happened: there is no server answer to give back, only the decision.
    settled_yes = CallOutcome("c" * 64, "committed", True, {"confirmation_id": "d" * 64})
    said = answer_for("t", settled_yes, Path("r"))
    assert said["isError"] is False and said["content"][0]["text"] == f'done: {{"confirmation_id": "{"d" * 64}"}}'
    # The server's answer, given back as it was, with what the writer did in _meta beside its own.
    server = {"content": [{"type": "text", "text": "ok"}], "isError": False, "_meta": {"server/key": 1}}
    reused = answer_for("t", CallOutcome("c" * 64, "committed", True, server), Path("r"))
    assert reused["content"] == server["content"] and reused["_meta"]["server/key"] == 1
    assert reused["_meta"]["callproof/reused"] is True and server["_meta"] == {"server/key": 1}


def test_with_no_configuration_everything_passes_and_it_says_so(run_dir):
    ended = proxy_cli("--run", str(run_dir), "--", sys.executable, SERVER, "--effects", str(run_dir / "x.jsonl"))
    assert ended.returncode == 0, ended.stderr  # its client (standard input) closed at once
    assert "no side-effecting tool configured: every call passes through" in ended.stderr
    assert ended.stdout == ""


def _block(page: str, after: str, language: str) -> str:
    """The first ``language`` code block of ``page`` after the text ``after``."""
    start = page.index(f"```{language}\n", page.index(after)) + len(language) + 4
    return page[start : page.index("```", start)]


def test_the_runtime_authors_example_runs_and_prints_what_it_says(tmp_path):
    page = (PROJECT / "docs" / "runtime-authors.md").read_text()
    shell = _block(page, "### A runnable example", "sh").replace("/tmp/mcp-demo", str(tmp_path))
    client = _block(page, "### A runnable example", "python").replace("/tmp/mcp-demo", str(tmp_path))
    shell = "\n".join(line for line in shell.splitlines() if not line.startswith("pip install"))
    # `callproof` and `python` are this environment's, as after the page's `pip install`.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ran = subprocess.run(["bash", "-e", "-c", shell], cwd=PROJECT, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    printed = subprocess.run([sys.executable, "-c", client], cwd=PROJECT, env=env, capture_output=True, text=True,
                             check=False)  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == ["appended line 1: deploy v2 False", "appended line 1: deploy v2 True"]
    assert len(effects(tmp_path / "effects.jsonl")) == 1
    config = json.loads(_block(page, "### The configuration file", "json"))
    assert set(parse_config(config)) == {"create_issue", "send_email"}
    desktop = json.loads(_block(page, "**Claude Desktop**", "json"))["mcpServers"]["files"]
    parsed = build_parser().parse_args(desktop["args"])
    assert desktop["command"] == "callproof" and parsed.command == "mcp-proxy"
    assert parsed.server_command[1:] == ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/agent/work"]
