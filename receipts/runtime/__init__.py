"""The writer: tool calls through receipts, and a person's decision about a call in doubt.

Standard library only. A call's receipt is written ``prepared`` before the
effect and ``committed``, ``rejected`` or ``unknown`` after it; a committed
call is never executed twice, and nothing is called committed that the writer
cannot prove. A committed receipt is reused only with its evidence: it passes
its check (identity and outcome digest) and, where the adapter can look, the
target still shows that result. Run directories (``receipts.runs``), task
creation (``receipts.tasks``) and the tools (``receipts.tools``) are
re-exported here, as the interface docs name them.

The package's rooms, each importing only those above it:

- ``served``: ``run_init``, ``run_set_state`` and ``write_task``, in this process or by the
  writer daemon that serves it (``daemon_socket``);
- ``call_records``: a call's records as the writer reads them under its lock (its receipt, a
  person's decision, the lock file's note) and whether the target backs a commit;
- ``attempts``: the same intent at the run's other attempts, and the rule that one still in
  doubt stops a new call;
- ``executor``: ``Executor``, calls through receipts, and the ``CallOutcome`` it answers with;
- ``decisions``: ``confirm_call``, ``call_in_doubt``, ``ConfirmationRefused``.
"""

from __future__ import annotations

from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.durable import LockBusy, RecordingIncomplete, sweep_locks, sweep_temp_files
from receipts.outcomes import CallOutcome, ConfirmationRefused
from receipts.runs import (
    UnsettledCalls,
    next_attempt,
    recorded_identity,
    run_contract,
    run_identity,
    run_state,
    unsettled_calls,
)
from receipts.runtime.call_records import commit_problem, read_confirmation, read_receipt, receipt_was_installed
from receipts.runtime.decisions import call_in_doubt, confirm_call, refusal_text
from receipts.runtime.executor import Executor
from receipts.runtime.served import run_init, run_set_state, write_task
from receipts.tasks import TaskResult
from receipts.tools import NOT_DONE, Adapter, OutcomeUnknown, Rejected, SendMessage, WriteFile

__all__ = [
    "BUILTIN_ADAPTERS",
    "NOT_DONE",
    "Adapter",
    "CallOutcome",
    "ConfirmationRefused",
    "Executor",
    "LockBusy",
    "OutcomeUnknown",
    "RecordingIncomplete",
    "Rejected",
    "SendMessage",
    "TaskResult",
    "UnsettledCalls",
    "WriteFile",
    "call_in_doubt",
    "commit_problem",
    "confirm_call",
    "next_attempt",
    "read_confirmation",
    "read_receipt",
    "receipt_was_installed",
    "recorded_identity",
    "refusal_text",
    "run_contract",
    "run_identity",
    "run_init",
    "run_set_state",
    "run_state",
    "sweep_locks",
    "sweep_temp_files",
    "unsettled_calls",
    "write_task",
]
