"""``callproof serve`` attacked from outside: what a local user who can reach its socket tries.

Each test is one way in that worked once (the daemon wrote a record it should not, or held a
connection or a call's lock past its bounds), kept so that it stays shut. The daemon's own
promises are in docs/RUN_DIRECTORY.md, "The writer as a daemon"; tests/test_serve.py tests them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from receipts import runtime
from tests.helpers import CONTRACT
from tests.served import AGENTS_GROUP, Daemon, as_user, python_for, script_as
from tests.test_serve import agents_run, committed, raw_request, records_digest, served_dirs
from tests.writer import FILE_ARGS

# A liar's adapter: its effect runs in the attacking client, which answers the daemon by hand.
ADAPTER = {"name": "liar", "version": "1", "can_query": False, "has_evidence": False, "checks_commits": True}


def test_an_agent_cannot_make_a_run_inside_another_run(users, shared_tmp):
    """A "run" in run-1/receipts would put steer.json and state.json among run-1's receipts:
    run-1 would show two calls in doubt that nobody made."""
    writer, agent = users
    root, sock = served_dirs(shared_tmp, writer)
    with Daemon(root, sock, account=writer, options=("--agents-group", AGENTS_GROUP)):
        run = root / "run-1"
        assert as_user(agent, "init", str(run), "--contract-sha256", CONTRACT, socket=sock).returncode == 0
        before = records_digest(run)
        for inside in ("receipts", "confirmations", "tasks", "x"):
            made = as_user(agent, "init", str(run / inside), "--contract-sha256", CONTRACT, socket=sock)
            assert made.returncode == 1 and b"is not a run of" in made.stderr, (inside, made.stderr)
        assert records_digest(run) == before
        made_by_init = {".writer", "confirmations", "events.jsonl", "outbox.jsonl", "receipts", "state.json",
                        "steer.json", "submissions", "tasks", "workspace"}  # fmt: skip
        assert {path.name for path in run.iterdir()} == made_by_init
        # The run itself is served as before.
        committed(as_user(agent, "call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS),
                          socket=sock))  # fmt: skip


@pytest.fixture
def impatient(shared_tmp):
    """A daemon that waits 0.3 s for a request and for each answer."""
    root, sock = served_dirs(shared_tmp, None)
    options = ("--answer-timeout", "0.3", "--request-timeout", "0.3")
    with Daemon(root, sock, options=options) as running:
        yield running


def closed_while_dribbling(sock: socket.socket, seconds: float = 5.0) -> bool:
    """Send a space every 50 ms (never a whole line) until the daemon closes the connection, or ``seconds``."""
    sock.settimeout(0.05)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sock.sendall(b" ")
            if sock.recv(1 << 16) == b"":
                return True
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


def test_a_request_sent_a_byte_at_a_time_is_cut_off_at_the_request_timeout(impatient):
    """Slowloris: each byte came within the socket's timeout, so a connection (a slot of
    --max-clients) was held for as long as the client kept sending."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(impatient.socket))
        sock.sendall(b'{"op": "call"')
        assert closed_while_dribbling(sock), "a request that never ends kept its connection"


def test_an_answer_sent_a_byte_at_a_time_does_not_hold_the_call_past_the_answer_timeout(impatient):
    """The call's lock is held while the daemon waits for the effect's answer: a client that
    dribbles it held the lock (and every other client's same call) for ever."""
    run = impatient.root / "run-1"
    runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(impatient.socket))
    request = {"op": "call", "run": str(run), "adapter": ADAPTER, "args": {"n": 1}}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(impatient.socket))
        reader = sock.makefile("rb")
        sock.sendall(json.dumps(request).encode() + b"\n")
        assert json.loads(reader.readline())["ask"] == "normalise"
        sock.sendall(b'{"answer": {"n": 1}}\n')
        assert json.loads(reader.readline())["ask"] == "execute"
        sock.sendall(b'{"answer": ')
        assert closed_while_dribbling(sock), "an answer that never ends held the call's lock"
        reader.close()
    [receipt] = (run / "receipts").glob("*.json")
    assert json.loads(receipt.read_bytes())["status"] == "prepared"  # left as a client gone mid-call leaves it


@pytest.mark.parametrize("op", ["set_state", "init"])
def test_a_state_that_is_not_text_is_refused_not_written_as_none(impatient, op):
    run = impatient.root / "run-1"
    runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(impatient.socket))
    before = records_digest(run)
    target: Path = run if op == "set_state" else impatient.root / "run-2"
    fields = {"attempts": 1, "state": None} | ({"contract_sha256": CONTRACT} if op == "init" else {})
    if op == "set_state":
        fields.pop("state")  # missing altogether
    answer = json.loads(raw_request(impatient, json.dumps({"op": op, "run": str(target)} | fields).encode() + b"\n"))
    assert answer["error"]["type"] == "ValueError" and "state name" in answer["error"]["message"], answer
    assert records_digest(run) == before and not (impatient.root / "run-2" / "state.json").exists()


def test_a_root_whose_parent_others_can_write_is_not_served(shared_tmp):
    """Through a folder above the root that others can write, the root itself could be swapped
    between the daemon's check and its writes: it does not start."""
    parent = shared_tmp / "open"
    parent.mkdir()
    parent.chmod(0o777)  # not sticky: anyone may rename what is in it
    root = parent / "runs"
    root.mkdir(mode=0o755)
    daemon = Daemon(root, shared_tmp / "writer.sock")
    with pytest.raises(AssertionError, match="above the root, is writable by others"):
        daemon.start()
    parent.chmod(0o1777)  # sticky, as /tmp is: only an entry's owner may rename it
    with Daemon(root, shared_tmp / "writer.sock") as served:
        run = root / "run-1"
        runtime.run_init(run, contract_sha256=CONTRACT, writer_socket=str(served.socket))
        assert runtime.Executor(run, writer_socket=str(served.socket)).call("write_file", FILE_ARGS).status == (
            "committed"
        )


def test_an_agent_cannot_pass_over_its_own_call_in_doubt_only_a_settler_can(users, shared_tmp):
    """Issue 55, case 1: the daemon took ``override_unsettled`` from any user on a call and on a
    state change, so the agent's own user sent a message in doubt again (two outbox lines for
    one intent, no person involved). Only a settler passes over a call in doubt now, and the
    ledger says which uid did."""
    from tests.writer import MESSAGE, outbox_lines

    _, agent = users
    override = ("--override-unsettled", "the agent says so")
    with agents_run(users, shared_tmp) as (run, sock):
        killed = as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE),
                         socket=sock, RECEIPTS_FAILPOINT="after_effect")  # fmt: skip
        assert killed.returncode == 137 and len(outbox_lines(run)) == 1
        for request in (("call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE), "--attempt", "2",
                         *override), ("state", str(run), "retrying", "--attempts", "2", *override)):  # fmt: skip
            refused = as_user(agent, *request, socket=sock)
            assert refused.returncode == 1 and b"not pass over a call in doubt" in refused.stderr, refused.stderr
        assert len(outbox_lines(run)) == 1, "the message was not sent again"
        assert b"unsettled_override" not in (run / "events.jsonl").read_bytes()

        # A settler (root here, as the daemon's user and --settler users are) may, and is named.
        runtime.run_set_state(run, state="retrying", attempts=2, override_unsettled="the mail log shows nothing",
                              writer_socket=str(sock))  # fmt: skip
        [override] = [json.loads(line) for line in (run / "events.jsonl").read_bytes().splitlines()
                      if json.loads(line)["type"] == "unsettled_override"]  # fmt: skip
        assert (override["uid"], override["user"]) == (0, "root")
        assert override["reason"] == "the mail log shows nothing"


# Holds an exclusive flock on a file it may only read, until its stdin closes.
HOLD_LOCK = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def lock_held_by(account, path: Path) -> Iterator[None]:
    """``path`` flocked (through a read-only handle) by a process of ``account`` for the block."""
    holder = subprocess.Popen([python_for(account), "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, **account.popen_kwargs())  # fmt: skip
    assert holder.stdout is not None and holder.stderr is not None
    try:
        assert holder.stdout.readline() == b"held\n", holder.stderr.read()
        yield
    finally:
        holder.communicate(timeout=60)  # closes its stdin, which lets it go


def test_an_agent_that_locks_what_it_may_read_stops_no_call(users, shared_tmp):
    """Issue 55, case 2: ``flock`` works on a read-only handle, and the writer locked the ledger
    itself, which every reader may open: an agent that held it stopped every call of the run,
    for ever (the daemon's threads waited on it without a bound). The writer's locks are in a
    folder of its user's alone now, and a lock it cannot have in time makes a clear refusal."""
    from tests.writer import MESSAGE, outbox_lines

    _, agent = users
    with agents_run(users, shared_tmp, RECEIPTS_LOCK_WAIT_SECONDS="1") as (run, sock):
        first = committed(as_user(agent, "call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS),
                                  socket=sock))  # fmt: skip
        writers = run / ".writer"
        assert stat.S_IMODE(writers.stat().st_mode) == 0o700
        # A run made by an older writer has the folder open to all: the daemon closes it.
        writers.chmod(0o755)
        committed(as_user(agent, "call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS),
                          socket=sock))  # fmt: skip
        assert stat.S_IMODE(writers.stat().st_mode) == 0o700
        lock = writers / f"call-{first['call_id']}.lock"
        tried = script_as(agent, f"open({str(lock)!r}, 'rb')")
        assert "PermissionError" in tried.stderr, tried.stderr

        # The ledger and the outbox are the agent's to read: holding them stops nothing for ever.
        with lock_held_by(agent, run / "events.jsonl"):
            committed(as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(MESSAGE),
                              socket=sock))  # fmt: skip
        other = MESSAGE | {"body": "a second message"}
        with lock_held_by(agent, run / "outbox.jsonl"):  # the effect runs in the agent's process: its own wait
            busy = as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(other), socket=sock,
                           RECEIPTS_LOCK_WAIT_SECONDS="1")  # fmt: skip
        outcome = json.loads(busy.stdout)
        assert (
            busy.returncode == 3
            and outcome["status"] == "rejected"
            and "RECEIPTS_LOCK_WAIT_SECONDS" in outcome["error"]["message"]
        ), busy
        assert len(outbox_lines(run)) == 1, "the busy outbox took nothing"

        # A call's own lock held past the wait (a writer stuck in it): busy, said, nothing written;
        # the call is committed, so the exit says done (5), never "nothing was done" (1).
        before = records_digest(run)
        with lock_held_by(users[0], lock):
            busy = as_user(agent, "call", str(run), "--tool", "write_file", "--args", json.dumps(FILE_ARGS),
                           socket=sock)  # fmt: skip
        assert busy.returncode == 5 and b"RECEIPTS_LOCK_WAIT_SECONDS" in busy.stderr, busy.stderr
        assert json.loads(busy.stdout)["status"] == "committed"
        assert records_digest(run) == before
        assert as_user(agent, "state", str(run), "retrying", "--attempts", "2", socket=sock).returncode == 0
        sent = committed(as_user(agent, "call", str(run), "--tool", "send_message", "--args", json.dumps(other),
                                 "--attempt", "2", socket=sock))  # fmt: skip
        assert sent["status"] == "committed" and len(outbox_lines(run)) == 2
