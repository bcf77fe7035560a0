"""The ledger under many processes appending at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from receipts.demo import writer_env
from tests.ledger import read_ledger

APPENDER = """
import sys
from pathlib import Path
from receipts.durable import append_event
for number in range(int(sys.argv[2])):
    append_event(Path(sys.argv[1]), "note", {"writer": sys.argv[3], "n": number})
"""


@pytest.mark.slow
def test_concurrent_appenders_get_seq_1_to_n_and_an_intact_chain(tmp_path):
    processes, appends = 8, 60
    children = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), str(appends), f"w{index}"], env=writer_env())
        for index in range(processes)
    ]
    assert [child.wait(timeout=120) for child in children] == [0] * processes
    events = read_ledger(tmp_path)  # asserts seq 1..N and every prev_sha256
    assert len(events) == processes * appends
    for index in range(processes):
        mine = [event["n"] for event in events if event["writer"] == f"w{index}"]
        assert mine == list(range(appends)), "each writer's events keep their order"
