"""``callproof serve``: the writer as a daemon that owns the run directories, reached by a Unix socket.

With real Unix users (root makes them; CI runs as root): the agent's user calls its tools
through the socket and can change none of the records itself. Without: the wire's bounds,
the daemon's refusals, and the writer's answers as they are in process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from receipts import client, protocol, runtime
from receipts import client as client_module
from receipts.signing import KEY_ENV, key_for_run, load_key
from tests.helpers import CONTRACT
from tests.served import AGENTS_GROUP, Daemon, as_user, script_as
from tests.writer import FILE_ARGS, MESSAGE, outbox_lines

# What an agent that edits files would try on the records, each from its own user.
ATTACKS = r"""
import json, os, sys
run = sys.argv[1] if len(sys.argv) > 1 else os.environ["RUN"]
receipt = os.environ["RECEIPT"]
def attempt(name, action):
    try:
        action()
        results[name] = "done"
    except OSError as error:
        results[name] = type(error).__name__
results = {}
r = os.path.join(run, "receipts")
# The control: what is the agent's to write, it writes (and the file stands ready to replace steer.json).
attempt("write in its workspace", lambda: open(os.path.join(run, "workspace", "steer.json"), "w").write("{}"))
attempt("create a receipt", lambda: open(os.path.join(r, "forged.json"), "x").write("{}"))
attempt("change a receipt", lambda: open(os.path.join(r, receipt), "r+b").write(b"{"))
attempt("rename a receipt", lambda: os.rename(os.path.join(r, receipt), os.path.join(r, "moved.json")))
attempt("remove a receipt", lambda: os.remove(os.path.join(r, receipt)))
attempt("append to the ledger", lambda: open(os.path.join(run, "events.jsonl"), "ab").write(b"{}\n"))
attempt("truncate the ledger", lambda: os.truncate(os.path.join(run, "events.jsonl"), 0))
attempt("replace steer.json", lambda: os.replace(os.path.join(run, "workspace", "steer.json"),
                                                 os.path.join(run, "steer.json")))
attempt("change steer.json", lambda: open(os.path.join(run, "steer.json"), "r+b").write(b"{"))
attempt("create a task", lambda: open(os.path.join(run, "tasks", "TASK-999999.md"), "x").write("forged"))
attempt("change state.json", lambda: open(os.path.join(run, "state.json"), "r+b").write(b"{"))
attempt("write a confirmation", lambda: open(os.path.join(run, "confirmations", "x.json"), "x").write("{}"))
attempt("take a call's lock file", lambda: open(os.path.join(run, ".writer", "call-x.lock"), "x"))
attempt("open the folder to others", lambda: os.chmod(r, 0o777))
attempt("rename the receipts folder", lambda: os.rename(r, os.path.join(run, "old-receipts")))
attempt("move the run away", lambda: os.rename(run, run + "-moved"))
attempt("make a run of its own", lambda: os.mkdir(os.path.dirname(run) + "/forged-run"))
print(json.dumps(results))
"""


def served_dirs(base: Path, writer) -> tuple[Path, Path]:
    """The runs root and the socket's folder, the writer's and readable by all."""
    root, sockets = base / "runs", base / "sockets"
    for folder in (root, sockets):
        folder.mkdir(mode=0o755)
        if writer is not None:
            os.chown(folder, writer.uid, writer.gid)
    return root, sockets / "writer.sock"


def records_digest(run: Path) -> str:
    """Every record's bytes and modes, but for the agent's workspace and outbox."""
    digest = hashlib.sha256()
    for path in sorted(run.rglob("*")):
        relative = path.relative_to(run)
        if relative.parts[0] in ("workspace", "outbox.jsonl"):
            continue
        status = path.lstat()
        digest.update(f"{relative}:{stat.S_IMODE(status.st_mode):o}:{status.st_uid}\n".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@contextlib.contextmanager
def agents_run(users, base: Path, **env: str) -> Iterator[tuple[Path, Path]]:
    """A daemon running as the writer's user, and a run the agent's user made through it."""
    writer, agent = users
    root, sock = served_dirs(base, writer)
    with Daemon(root, sock, account=writer, options=("--agents-group", AGENTS_GROUP), env=env or None):
        run = root / "run-1"
        assert as_user(agent, "init", str(run), "--contract-sha256", CONTRACT, socket=sock).returncode == 0
        yield run, sock


def committed(result) -> dict:
    assert result.returncode == 0, result.stderr.decode()
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "committed", outcome
    return outcome


# --- with real users ---------------------------------------------------------------


def test_an_agent_user_calls_through_the_socket_and_can_change_no_record_itself(users, shared_tmp):
    writer, agent = users
    root, sock = served_dirs(shared_tmp, writer)
    with Daemon(root, sock, account=writer, options=("--agents-group", AGENTS_GROUP)):
        run = root / "run-1"
        made = as_user(agent, "init", str(run), "--contract-sha256", CONTRACT, socket=sock)
        assert made.returncode == 0, made.stderr.decode()
        file_call = committed(as_user(agent, "call", str(run), "--tool", "write_file", "--args",
                                      json.dumps(FILE_ARGS), socket=sock))  # fmt: skip
        committed(as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE),
                          socket=sock))  # fmt: skip
        again = committed(as_user(agent, "call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS),
                                  socket=sock))  # fmt: skip
        assert again["reused"] is True
    receipt = run / "receipts" / f"{file_call['call_id']}.json"
    assert receipt.stat().st_uid == writer.uid and (run / "events.jsonl").stat().st_uid == writer.uid
    assert (run / "workspace" / FILE_ARGS["path"]).read_text() == FILE_ARGS["content"]
    assert [line["call_id"] for line in outbox_lines(run)] != []
    before = records_digest(run)

    attacks = script_as(agent, ATTACKS, RUN=str(run), RECEIPT=receipt.name)
    assert attacks.returncode == 0, attacks.stderr
    results = json.loads(attacks.stdout)
    assert results.pop("write in its workspace") == "done"  # the control: a refusal below is the user's, not the test's
    assert results == dict.fromkeys(results, "PermissionError") and len(results) == 16, results
    assert records_digest(run) == before

    # Without the daemon the agent's writer cannot write either: the socket is the only way.
    alone = as_user(agent, "call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS | {"path": "b"}))
    assert alone.returncode == 1 and b"Permission denied" in alone.stderr, alone.stderr
    assert records_digest(run) == before


def test_a_call_in_doubt_is_settled_by_a_settler_never_by_the_agent_and_the_agent_follows_it(users, shared_tmp):
    writer, agent = users
    with agents_run(users, shared_tmp) as (run, sock):
        # The agent dies after its message went out, before the daemon heard of it.
        killed = as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE),
                         socket=sock, RECEIPTS_FAILPOINT="after_effect")  # fmt: skip
        assert killed.returncode == 137
        [receipt] = (run / "receipts").glob("*.json")
        assert json.loads(receipt.read_bytes())["status"] == "prepared"
        waiting = as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE),
                          socket=sock)  # fmt: skip
        assert waiting.returncode == 4 and json.loads(waiting.stdout)["needs"] == "confirmation"

        receipt_sha256 = hashlib.sha256(receipt.read_bytes()).hexdigest()
        decision = ("confirm", str(run), receipt.stem, "--resolution", "committed", "--reason", "it went out",
                    "--actor", "agent", "--receipt-sha256", receipt_sha256)  # fmt: skip
        refused = as_user(agent, *decision, socket=sock)
        assert refused.returncode == 1 and b"not settle" in refused.stderr, refused.stderr
        assert not (run / "confirmations" / receipt.name).exists()

        # Root is a settler (as the daemon's own user and --settler users are).
        document, written = runtime.confirm_call(run, receipt.stem, resolution="committed", reason="the mail log",
                                                 actor="dana", receipt_sha256=receipt_sha256,
                                                 writer_socket=str(sock))  # fmt: skip
        assert written and document["resolution"] == "committed"
        assert (run / "confirmations" / receipt.name).stat().st_uid == writer.uid

        followed = committed(as_user(agent, "call", str(run), "--tool", "send_message", "--args",
                                     json.dumps(MESSAGE), socket=sock))  # fmt: skip
        assert followed["reused"] is True
    assert len(outbox_lines(run)) == 1  # one message, whatever happened


def test_a_run_whose_records_others_can_write_is_not_served(users, shared_tmp):
    writer, agent = users
    with agents_run(users, shared_tmp) as (run, sock):
        call = ("call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS))
        (run / "receipts").chmod(0o775)
        refused = as_user(agent, *call, socket=sock)
        assert refused.returncode == 1 and b"receipts is writable by others (mode 0775)" in refused.stderr
        (run / "receipts").chmod(0o755)
        os.chown(run / "steer.json", agent.uid, agent.gid)
        refused = as_user(agent, *call, socket=sock)
        assert refused.returncode == 1 and f"belongs to uid {agent.uid}".encode() in refused.stderr
        os.chown(run / "steer.json", writer.uid, writer.gid)
        assert not list((run / "receipts").glob("*.json"))
        committed(as_user(agent, *call, socket=sock))


def test_the_signing_key_lives_only_with_the_daemon_and_its_signatures_hold(users, shared_tmp, monkeypatch):
    writer, agent = users
    root, sock = served_dirs(shared_tmp, writer)
    keys = shared_tmp / "keys"
    keys.mkdir(mode=0o700)
    key_file = keys / "writer.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    key_file.chmod(0o600)
    for path in (keys, key_file):
        os.chown(path, writer.uid, writer.gid)
    with Daemon(root, sock, account=writer, options=("--agents-group", AGENTS_GROUP),
                env={"RECEIPTS_SIGNING_KEY": str(key_file)}):  # fmt: skip
        run = root / "run-1"
        assert as_user(agent, "init", str(run), "--contract-sha256", CONTRACT, socket=sock).returncode == 0
        outcome = committed(as_user(agent, "call", str(run), "--tool", "write_file", "--args",
                                    json.dumps(FILE_ARGS), socket=sock))  # fmt: skip
    read = script_as(agent, f"open({str(key_file)!r}).read()")
    assert "PermissionError" in read.stderr
    receipt = json.loads((run / "receipts" / f"{outcome['call_id']}.json").read_bytes())
    monkeypatch.setenv(KEY_ENV, str(key_file))
    key = key_for_run(run)  # the daemon's key, bound to this run
    assert key is not None and key.key_id.startswith(load_key(key_file).key_id[:8])
    check = protocol.check_receipt_identity(receipt, call_id=outcome["call_id"], contract_sha256=CONTRACT,
                                            signing_key=key)  # fmt: skip
    assert check.verified and "signature" in receipt


@pytest.mark.parametrize("mode", ["content", "git"])
def test_an_agent_user_applies_a_multi_file_change_through_the_daemon(users, shared_tmp, mode):
    writer, agent = users
    root, sock = served_dirs(shared_tmp, writer)
    changes = {"tree": "site", "mode": mode, "changes": [{"path": "index.html", "content": "<h1>hi</h1>"},
                                                         {"path": "news/today.txt", "content": "shipped"}]}  # fmt: skip
    with Daemon(root, sock, account=writer, options=("--agents-group", AGENTS_GROUP)):
        run = root / "run-1"
        assert as_user(agent, "init", str(run), "--contract-sha256", CONTRACT, socket=sock).returncode == 0
        call = ("call", str(run), "--tool", "apply_changes", "--args", json.dumps(changes))
        first = committed(as_user(agent, *call, socket=sock))
        assert committed(as_user(agent, *call, socket=sock))["reused"] is True
    assert first["result"]["files_sha256"] and first["result"]["version"]
    assert (run / "receipts" / f"{first['call_id']}.json").stat().st_uid == writer.uid
    if mode == "content":
        assert (run / "workspace" / "site" / "news" / "today.txt").read_text() == "shipped"


@pytest.mark.django_db
def test_the_dashboards_settle_is_written_by_the_daemon_and_the_agent_follows_it(
    users, shared_tmp, client, django_user_model, monkeypatch
):
    from django.urls import reverse

    from evidence.ingest import importer
    from evidence.models import Call, HumanDecision
    from tests.helpers import join

    writer, agent = users
    with agents_run(users, shared_tmp) as (run, sock):
        send = ("call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE))
        assert as_user(agent, *send, socket=sock, RECEIPTS_FAILPOINT="after_effect").returncode == 137
        importer.root_import(root=run.parent)
        call = Call.objects.get(run__run_id="run-1")
        # The dashboard's process reaches the run's writer as the agents do; it is a settler (root here).
        monkeypatch.setenv(client_module.SOCKET_ENV, str(sock))
        client.force_login(join(django_user_model.objects.create_user("carol"), "confirmer"))
        response = client.post(
            reverse("confirm", args=["run-1", call.call_id]),
            {"resolution": "committed", "reason": "the mail log shows it", "confirm_call_id": call.call_id[:12],
             "receipt_sha256": call.file_sha256},
        )  # fmt: skip
        assert response.status_code == 303, response.content.decode()[:2000]
        decision = HumanDecision.objects.get(call_id=call.call_id)
        assert decision.delivered_at is not None and decision.delivery_error == ""
        confirmation = run / "confirmations" / f"{call.call_id}.json"
        assert confirmation.stat().st_uid == writer.uid
        assert json.loads(confirmation.read_bytes())["actor"] == decision.actor
        followed = committed(as_user(agent, *send, socket=sock))
        assert followed["reused"] is True
    assert len(outbox_lines(run)) == 1


# --- the daemon's bounds and refusals (any user) ------------------------------------


@pytest.fixture
def daemon(shared_tmp):
    root, sock = served_dirs(shared_tmp, None)
    with Daemon(root, sock, options=("--max-clients", "2")) as running:
        yield running


def new_run(daemon: Daemon, name: str = "run-1") -> Path:
    run = daemon.root / name
    runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(daemon.socket))
    return run


def raw_request(daemon: Daemon, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(daemon.socket))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon stopped reading: what it said, if anything, is still there to read
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def refusal(answer: bytes) -> str:
    """The message of the daemon's one answer, a ``MessageRefused`` error."""
    document = json.loads(answer)
    assert document["error"]["type"] == "MessageRefused", document
    return document["error"]["message"]


def test_the_wire_refuses_what_is_too_long_or_not_a_request_and_serves_on(daemon):
    run = new_run(daemon)
    assert "longer than" in refusal(raw_request(daemon, b"x" * (client.MAX_MESSAGE_BYTES + 10) + b"\n"))
    assert "JSON object" in refusal(raw_request(daemon, b"[1, 2]\n"))
    assert "cut short" in refusal(
        raw_request(daemon, b'{"op": "call", "run": "' + str(run).encode() + b'", "args": {}')
    )
    answer = json.loads(raw_request(daemon, json.dumps({"op": "fly", "run": str(run)}).encode() + b"\n"))
    assert answer == {"error": {"type": "refused", "message": "no such request 'fly'"}}
    outcome = runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", FILE_ARGS)
    assert outcome.status == "committed"


def test_a_run_outside_the_root_or_through_a_symlink_is_refused(daemon, shared_tmp):
    run = new_run(daemon)
    elsewhere = shared_tmp / "elsewhere"
    with pytest.raises(PermissionError, match="is not a run below"):
        runtime.run_init(elsewhere, contract_sha256=CONTRACT, writer_socket=str(daemon.socket))
    with pytest.raises(PermissionError, match="is not a run below"):
        runtime.Executor(daemon.root / ".." / "runs-other", writer_socket=str(daemon.socket)).call(
            "write_file", FILE_ARGS
        )
    (daemon.root / "link").symlink_to(run)
    with pytest.raises(PermissionError, match="passes through a symlink"):
        runtime.Executor(daemon.root / "link", writer_socket=str(daemon.socket)).call("write_file", FILE_ARGS)
    assert not list((run / "receipts").glob("*.json")) and not elsewhere.exists()


def test_clients_beyond_the_limit_are_told_the_writer_is_busy(daemon, monkeypatch):
    from receipts import client

    run = new_run(daemon)
    held = [socket.socket(socket.AF_UNIX) for _ in range(2)]
    readers = [sock.makefile("rb") for sock in held]
    adapter = {"name": "slow", "version": "1", "can_query": False, "has_evidence": False, "checks_commits": True}
    try:
        for number, sock in enumerate(held):
            sock.settimeout(60)
            sock.connect(str(daemon.socket))
            sock.sendall(json.dumps({"op": "call", "run": str(run), "adapter": adapter, "args": {"n": number}}).encode()
                         + b"\n")  # fmt: skip
            # Asked to normalise: a thread of the daemon serves this client, and holds one of the two slots.
            assert json.loads(readers[number].readline())["ask"] == "normalise"
        with monkeypatch.context() as once:
            once.setenv("RECEIPTS_LOCK_WAIT_SECONDS", "0.001")  # else sent again a while later
            with pytest.raises(client.WriterBusy, match="too many clients"):
                runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", FILE_ARGS)
    finally:
        for reader, sock in zip(readers, held, strict=True):
            reader.close()
            sock.close()
    while True:  # the two threads let their slots go once they see their clients gone
        try:
            outcome = runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", FILE_ARGS)
            break
        except client.WriterBusy:
            continue  # it tried again a while, and the slots are still taken: once more
    assert outcome.status == "committed"


class Surprising:
    """An adapter whose target answers with an error nobody foresaw, after the effect may have happened."""

    name, version = "surprising", "1"

    def normalise(self, args):
        if args.get("bad"):
            raise LookupError("no such field: bad")
        return dict(args)

    def execute(self, run_dir, args, call_id):
        raise KeyError("connection reset after sending")


def test_what_an_adapter_raises_reads_the_same_through_the_daemon_as_in_process(daemon, tmp_path):
    served, local = new_run(daemon, "served"), tmp_path / "local"
    runtime.run_init(local, contract_sha256=CONTRACT)
    outcomes = [runtime.Executor(run, {"surprising": Surprising()}, writer_socket=socket_path).call("surprising",
                                                                                                   {"n": 1})
                for run, socket_path in ((served, str(daemon.socket)), (local, ""))]  # fmt: skip
    assert outcomes[0] == outcomes[1] and outcomes[0].status == "unknown"
    assert outcomes[0].error == {"kind": "unknown", "message": "KeyError: 'connection reset after sending'"}
    # A surprise before anything is written reaches the caller as itself.
    with pytest.raises(LookupError, match="no such field"):
        runtime.Executor(served, {"surprising": Surprising()}, writer_socket=str(daemon.socket)).call(
            "surprising", {"bad": True}
        )


def test_arguments_that_cannot_be_recorded_are_refused_as_in_process(daemon, tmp_path):
    import datetime as dt

    served, local = new_run(daemon, "served"), tmp_path / "local"
    runtime.run_init(local, contract_sha256=CONTRACT)
    refusals = []
    for run, socket_path in ((served, str(daemon.socket)), (local, "")):
        with pytest.raises(ValueError, match="cannot be recorded") as refused:
            runtime.Executor(run, {"surprising": Surprising()}, writer_socket=socket_path).call(
                "surprising", {"when": dt.datetime(2026, 12, 5, tzinfo=dt.UTC)}
            )
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1]
    assert not list((served / "receipts").glob("*.json"))


def test_tasks_state_and_the_decorator_go_through_the_daemon(daemon, monkeypatch):
    from receipts import receipted, use_run

    run = new_run(daemon)
    monkeypatch.setenv(client.SOCKET_ENV, str(daemon.socket))
    request = {"title": "deploy", "body": "ship it"}
    first, second = (runtime.write_task(run, request, "sub-1") for _ in range(2))
    assert (first.disposition, second.disposition) == ("created", "reused")
    effects = []

    @receipted(version="1")
    def notify(to: str, *, call_id: str) -> dict:
        effects.append(to)
        return {"sent": to}

    with use_run(run):
        assert notify("ops") == {"sent": "ops"}
        assert notify("ops") == {"sent": "ops"}
    assert effects == ["ops"]
    runtime.run_set_state(run, state="finished", attempts=1)
    with pytest.raises(ValueError, match="finished"), use_run(run):
        notify("dev")
    peers = {event["peer_pid"] for event in daemon.events() if event.get("op") == "call"}
    assert peers == {os.getpid()}


def test_a_call_made_again_from_inside_its_own_effect_is_refused_not_waited_on(daemon):
    run = new_run(daemon)

    class Recursive:
        name, version = "recursive", "1"

        def normalise(self, args):
            return dict(args)

        def execute(self, run_dir, args, call_id):
            return (
                runtime.Executor(run, {"recursive": self}, writer_socket=str(daemon.socket))
                .call("recursive", args)
                .as_dict()
            )

    outcome = runtime.Executor(run, {"recursive": Recursive()}, writer_socket=str(daemon.socket)).call(
        "recursive", {"n": 1}
    )
    assert outcome.status == "unknown" and "calls itself with the same arguments" in (outcome.error or {})["message"]


def test_one_daemon_per_socket_and_a_dead_daemons_socket_is_taken_over(shared_tmp):
    root, sock = served_dirs(shared_tmp, None)
    first = Daemon(root, sock).start()
    try:
        second = Daemon(root, sock)
        with pytest.raises(AssertionError, match="another writer daemon serves"):
            second.start()
        first.kill()  # SIGKILL: the socket file stays behind
        assert sock.exists()
        with Daemon(root, sock) as third:
            run = new_run(third)
            assert runtime.Executor(run, writer_socket=str(sock)).call("write_file", FILE_ARGS).status == "committed"
    finally:
        first.stop()


def test_no_daemon_is_an_error_that_says_so_and_writes_nothing(shared_tmp):
    root, sock = served_dirs(shared_tmp, None)
    run = root / "run-1"
    runtime.run_init(run, contract_sha256=CONTRACT)
    with pytest.raises(client.WriterUnavailable, match="cannot be reached"):
        runtime.Executor(run, writer_socket=str(sock)).call("write_file", FILE_ARGS)
    assert not list((run / "receipts").glob("*.json"))


class Slow:
    """An adapter whose effect takes longer than the daemon waits for it."""

    name, version = "slow", "1"

    def normalise(self, args):
        return dict(args)

    def execute(self, run_dir, args, call_id):
        time.sleep(1.5)
        return {"done": True}


def test_a_client_silent_past_its_time_leaves_the_call_in_doubt_and_the_daemon_serves_on(shared_tmp):
    root, sock = served_dirs(shared_tmp, None)
    with Daemon(root, sock, options=("--answer-timeout", "0.3", "--request-timeout", "0.3")) as daemon:
        run = new_run(daemon)
        with pytest.raises(client.WriterUnavailable, match="went away before it answered"):
            runtime.Executor(run, {"slow": Slow()}, writer_socket=str(sock)).call("slow", {"n": 1})
        [receipt] = (run / "receipts").glob("*.json")
        assert json.loads(receipt.read_bytes())["status"] == "prepared"  # in doubt: the effect may have happened
        again = runtime.Executor(run, {"slow": Slow()}, writer_socket=str(sock)).call("slow", {"n": 1})
        assert again.status == "prepared" and again.needs == "confirmation"
        # A connection that never sends its request is closed when its time is up.
        with socket.socket(socket.AF_UNIX) as silent:
            silent.settimeout(10)
            silent.connect(str(sock))
            assert silent.recv(10) == b""
        assert runtime.Executor(run, writer_socket=str(sock)).call("write_file", FILE_ARGS).status == "committed"


def peak_memory_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_message_of_many_small_values_is_refused_before_it_is_parsed(daemon):
    """Issue 55, case 3: a line at the byte limit made of empty objects took the daemon from
    24 MB to 706 MB (six million dicts), and 848 MB stayed. Its values are counted before it
    is parsed now: refused, said, and the daemon grows by about the line it read."""
    run = new_run(daemon)
    assert daemon.process is not None
    before = peak_memory_mib(daemon.process.pid)
    head = b'{"op": "call", "run": "' + str(run).encode() + b'", "args": {"x": ['
    items = (client.MAX_MESSAGE_BYTES - len(head) - 10) // 3
    line = head + b"{}," * items + b"{}]}}\n"
    assert len(line) <= client.MAX_MESSAGE_BYTES
    assert "values" in refusal(raw_request(daemon, line))
    grown = peak_memory_mib(daemon.process.pid) - before
    assert grown < 100, f"the daemon grew by {grown:.0f} MiB for one refused line"
    # Strings full of commas and brackets are one value each: a large file's text is taken.
    text = {"path": "data.csv", "content": "a,b,[c],{d}\n" * 300_000}
    outcome = runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", text)
    assert outcome.status == "committed"


def test_the_daemons_memory_budget_refuses_what_would_pass_it(shared_tmp, monkeypatch):
    """``--max-memory``: a request that alone may cost more than the budget is refused for good;
    one that finds the budget spent by others is told the writer is busy (its client sends it
    again), and is taken once they are done."""
    root, sock = served_dirs(shared_tmp, None)
    with Daemon(root, sock, options=("--max-memory", "16")) as daemon:
        run = new_run(daemon)
        big = {"path": "big.txt", "content": "x" * (3 * 1024 * 1024)}  # 3 MiB may cost 24 to parse
        with pytest.raises(client.MessageRefused, match="more than the writer's memory budget"):
            runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", big)
        small = {"path": "small.txt", "content": "x" * (1024 * 1024)}  # may cost 9 MiB
        with socket.socket(socket.AF_UNIX) as holder:
            holder.settimeout(60)
            holder.connect(str(daemon.socket))
            # Most of a line, not all of it: the daemon has read it (sendall returned but for
            # what the socket's buffers hold) and holds it, charged, waiting for the rest.
            holder.sendall(b'{"op": "call", "run": "' + str(run).encode() + b'", "args": {"pad": "' + b"x" * (6 << 20))
            with monkeypatch.context() as once:
                once.setenv("RECEIPTS_LOCK_WAIT_SECONDS", "0.001")
                with pytest.raises(client.WriterBusy, match="memory budget"):
                    runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", small)
        outcome = runtime.Executor(run, writer_socket=str(daemon.socket)).call("write_file", small)
        assert outcome.status == "committed"


class Listing:
    """An adapter whose effect is done and whose result holds more values than a receipt takes."""

    name, version = "listing", "1"

    def __init__(self) -> None:
        self.executions = 0

    def normalise(self, args):
        return dict(args)

    def execute(self, run_dir, args, call_id):
        self.executions += 1
        return {"ids": list(range(protocol.MAX_VALUE_NODES))}


def test_a_result_of_too_many_values_over_the_wire_is_unknown_as_in_process(daemon):
    """The wire refuses a message of too many values; an effect's answer that the daemon never
    read would leave the call prepared with nothing said. The client says it instead: the call is
    unknown, a person decides, and it is never run again."""
    run = new_run(daemon)
    adapter = Listing()
    executor = runtime.Executor(run, {"listing": adapter}, writer_socket=str(daemon.socket))
    outcome = executor.call("listing", {"page": 1}, attempt=1)
    assert (outcome.status, outcome.needs) == ("unknown", "confirmation") and outcome.error is not None
    assert "250,000 values" in outcome.error["message"]
    again = executor.call("listing", {"page": 1}, attempt=1)
    assert again.needs == "confirmation" and adapter.executions == 1
