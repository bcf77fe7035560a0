"""The writer's entry points that a writer daemon may serve: a run's init and state, and a task.

Each does the work in this process, or asks the daemon (``callproof serve``) whose socket it is
given or ``RECEIPTS_WRITER_SOCKET`` names; the daemon then writes, as this process would have.
Calls and decisions go the same way (``Executor``, ``confirm_call``), through ``daemon_socket``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol, runs, tasks
from receipts.client import writer_socket as writer_socket_from_env
from receipts.tasks import TaskResult


def daemon_socket(writer_socket: str | None) -> str | None:
    """The writer daemon's socket a request goes to: the one given, else ``RECEIPTS_WRITER_SOCKET``;
    ``""`` or ``None`` in the end: this process writes."""
    return (writer_socket if writer_socket is not None else writer_socket_from_env()) or None


def run_init(
    run_dir: Path,
    *,
    contract_sha256: str,
    attempts: int = 1,
    state: str = "running",
    identity: str = protocol.IDENTITY_V2,
    writer_socket: str | None = None,
) -> None:
    """``runs.run_init``, by the writer daemon when one serves this process."""
    served_by = daemon_socket(writer_socket)
    if served_by:
        from receipts import client

        client.request(served_by, "init", Path(run_dir), contract_sha256=contract_sha256, attempts=attempts,
                       state=state, identity=identity)  # fmt: skip
        return
    runs.run_init(Path(run_dir), contract_sha256=contract_sha256, attempts=attempts, state=state, identity=identity)


def run_set_state(
    run_dir: Path, *, state: str, attempts: int, override_unsettled: str | None = None, writer_socket: str | None = None
) -> None:
    """``runs.run_set_state``, by the writer daemon when one serves this process."""
    served_by = daemon_socket(writer_socket)
    if served_by:
        from receipts import client

        client.request(served_by, "set_state", Path(run_dir), state=state, attempts=attempts,
                       override_unsettled=override_unsettled)  # fmt: skip
        return
    runs.run_set_state(Path(run_dir), state=state, attempts=attempts, override_unsettled=override_unsettled)


def write_task(
    run_dir: Path,
    request: Mapping[str, Any],
    client_submission_id: str | None = None,
    *,
    writer_socket: str | None = None,
) -> TaskResult:
    """``tasks.write_task``, by the writer daemon when one serves this process."""
    served_by = daemon_socket(writer_socket)
    if served_by:
        from receipts import client

        result = client.request(served_by, "write_task", Path(run_dir), request=dict(request),
                                submission_id=client_submission_id)  # fmt: skip
        return TaskResult(**result)
    return tasks.write_task(Path(run_dir), request, client_submission_id)
