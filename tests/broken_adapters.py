"""Ticket trackers for the conformance kit: one that keeps the promises, others broken on purpose.

The tracker is a file in the run directory, ``tickets.jsonl``, one ticket a line
(``{"ticket", "key", "call_id", "title", "filed"}``: ``key`` is what the tracker
deduplicates on, ``call_id`` the request that filed it); ``count_tickets`` counts
a call's tickets, the kit's ``--counter``. It refuses a title that starts with
``FAIL`` (``failing_args``), and is down in a process once the kit calls the
adapter's ``break_target()``. Each broken tracker breaks one promise a runtime's
retries rely on, and tests/test_conformance.py checks that the kit names it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from receipts import protocol
from receipts.tools import ABSENT, NOT_DONE, PRESENT, Evidence, Rejected

TICKETS = "tickets.jsonl"


def count_tickets(run_dir: Path, args: Mapping[str, Any], call_id: str) -> int:
    """The tickets the call ``call_id`` filed: the tracker records the request of each."""
    return sum(ticket["call_id"] == call_id for ticket in _tickets(Path(run_dir)))


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
    failing_args: ClassVar[dict[str, str] | None] = {"title": "FAIL: the tracker refuses this title"}
    down = False  # the tracker is down (in this process): every request to it fails

    def break_target(self) -> None:
        """The conformance kit's hook: from now on, in this process, the tracker is down."""
        self.down = True

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args.get("title"), str) or set(args) != {"title"}:
            raise Rejected("args must be {'title': text}")
        return {"title": args["title"].strip()}

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        existing = self._by_key(run_dir, call_id)
        return existing if existing is not None else self._file(run_dir, args, call_id, call_id)

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        existing = self._by_key(run_dir, call_id)
        if existing is None:
            return Evidence(ABSENT, (f"no ticket keyed {call_id}",))
        if result is not None and result != existing:
            return Evidence(ABSENT, (f"the ticket keyed {call_id} is {existing['ticket']}, not {result}",))
        return Evidence(PRESENT, (f"ticket {existing['ticket']} keyed {call_id}",))

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        existing = self._by_key(run_dir, call_id)
        return existing if existing is not None else NOT_DONE

    def _by_key(self, run_dir: Path, key: str) -> dict[str, Any] | None:
        if self.down:
            raise TrackerDown("the tracker is down: connection refused", kind="retryable")
        found = [ticket for ticket in _tickets(Path(run_dir)) if ticket["key"] == key]
        return {"ticket": found[0]["ticket"]} if found else None

    def _file(self, run_dir: Path, args: Mapping[str, Any], key: str | None, call_id: str) -> dict[str, Any]:
        if self.down:
            raise TrackerDown("the tracker is down: connection refused", kind="retryable")
        if args["title"].startswith("FAIL"):
            raise TrackerDown(f"the tracker refuses the title {args['title']!r}")
        ticket = f"T-{os.urandom(4).hex()}"
        line = json.dumps({"ticket": ticket, "key": key, "call_id": call_id, "title": args["title"],
                           "filed": time.time()}) + "\n"  # fmt: skip
        fd = os.open(Path(run_dir) / TICKETS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"ticket": ticket}


class TrackerDown(Rejected):
    """The tracker's own refusal: nothing was filed."""


class ReExecutesOnResume(Tickets):
    """Broken: asked about a call in doubt, it files the ticket again and answers with the new one."""

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        return self._file(run_dir, args, call_id, call_id)


class IgnoresCallId(Tickets):
    """Broken: no idempotency key, so a retry of the same call_id files a second ticket. Its query
    finds a ticket by its title, which is enough for the writer's resumes."""

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        return self._file(run_dir, args, None, call_id)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        found = [ticket for ticket in _tickets(Path(run_dir)) if ticket["title"] == args["title"]]
        return {"ticket": found[0]["ticket"]} if found else NOT_DONE

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        found = self.query(run_dir, args, call_id)
        if found is NOT_DONE or (result is not None and result != found):
            return Evidence(ABSENT, (f"no ticket titled {args['title']!r}" + (f" that is {result}" if result else ""),))
        return Evidence(PRESENT, (f"ticket {found['ticket']} titled {args['title']!r}",))


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
        return Tickets()._file(run_dir, args, call_id, call_id)


class FoundIfAnyTicket(Tickets):
    """Broken: its query says "done" when the tracker holds any ticket at all, not this call's."""

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        tickets = _tickets(Path(run_dir))
        return {"ticket": tickets[0]["ticket"]} if tickets else NOT_DONE


class KeyedOnAPrefix(Tickets):
    """Broken: the tracker keeps only the first 16 characters of a key (a short column), so two
    calls whose call_ids begin alike are one ticket."""

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        existing = self._by_key(run_dir, call_id[:16])
        return existing if existing is not None else self._file(run_dir, args, call_id[:16], call_id)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        existing = self._by_key(run_dir, call_id[:16])
        return existing if existing is not None else NOT_DONE

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        return super().evidence(run_dir, args, call_id[:16], result)


class PresentWithoutLooking(Tickets):
    """Broken: its evidence says "present" without looking at the tracker."""

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        return Evidence(PRESENT, ("the tracker surely has it",))


class SwallowsFailure(Tickets):
    """Broken: when the tracker fails, execute returns a result anyway (no ticket behind it)."""

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        try:
            return super().execute(run_dir, args, call_id)
        except TrackerDown:
            return {"ticket": None}


FORGETS_AFTER = 1.0  # seconds


class ForgetsKeys(Tickets):
    """Broken: the tracker forgets an idempotency key a second after filing it, as a service that
    keeps keys a day does, and the adapter declares no retention (it claims keys are kept for
    ever). The ticket itself stays, found by its call_id: the query and the evidence still see
    it, so only the kept key is at fault, however slowly the machine runs the other checks."""

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        fresh = [ticket for ticket in _tickets(Path(run_dir))
                 if ticket["key"] == call_id and time.time() - ticket["filed"] < FORGETS_AFTER]  # fmt: skip
        return {"ticket": fresh[0]["ticket"]} if fresh else self._file(run_dir, args, call_id, call_id)


class IgnoresItsRetention(Tickets):
    """Broken: it declares that the tracker forgets keys after an hour, and still answers
    NOT_DONE for a call begun longer ago than that that it cannot find."""

    key_retention = 3600.0


class NormalisesTwiceDifferently(Tickets):
    """Broken: normalising folds a run of spaces by one space each time, so "a   b" and its
    normalised "a  b" are two calls. The example, "Fix login", is stable."""

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"title": super().normalise(args)["title"].replace("  ", " ")}


class FindsByTitlePrefix(Tickets):
    """Broken: its query asks the tracker's search for the title, and the search matches the
    titles that begin with the words it is given (as a search box does); the first hit is taken
    for this call's ticket. Its execute dedupes by the key, and in a run of one call the first
    hit is the call's own: only a call whose title begins another's finds that other's ticket."""

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        hits = [ticket for ticket in _tickets(Path(run_dir)) if ticket["title"].startswith(args["title"])]
        return {"ticket": hits[0]["ticket"]} if hits else NOT_DONE


class KeyedByTheHour(Tickets):
    """Broken: the key it gives the tracker is the call_id stamped with the hour it is sent
    (read from the writer's clock, ``protocol.utc_now``), "so that a key is never reused
    another day". The same call_id an hour later is another key: a retry then, or a resume's
    query, finds nothing and files a second ticket. Within the hour every check passes."""

    def _key(self, call_id: str) -> str:
        return f"{call_id}@{protocol.utc_now():%Y-%m-%dT%H}"

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        existing = self._by_key(run_dir, self._key(call_id))
        return existing if existing is not None else self._file(run_dir, args, self._key(call_id), call_id)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> Any:
        existing = self._by_key(run_dir, self._key(call_id))
        return existing if existing is not None else NOT_DONE

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        return super().evidence(run_dir, args, self._key(call_id), result)


DEDUPE_INDEX = "dedupe.jsonl"
DEDUPE_LAG = 0.1  # seconds: less than a new process takes to start


class DedupeLags(Tickets):
    """Broken: it trusts the tracker's own dedupe by key, and the tracker dedupes against an
    index that takes a key in DEDUPE_LAG after the ticket is filed (an index refreshed
    asynchronously, a read replica). The same call_id again from a new process finds the
    first ticket; again at once in the same process, as a runtime retrying a lost answer at
    once does, it files a second. Its query and evidence read the ticket by key, up to date."""

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        try:
            lines = (Path(run_dir) / DEDUPE_INDEX).read_text().splitlines()
        except FileNotFoundError:
            lines = []
        now = time.time()
        seen = [entry for entry in map(json.loads, lines) if entry["key"] == call_id and entry["at"] <= now]
        return {"ticket": seen[0]["ticket"]} if seen else self._file(run_dir, args, call_id, call_id)

    def _file(self, run_dir: Path, args: Mapping[str, Any], key: str | None, call_id: str) -> dict[str, Any]:
        filed = super()._file(run_dir, args, key, call_id)
        entry = {"key": key, "ticket": filed["ticket"], "at": time.time() + DEDUPE_LAG}
        with (Path(run_dir) / DEDUPE_INDEX).open("a") as index:
            index.write(json.dumps(entry) + "\n")
        return filed


class SwallowsOutages(Tickets):
    """Broken: when the tracker is down, execute returns a result anyway (no ticket behind it),
    and its author named no args the tracker fails on (``failing_args`` is None)."""

    failing_args = None

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        try:
            return super().execute(run_dir, args, call_id)
        except TrackerDown:
            return {"ticket": None}


class UnbreakableTickets(Tickets):
    """Keeps the promises; its break_target() cannot break the tracker, and says so."""

    failing_args = None

    def break_target(self) -> None:
        raise RuntimeError("no test tracker here")


def tickets_factory() -> Tickets:
    """A zero-argument factory, as an adapter with a client to build is named to the kit."""
    return Tickets()


def unbuildable_factory() -> Tickets:
    """A factory whose client cannot be built (a setting missing): the kit says so in a line."""
    raise RuntimeError("TRACKER_URL is not set")


def _titles() -> Any:
    from hypothesis import strategies

    # Titles of words and runs of spaces: what a normalise that folds spaces gets wrong.
    words = strategies.lists(strategies.sampled_from(["fix", "login", " ", "  ", "é", "日本"]), min_size=1, max_size=8)
    return strategies.fixed_dictionaries({"title": words.map("".join)})


class DrawnTickets(Tickets):
    """Keeps the promises; its arg sets for the kit are drawn from a hypothesis strategy."""

    # Built when the kit asks, not when the module loads: the kit's children import this module
    # for every call they make, and hypothesis would double each one's start.
    @property
    def args_strategy(self) -> Any:
        return _titles()


class DrawnNormalisesTwiceDifferently(NormalisesTwiceDifferently):
    """Broken as its parent, caught on args drawn from its strategy."""

    @property
    def args_strategy(self) -> Any:
        return _titles()


class NotAStrategy(Tickets):
    args_strategy: ClassVar[list[str]] = ["Fix login"]
