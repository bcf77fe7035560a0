"""Ticket trackers for the conformance kit: one that keeps the promises, others broken on purpose.

The tracker is a file in the run directory, ``tickets.jsonl``, one ticket a line
(``{"ticket", "key", "title"}``); ``count_tickets`` counts its lines, the kit's
``--counter``. Each broken tracker breaks one promise a runtime's retries rely on,
and tests/test_conformance.py checks that the kit names it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from receipts.tools import NOT_DONE, Rejected

TICKETS = "tickets.jsonl"


def count_tickets(run_dir: Path, args: Mapping[str, Any], call_id: str) -> int:
    """Every ticket in the run's tracker: the kit gives each check a run directory of its own."""
    return len(_tickets(Path(run_dir)))


def _tickets(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in (run_dir / TICKETS).read_text().splitlines()]
    except FileNotFoundError:
        return []


class Tickets:
    """Keeps the promises: the call_id is the tracker's idempotency key, and the query looks it up."""

    name = "file_ticket"
    version = "1.0.0"
    example_args: ClassVar[dict[str, str]] = {"title": "Fix login"}

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args.get("title"), str) or set(args) != {"title"}:
            raise Rejected("args must be {'title': text}")
        return {"title": args["title"].strip()}

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        existing = self._by_key(run_dir, call_id)
        return existing if existing is not None else self._file(run_dir, args, call_id)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        existing = self._by_key(run_dir, call_id)
        return existing if existing is not None else NOT_DONE

    def _by_key(self, run_dir: Path, call_id: str) -> dict[str, Any] | None:
        found = [ticket for ticket in _tickets(Path(run_dir)) if ticket["key"] == call_id]
        return {"ticket": found[0]["ticket"]} if found else None

    def _file(self, run_dir: Path, args: Mapping[str, Any], key: str | None) -> dict[str, Any]:
        ticket = f"T-{os.urandom(4).hex()}"
        line = json.dumps({"ticket": ticket, "key": key, "title": args["title"]}) + "\n"
        fd = os.open(Path(run_dir) / TICKETS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"ticket": ticket}


class ReExecutesOnResume(Tickets):
    """Broken: asked about a call in doubt, it files the ticket again and answers with the new one."""

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        return self._file(run_dir, args, call_id)


class IgnoresCallId(Tickets):
    """Broken: no idempotency key, so a retry of the same call_id files a second ticket. Its query
    finds a ticket by its title, which is enough for the writer's resumes."""

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        return self._file(run_dir, args, None)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        found = [ticket for ticket in _tickets(Path(run_dir)) if ticket["title"] == args["title"]]
        return {"ticket": found[0]["ticket"]} if found else NOT_DONE


class NotDoneWithoutEvidence(Tickets):
    """Broken: answers "did not happen" without looking (its execute dedupes, so nothing doubles)."""

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        return NOT_DONE


class StampsTheArgs(Tickets):
    """Broken: normalising stamps the args with the process's id, so each process computes another call_id."""

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"title": str(args["title"]).strip(), "process": os.getpid()}


class Blind:
    """Files tickets the kit cannot count: no query, no evidence, and no example args."""

    name = "blind_ticket"
    version = "1.0.0"

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return dict(args)

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        return Tickets()._file(run_dir, args, call_id)


def tickets_factory() -> Tickets:
    """A zero-argument factory, as an adapter with a client to build is named to the kit."""
    return Tickets()
