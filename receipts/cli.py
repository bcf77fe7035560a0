"""``python -m receipts``: the writer's command line (no Django needed).

JSON results go to standard output, errors to standard error. Exit codes:
0 success (created, reused, committed), 1 bad input or I/O error (nothing
was done), 2 usage, 3 conflict or rejected, 4 a person must decide (a call in
doubt, or a new attempt refused while calls are in doubt), 5 the effect is
done but recording it is incomplete: do not retry it as a new request,
6 the conformance kit found an adapter failing a check, 7 the subcommand needs
an optional extra that is not installed (it says which).
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from receipts import __version__, protocol, runtime

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CONFLICT, EXIT_AWAITING, EXIT_DONE_UNRECORDED = 0, 1, 2, 3, 4, 5
EXIT_NONCONFORMING = 6  # the conformance kit: an adapter failed a check
EXIT_MISSING_EXTRA = 7  # a subcommand that needs an optional extra which is not installed


def _print(document: Any) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")


def _read_request(source: str) -> Any:
    data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    return protocol.load_json_strict(data)


def cmd_init(options: argparse.Namespace) -> int:
    if options.agents_group and os.environ.get("RECEIPTS_WRITER_SOCKET"):
        raise ValueError("--agents-group is for a run made here: a writer daemon gives its runs to its own group")
    runtime.run_init(
        Path(options.run_dir),
        contract_sha256=options.contract_sha256,
        attempts=options.attempts,
        identity=options.identity,
    )
    if options.agents_group:
        from receipts.serve import give_to_agents

        give_to_agents(Path(options.run_dir), grp.getgrnam(options.agents_group).gr_gid)
    _print({"run_dir": str(options.run_dir), "contract_sha256": options.contract_sha256, "identity": options.identity})
    return EXIT_OK


def cmd_serve(options: argparse.Namespace) -> int:
    from receipts.serve import serve

    if not 0 < options.answer_timeout <= 86400:
        raise ValueError("--answer-timeout is from 0 to 86400 seconds")
    if not 0 < options.max_clients <= 4096:
        raise ValueError("--max-clients is from 1 to 4096")
    if not 16 <= options.max_memory <= 1 << 20:
        raise ValueError("--max-memory is from 16 to 1048576 MiB")
    if not 0 < options.request_timeout <= 3600:
        raise ValueError("--request-timeout is from 0 to 3600 seconds")
    return serve(Path(options.root), Path(options.socket), agents_group=options.agents_group,
                 settlers=tuple(options.settler), max_clients=options.max_clients, max_memory=options.max_memory << 20,
                 answer_timeout=options.answer_timeout, request_timeout=options.request_timeout)  # fmt: skip


def cmd_write_task(options: argparse.Namespace) -> int:
    request = _read_request(options.request)
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object")
    result = runtime.write_task(Path(options.run_dir), request, options.submission_id)
    _print(result.as_dict())
    return EXIT_CONFLICT if result.disposition == "conflict" else EXIT_OK


def cmd_call(options: argparse.Namespace) -> int:
    args = protocol.load_json_strict(options.args.encode("utf-8"))
    if not isinstance(args, dict):
        raise ValueError("--args must be a JSON object")
    executor = runtime.Executor(Path(options.run_dir))
    outcome = executor.call(
        options.tool,
        args,
        attempt=options.attempt,
        identity=options.identity,
        override_unsettled=options.override_unsettled,
    )
    _print(outcome.as_dict())
    # Only a verified commit is success: "committed" with needs set is a receipt a person must look at.
    if outcome.needs:
        return EXIT_AWAITING
    return EXIT_OK if outcome.status == "committed" else EXIT_CONFLICT


def cmd_replay(options: argparse.Namespace) -> int:
    # Imported here, not above: the reader it brings is a sixth of the start of every other
    # command, and an agent's host starts the writer once a tool call.
    from receipts.replay import replay_run

    report = replay_run(Path(options.run_dir))
    if options.json:
        _print(report)
    else:
        for row in report["decisions"]:
            sys.stdout.write(
                f"{row['call_id'][:12]}  {row['status'] or '-':<10} {row['decision']:<8} {row['reason']}\n"
            )
    return EXIT_OK


def cmd_verify_evidence(options: argparse.Namespace) -> int:
    from receipts.reader.verify import verify_export  # standard library and the reader, as this module

    against = Path(options.against) if options.against else None
    problems = verify_export(Path(options.export_dir), against)
    for problem in problems:
        sys.stderr.write(f"{problem}\n")
    if problems:
        return EXIT_ERROR
    # As manage.py verify_evidence says it: the same check, for a machine without the dashboard.
    sys.stdout.write(f"{options.export_dir}: intact" + (f", and it matches {against}" if against else "") + "\n")
    return EXIT_OK


def cmd_confirm(options: argparse.Namespace) -> int:
    try:
        document, written = runtime.confirm_call(
            Path(options.run_dir),
            options.call_id,
            resolution=options.resolution,
            reason=options.reason,
            actor=options.actor,
            receipt_sha256=options.receipt_sha256,
        )
    except runtime.ConfirmationRefused as refused:
        sys.stderr.write(f"refused: {refused}\n")
        return EXIT_CONFLICT
    _print(document | {"written": written})
    return EXIT_OK


def cmd_state(options: argparse.Namespace) -> int:
    try:
        runtime.run_set_state(
            Path(options.run_dir),
            state=options.name,
            attempts=options.attempts,
            override_unsettled=options.override_unsettled,
        )
    except runtime.UnsettledCalls as refused:
        _print({"refused": str(refused), "call_ids": refused.call_ids})
        sys.stderr.write(f"refused: {refused}\n")
        return EXIT_AWAITING
    _print({"state": options.name, "attempts": options.attempts})
    return EXIT_OK


def cmd_sweep(options: argparse.Namespace) -> int:
    run_dir = Path(options.run_dir)
    temps = runtime.sweep_temp_files(run_dir, older_than=options.older_than_minutes * 60)
    locks = runtime.sweep_locks(run_dir)
    _print({"temp_files": [str(path.relative_to(run_dir)) for path in temps],
            "locks": [str(path.relative_to(run_dir)) for path in locks]})  # fmt: skip
    return EXIT_OK


def cmd_mcp_proxy(options: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        sys.stderr.write("error: mcp-proxy needs the MCP SDK, which is not installed: pip install 'callproof[mcp]'\n")
        return EXIT_MISSING_EXTRA
    from receipts.adapters.mcp_proxy import run_proxy  # the SDK, imported only here

    command = options.server_command[1:] if options.server_command[:1] == ["--"] else options.server_command
    return run_proxy(Path(options.run_dir), Path(options.config) if options.config else None, command)


def cmd_demo(options: argparse.Namespace) -> int:
    from receipts.demo import write_demo_runs

    _print({"runs": write_demo_runs(Path(options.root))})
    return EXIT_OK


def cmd_ship(options: argparse.Namespace) -> int:
    from receipts import ship

    key = os.environ.get("CALLPROOF_SHIP_KEY", "")
    if options.key_file:
        key = Path(options.key_file).read_text(encoding="utf-8").strip()
    if not key:
        raise ValueError("the host's key: --key-file FILE (or CALLPROOF_SHIP_KEY), from manage.py host add NAME")
    if options.interval <= 0 or options.interval > 3600:
        raise ValueError("--interval is from 0 to 3600 seconds")
    if not 0 <= options.decisions_every <= 3600:
        raise ValueError("--decisions-every is from 0 to 3600 seconds")
    state = Path(options.state) if options.state else None
    return ship.run(Path(options.root), options.to, key, interval=options.interval, once=options.once,
                    state_path=state, ca_file=options.ca_file, decisions_every=options.decisions_every)  # fmt: skip


def cmd_conformance(options: argparse.Namespace) -> int:
    from receipts.conformance import format_table, run_kit

    args = None
    if options.args is not None:
        args = protocol.load_json_strict(options.args.encode("utf-8"))
        if not isinstance(args, dict):
            raise ValueError("--args must be a JSON object")
    failing_args = None
    if options.failing_args is not None:
        failing_args = protocol.load_json_strict(options.failing_args.encode("utf-8"))
        if not isinstance(failing_args, dict):
            raise ValueError("--failing-args must be a JSON object")
    report = run_kit(
        options.adapter,
        args=args,
        failing_args=failing_args,
        generated=options.generated,
        key_wait=options.key_wait,
        counter=options.counter,
        trials=options.trials,
        concurrency=options.concurrency,
        seed=options.seed,
        keep=options.keep,
    )
    if options.json:
        _print(report.as_dict())
    else:
        sys.stdout.write(format_table(report) + "\n")
    return EXIT_OK if report.passed else EXIT_NONCONFORMING


OVERRIDE_HELP = (
    "go on although calls of an earlier attempt are in doubt (they may be made again under new call_ids); "
    "the reason and the calls go to the ledger"
)


def guides_folder() -> Path:
    """The guides (docs/*.md): inside the package when installed from the wheel (pyproject.toml maps
    docs/ there), beside it in a checkout. Help cites them by name, so an install without the
    checkout still has the text it points to."""
    here = Path(__file__).resolve().parent
    return here / "docs" if (here / "docs").is_dir() else here.parent / "docs"


def cmd_docs(options: argparse.Namespace) -> int:
    guides = {path.stem: path for path in sorted(guides_folder().glob("*.md"))}
    if options.guide is None:
        for name, path in guides.items():
            title = next((line.lstrip("# ") for line in path.read_text("utf-8").splitlines() if line.strip()), "")
            sys.stdout.write(f"{name:<20} {title}\n")
        return EXIT_OK
    chosen = guides.get(options.guide.removesuffix(".md"))
    if chosen is None:
        sys.stderr.write(f"error: no guide {options.guide!r}; the guides: {', '.join(guides)}\n")
        return EXIT_USAGE
    sys.stdout.write(chosen.read_text("utf-8"))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="callproof",
        description="The Callproof writer: run directories, idempotent task creation, receipts around tool calls.",
        epilog="Exit codes: 0 done, 1 error (nothing done), 2 usage, 3 conflict or rejected, 4 a person must "
        "decide, 5 done but recording it is incomplete (do not retry as new), 6 an adapter failed a conformance "
        "check, 7 an optional extra is missing. The guides, installed with the command: callproof docs.",
    )
    parser.add_argument("--version", action="version", version=f"callproof {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    init = commands.add_parser("init", help="create a run directory")
    init.add_argument("run_dir")
    init.add_argument("--contract-sha256", required=True)
    init.add_argument("--attempts", type=int, default=1)
    init.add_argument(
        "--identity",
        choices=protocol.IDENTITIES,
        default=protocol.IDENTITY_V2,
        help="the run's call_id formula, fixed for its life; call-id-v1 only to match a runtime written to the seed",
    )
    init.add_argument("--agents-group", default=None, metavar="GROUP",
                      help="for a run a writer daemon serves: its workspace/ and outbox.jsonl are this group's to "
                      "write (run as root or the daemon's user)")  # fmt: skip
    init.set_defaults(handler=cmd_init)

    served = commands.add_parser(
        "serve", help="the writer as a daemon: the only user that writes the runs below RUNS_ROOT, for agents that "
        "reach it by a Unix socket (RECEIPTS_WRITER_SOCKET); the guide: callproof docs RUN_DIRECTORY",
    )  # fmt: skip
    served.add_argument("root", metavar="RUNS_ROOT")
    served.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket to listen on")
    served.add_argument("--agents-group", default=None, metavar="GROUP",
                        help="who may call: this group may connect (mode 0660), and writes the runs' workspaces; "
                        "without it only the daemon's own user can (0600)")  # fmt: skip
    served.add_argument("--settler", action="append", default=[], metavar="USER",
                        help="a user (besides the daemon's own and root) whose requests may write a person's "
                        "decision, such as the dashboard's; repeatable")  # fmt: skip
    served.add_argument("--max-clients", type=int, default=64, help="connections served at once (64)")
    served.add_argument("--max-memory", type=int, default=512, metavar="MIB",
                        help="what the messages being read may cost at most, in MiB (512): a request past it "
                        "waits (its client sends it again), one larger than it all is refused")  # fmt: skip
    served.add_argument("--answer-timeout", type=float, default=3600.0, metavar="SECONDS",
                        help="how long a call waits for its client's effect, holding its lock (3600); then it "
                        "is left in doubt, as a killed writer leaves it")  # fmt: skip
    served.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long a connection may take to send its request (30)")  # fmt: skip
    served.set_defaults(handler=cmd_serve)

    task = commands.add_parser("write-task", help="create a task, at most once per submission id")
    task.add_argument("run_dir")
    task.add_argument("--request", required=True, help="JSON file, or - for standard input")
    task.add_argument("--submission-id", default=None)
    task.set_defaults(handler=cmd_write_task)

    call = commands.add_parser("call", help="run one built-in tool through receipts")
    call.add_argument("run_dir")
    call.add_argument("--tool", required=True, choices=sorted(runtime.BUILTIN_ADAPTERS))
    call.add_argument("--args", required=True, help="the tool's arguments as a JSON object")
    call.add_argument(
        "--attempt", type=int, default=None, help="default: from state.json (attempts, or attempts + 1 while retrying)"
    )
    call.add_argument(
        "--identity",
        choices=protocol.IDENTITIES,
        default=None,
        help="the call_id formula the caller expects: refused unless it is the run's (fixed at init)",
    )
    call.add_argument("--override-unsettled", metavar="REASON", default=None, help=OVERRIDE_HELP)
    call.set_defaults(handler=cmd_call)

    replay = commands.add_parser("replay", help="recovery decisions, with no side effect")
    replay.add_argument("run_dir")
    replay.add_argument("--json", action="store_true")
    replay.set_defaults(handler=cmd_replay)

    confirm = commands.add_parser(
        "confirm", help="record a person's decision about a call in doubt (what the dashboard's form does)"
    )
    confirm.add_argument("run_dir")
    confirm.add_argument("call_id")
    confirm.add_argument("--resolution", required=True, choices=protocol.RESOLUTIONS)
    confirm.add_argument("--reason", required=True)
    confirm.add_argument("--actor", required=True, help="who decided")
    confirm.add_argument("--receipt-sha256", required=True, help="SHA-256 of the receipt bytes the person looked at")
    confirm.set_defaults(handler=cmd_confirm)

    state = commands.add_parser("state", help="record the run's state (running, retrying, finished, ...)")
    state.add_argument("run_dir")
    state.add_argument("name")
    state.add_argument("--attempts", type=int, required=True)
    state.add_argument("--override-unsettled", metavar="REASON", default=None, help=OVERRIDE_HELP)
    state.set_defaults(handler=cmd_state)

    sweep = commands.add_parser(
        "sweep", help="remove temp files dead writers left, and lock files nobody holds (what a run no longer needs)"
    )
    sweep.add_argument("run_dir")
    sweep.add_argument("--older-than-minutes", type=float, default=60, help="temp files younger than this stay")
    sweep.set_defaults(handler=cmd_sweep)

    verify = commands.add_parser(
        "verify-evidence", help="check an evidence export (and, with --against, the original run); no Django needed"
    )
    verify.add_argument("export_dir")
    verify.add_argument("--against", default=None, metavar="RUN_DIR", help="the original run directory")
    verify.set_defaults(handler=cmd_verify_evidence)

    proxy = commands.add_parser(
        "mcp-proxy",
        help="stand between an MCP client and an MCP server (stdio): receipts for the configured tools "
        "(needs the 'mcp' extra)",
    )
    proxy.add_argument("--run", dest="run_dir", required=True, metavar="RUN_DIR", help="the run directory")
    proxy.add_argument("--config", default=None, metavar="FILE", help="JSON: the side-effecting tools")
    proxy.add_argument("server_command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]")
    proxy.set_defaults(handler=cmd_mcp_proxy)
    kit = commands.add_parser(
        "conformance",
        help="check a tool's adapter: restarts, reuse, conflicts, calls at once, resumes, SIGKILLs "
        "(the guide: callproof docs runtime-authors)",
    )
    kit.add_argument("adapter", metavar="MODULE:ADAPTER", help="an adapter instance, class or zero-argument factory")
    kit.add_argument("--trials", type=int, default=10, help="random-kill trials (default 10; 0 skips them)")
    kit.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    kit.add_argument(
        "--counter", metavar="MODULE:FUNC", default=None,
        help="FUNC(run_dir, args, call_id) -> int: the call's effects on the target (default: the adapter's "
        "evidence, else its query)",
    )  # fmt: skip
    kit.add_argument("--args", default=None, help="one call's args as JSON (default: the adapter's example_args)")
    kit.add_argument(
        "--failing-args", default=None, metavar="JSON",
        help="args the target itself refuses or fails on (default: the adapter's failing_args; none: not tried)",
    )  # fmt: skip
    kit.add_argument("--generated", type=int, default=8,
                     help="arg sets generated besides the example's (default 8; the adapter's args_strategy, a "
                     "hypothesis strategy, draws them where it has one)")  # fmt: skip
    kit.add_argument("--key-wait", type=float, default=5.0, metavar="SECONDS",
                     help="how long the target must keep a call_id as its key (default 5; 0 skips it)")  # fmt: skip
    kit.add_argument("--concurrency", type=int, default=8, help="processes calling at once (default 8)")
    kit.add_argument("--seed", type=int, default=None, help="trial i draws its kills from seed S + i")
    kit.add_argument("--keep", action="store_true", help="keep the scratch run directories (kept on a failure)")
    kit.set_defaults(handler=cmd_conformance)

    shipper = commands.add_parser(
        "ship", help="send this host's runs to the dashboard over HTTPS with the host's key, and write back the "
        "people's decisions (the guide: callproof docs operations)",
    )  # fmt: skip
    shipper.add_argument("root", metavar="RUNS_ROOT")
    shipper.add_argument("--to", required=True, metavar="URL", help="the dashboard, https://... (http on loopback)")
    shipper.add_argument("--key-file", default=None, metavar="FILE", help="the host's key (or CALLPROOF_SHIP_KEY)")
    shipper.add_argument("--interval", type=float, default=3.0, help="seconds between passes (3)")
    shipper.add_argument("--once", action="store_true", help="one pass, then exit")
    shipper.add_argument(
        "--decisions-every",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="while a pass pushes, the people's decisions are fetched and written this often (1)",
    )
    shipper.add_argument("--state", default=None, metavar="FILE", help="what the dashboard acknowledged "
                         "(default: ~/.local/state/callproof/ship-<root>.sqlite3)")  # fmt: skip
    shipper.add_argument("--ca-file", default=None, metavar="FILE", help="CA certificates for the dashboard's TLS")
    shipper.set_defaults(handler=cmd_ship)
    guide = commands.add_parser("docs", help="the guides, as text: with no name, their list (runtime-authors, "
                                "operations, reference, ...)")  # fmt: skip
    guide.add_argument("guide", nargs="?", default=None, metavar="NAME", help="e.g. runtime-authors")
    guide.set_defaults(handler=cmd_docs)
    demo = commands.add_parser("demo", help="write the demo run directories under ROOT")
    demo.add_argument("root")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = build_parser().parse_args(argv)
    needs_run = getattr(options, "run_dir", None) is not None and options.command != "init"
    if needs_run and not Path(options.run_dir, "steer.json").is_file():
        sys.stderr.write(f"error: {options.run_dir} is not a run directory (no steer.json)\n")
        return EXIT_ERROR
    try:
        return options.handler(options)
    except runtime.RecordingIncomplete as incomplete:
        outcome = incomplete.outcome
        _print(outcome.as_dict())
        sys.stderr.write(
            f"done, recording incomplete: the effect happened but {incomplete.cause}; do not retry it as a new "
            "request (the same call or submission again completes the record)\n"
        )
        return EXIT_DONE_UNRECORDED
    except (ValueError, OSError) as error:
        sys.stderr.write(f"error: {error}\n")
        return EXIT_ERROR
