"""Reads for the pages: plain functions with keyword-only arguments.

Each returns rows or small dataclasses and runs a fixed number of queries,
whatever the size of the run: lists are paginated by the caller and
per-row facts are fetched for one page at a time with grouped queries.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shlex
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlencode

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext, ngettext_lazy, pgettext

from evidence.lib import hosts, stats
from evidence.lib.stats import RunSummary
from evidence.models import (
    AuditEntry,
    Call,
    Confirmation,
    Event,
    EventTally,
    Finding,
    HumanDecision,
    Run,
    Submission,
    with_run,
)
from evidence.review import host_decisions, triage
from evidence.words import i18n
from receipts import doubt, protocol, recovery, states
from receipts.builtin_tools import BUILTIN_ADAPTERS
from receipts.findings import DIGEST_CODES, ERROR, WARNING
from receipts.recovery import reservation_resume

STALE_CODES = ("stale_reservation", "stale_call")
HEX_RE = re.compile(r"[0-9a-f]{4,64}")


def prefix_upper_bound(prefix: str) -> str:
    """The smallest string greater than every string that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def calls_with_prefix(*, prefix: str) -> QuerySet[Call]:
    """Calls whose call_id starts with ``prefix``, as a range scan on the call_id index.

    ``LIKE 'abc%'`` cannot use an index on SQLite (it is case-insensitive
    there); ``call_id >= 'abc' AND call_id < 'abd'`` can, on both databases.
    """
    if not prefix:
        return Call.objects.none()
    return Call.objects.filter(call_id__gte=prefix, call_id__lt=prefix_upper_bound(prefix))


# --- runs ------------------------------------------------------------------


def runs_list(*, state: str = "", attention: bool = False) -> QuerySet[Run]:
    """Runs in ``state``; ``attention``: those with open findings or calls in doubt (as counted
    at import time). ``listings.runs`` gives their order."""
    runs = Run.objects.all()
    if state:
        runs = runs.filter(state=state)
    if attention:
        runs = runs.filter(needs_attention=True)
    return runs


@dataclasses.dataclass(frozen=True)
class RunFacets:
    """How many runs there are by state and by whether they need attention: the runs list's
    filters and counts, from one grouped query over the runs (a row a run, never an event)."""

    counts: dict[tuple[str, bool], int]

    @property
    def states(self) -> list[str]:
        return sorted({state for state, _ in self.counts})

    @property
    def runs(self) -> int:
        return sum(self.counts.values())

    @property
    def attention(self) -> int:
        return self.total(attention=True)

    def total(self, *, state: str = "", attention: bool = False) -> int:
        return sum(n for (s, needs), n in self.counts.items() if (not state or s == state) and (needs or not attention))


def run_facets() -> RunFacets:
    rows = Run.objects.values_list("state", "needs_attention").annotate(n=Count("id")).order_by()
    return RunFacets({(state, needs): count for state, needs, count in rows})


def run_summaries(*, runs: Iterable[Run]) -> dict[int, RunSummary]:
    """Each run's summary as its last import stored it: no query."""
    return {run.pk: RunSummary.of(run) for run in runs}


@dataclasses.dataclass(frozen=True)
class Target:
    """Something a person can open: a run, a call, or a submission in its run."""

    kind: str  # "run", "call" or "submission"
    run_id: str
    key: str = ""  # the call_id or the client_submission_id
    label: str = ""


def search(*, query: str, limit: int = 20) -> list[Target]:
    """What a query names: run ids (whole or in part), call_ids by prefix (hex, any case),
    client_submission_ids and task ids; at most ``limit`` of each, each with its context."""
    query = query.strip()
    if not query:
        return []
    matches = []
    runs = Run.objects.filter(run_id__icontains=query).order_by("run_id")
    for run_id, state, events in runs.values_list("run_id", "state", "event_count")[:limit]:
        label = format_html(
            _("run {run_id} ({state}, {events} events)"),
            run_id=_data(run_id),
            state=_data_word(state) if state else _("no state"),
            events=events,
        )
        matches.append(Target("run", run_id, label=label))
    prefix = query.lower()
    if HEX_RE.fullmatch(prefix):
        calls = calls_with_prefix(prefix=prefix).values_list("run__run_id", "call_id", "status", "tool")
        for run_id, call_id, status, tool in calls[:limit]:
            label = format_html(
                _("call {call_id}… ({status} {tool})"),
                call_id=_data(call_id[:16]),
                status=_data_word(status) if status else _("no receipt"),
                tool=_data(tool),
            )
            matches.append(Target("call", run_id, call_id, label))
    submissions = Submission.objects.filter(Q(client_submission_id=query) | Q(task_id__iexact=query))
    fields = ("run__run_id", "client_submission_id", "task_id", "state")
    for run_id, submission_id, task_id, state in submissions.values_list(*fields)[:limit]:
        label = format_html(
            _("submission {submission_id} → {task_id} ({state}) in {run_id}"),
            submission_id=_data(submission_id),
            task_id=_data(task_id) if task_id else _("no task"),
            state=_data_word(state),
            run_id=_data(run_id),
        )
        matches.append(Target("submission", run_id, submission_id, label))
    if not matches:
        matches += _calls_naming(query, limit=limit)
    return matches


# What a person types that no key holds (a recipient's address, a file's path) is looked for in
# the arguments of the newest calls only: a range of the primary key, read once per search (not
# per keystroke: the box is a form). A call older than that is found by its run or call_id.
ARGUMENTS_SCANNED = 100_000


def _calls_naming(query: str, *, limit: int) -> list[Target]:
    """The newest calls (of the last ``ARGUMENTS_SCANNED``) whose arguments contain ``query``,
    any case: at most ``limit``."""
    newest = Call.objects.aggregate(newest=Max("pk"))["newest"]
    if newest is None:
        return []
    calls = Call.objects.filter(pk__gt=newest - ARGUMENTS_SCANNED, args__icontains=query).order_by("-pk")
    matches = []
    for run_id, call_id, status, tool in calls.values_list("run__run_id", "call_id", "status", "tool")[:limit]:
        label = format_html(
            _("call {call_id}… ({status} {tool}) in {run_id}: its arguments name {query}"),
            call_id=_data(call_id[:16]),
            status=_data_word(status) if status else _("no receipt"),
            tool=_data(tool),
            run_id=_data(run_id),
            query=_data(query),
        )
        matches.append(Target("call", run_id, call_id, label))
    return matches


def _data(value: object) -> SafeString:
    """A value a record holds, inside a sentence of the page: no translator touches it."""
    return format_html('<span translate="no">{}</span>', value)


def _data_word(value: str) -> SafeString | str:
    """A protocol word in the reader's language; a value nobody foresaw as data."""
    return i18n.word(value) if value in i18n.WORDS else _data(value)


# --- one run ---------------------------------------------------------------


def call_identity(*, call: Call, run: Run) -> protocol.IdentityCheck:
    """The protocol's identity check over the receipt as it was imported (no file is read).

    A run whose bodies were stripped keeps the verdict its import made: the args
    are digests now, and a call_id cannot be recomputed from them.
    """
    if run.bodies_stripped_at is not None:
        inputs = {
            "identity": call.identity or protocol.IDENTITY_V1,
            "contract_sha256": call.contract_sha256 or run.contract_sha256,
            "attempt": call.attempt,
            "tool": call.tool,
            "tool_version": call.tool_version or None,
        }
        return protocol.IdentityCheck(call.verification, call.recomputed_call_id, inputs)
    receipt = {
        "call_id": call.declared_call_id,
        "attempt": call.attempt,
        "tool": call.tool,
        "args": call.args,
    }
    # The reader stores an absent field as "": absent again here, as in the file.
    for name in ("identity", "contract_sha256", "tool_version", "input_sha256"):
        if getattr(call, name):
            receipt[name] = getattr(call, name)
    return protocol.check_receipt_identity(receipt, call_id=call.call_id, contract_sha256=run.contract_sha256 or None)


def run_calls(*, run: Run) -> QuerySet[Call]:
    """The run's calls by call_id, each with ``settled_by``: who settled it, on the dashboard or
    with the writer's command line, and ``settled_on_host``: the host it was settled on when no
    decision made on the dashboard did (four look-ups a row, on their (run, call_id) keys)."""
    calls = Call.objects.filter(run=run).annotate(settled_by=settled_by(), settled_on_host=settled_on_host())
    return calls.order_by("call_id")


def settled_by() -> Coalesce:
    """Who decided a call: the person's decision on the dashboard, else a valid confirmation's actor.
    A decision the run directory refused settled nothing: whoever's decision stood there did."""
    same_call = {"run": OuterRef("run"), "call_id": OuterRef("call_id")}
    decided = HumanDecision.objects.filter(**same_call, undeliverable="").values("actor")[:1]
    confirmed = Confirmation.objects.filter(**same_call, valid=True).values("actor")[:1]
    return Coalesce(Subquery(decided), Subquery(confirmed), Value(""), output_field=TextField())


def settled_on_host() -> Case:
    """Where a call's settlement was made when it was not on the dashboard: the host whose file
    settled it (``Confirmation.made_on_host``), "" when a person's decision here did."""
    same_call = {"run": OuterRef("run"), "call_id": OuterRef("call_id")}
    decided = HumanDecision.objects.filter(**same_call, undeliverable="")
    confirmed = Confirmation.objects.filter(**same_call, valid=True).values("made_on_host")[:1]
    return Case(
        When(Exists(decided), then=Value("")),
        default=Coalesce(Subquery(confirmed), Value("")),
        output_field=TextField(),
    )


def run_submissions(*, run: Run, client_submission_id: str = "") -> QuerySet[Submission]:
    submissions = Submission.objects.filter(run=run).order_by("client_submission_id")
    if client_submission_id:
        submissions = submissions.filter(client_submission_id=client_submission_id)
    return submissions


def run_open_findings(*, run: Run, limit: int = 200) -> QuerySet[Finding]:
    return run.findings.filter(closed_at__isnull=True).order_by("code", "subject")[:limit]


@dataclasses.dataclass
class CallDetail:
    identity: protocol.IdentityCheck | None  # None when the ledger names a call with no receipt
    events: list[Event]
    confirmation: Confirmation | None
    findings: list[Finding]
    decision: HumanDecision | None  # a person's decision made on the dashboard

    @property
    def settled_by(self) -> str:
        """Who settled the call: on the dashboard, else with the writer's command line (``settled_by``)."""
        if self.decision is not None and not self.decision.undeliverable:
            return self.decision.actor
        return self.confirmation.actor if self.confirmation is not None and self.confirmation.valid else ""

    @property
    def settled_on_host(self) -> str:
        """The host whose file settled the call, when no decision made on the dashboard did
        (``settled_on_host``): its name is the host's word, not a dashboard account's."""
        if self.decision is not None and not self.decision.undeliverable:
            return ""
        return self.confirmation.made_on_host if self.confirmation is not None and self.confirmation.valid else ""


@dataclasses.dataclass(frozen=True)
class HostDecision:
    """A call settled by a file no decision made on the dashboard matches (``host_decisions``)."""

    host: str  # where it was made, as the import found it
    name: str  # the name its file gives: the host's word, not a dashboard account
    audit: AuditEntry | None  # the entry the import wrote of it
    item: Finding | None  # its inbox item, acknowledged or not; None in a run signed with a trusted key


def host_decision(*, run: Run, detail: CallDetail) -> HostDecision | None:
    """Where a call's settlement was made, when not on the dashboard: one query, for such a call only."""
    confirmation = detail.confirmation
    if not detail.settled_on_host or confirmation is None:
        return None
    entries = AuditEntry.objects.filter(run=run, action=AuditEntry.DECISION_MADE_ON_HOST, subject=confirmation.call_id)
    audit = entries.filter(reason__endswith=confirmation.confirmation_id).order_by("-at", "-id").first()
    subject = host_decisions.finding_subject(confirmation.call_id, confirmation.confirmation_id)
    item = next((f for f in detail.findings if f.code == host_decisions.CODE and f.subject == subject), None)
    return HostDecision(detail.settled_on_host, confirmation.actor, audit, item)


def call_detail(*, run: Run, call: Call, event_limit: int = 200) -> CallDetail:
    """What the call page shows beside the receipt: five queries."""
    return CallDetail(
        identity=call_identity(call=call, run=run) if call.receipt_present else None,
        events=list(Event.objects.filter(run=run, call_id=call.call_id).order_by("seq")[:event_limit]),
        confirmation=Confirmation.objects.filter(run=run, call_id=call.call_id).first(),
        findings=list(run.findings.filter(call_id=call.call_id, closed_at__isnull=True).order_by("code")),
        decision=HumanDecision.objects.filter(run=run, call_id=call.call_id).select_related("user").first(),
    )


@dataclasses.dataclass(frozen=True)
class AlteredField:
    """One input of a receipt's identity whose stored value is not the one recomputed."""

    name: str
    stored: str
    recomputed: str


def altered_fields(*, call: Call) -> list[AlteredField]:
    """What does not match in a receipt that fails its identity check, as the import stored it."""
    fields = []
    if call.recomputed_call_id and call.declared_call_id != call.recomputed_call_id:
        fields.append(AlteredField("call_id", call.declared_call_id, call.recomputed_call_id))
    if call.input_sha256 and call.recomputed_input_sha256 and call.input_sha256 != call.recomputed_input_sha256:
        fields.append(AlteredField(_("input digest (input_sha256)"), call.input_sha256, call.recomputed_input_sha256))
    return fields


def unproven_calls(*, run: Run, events: Iterable[Event]) -> dict[str, str]:
    """Of the calls these events' receipts name, those whose receipt fails its identity check,
    with the status a page shows for them: their ledger events say what the receipt said, which
    proves nothing. One query on the (run, call_id) key for one page of a ledger; none for a run
    whose stored counts hold no such call."""
    summary = RunSummary.of(run)
    failing = {states.TAMPERED, states.DISPUTED}
    if not (set(summary.calls_by_status) & failing or set(summary.in_doubt_by_need) & set(stats.INVESTIGATE)):
        return {}
    call_ids = {event.call_id for event in events if event.type == "receipt" and event.call_id}
    rows = (
        Call.objects.filter(run=run, call_id__in=call_ids, receipt_present=True)
        .exclude(verification=protocol.VERIFIED)
        .values_list("call_id", "status", "verification", "decision")
    )
    return {
        call_id: recovery.shown_status(present=True, status=status, verification=verification, decision=decision)
        for call_id, status, verification, decision in rows
        if verification in protocol.SHOWN_FOR_VERDICT
    }


@dataclasses.dataclass(frozen=True)
class Need:
    """One line of what a run needs from a person, with the action that answers it."""

    severity: str  # error or warning, as the inbox says
    what: str  # "1 call in doubt"
    detail: str
    action: str  # the link's words
    url: str


# What each kind of call in doubt (``stats.need_of``) is called (a count of them), what waits,
# and its action.
NEED_WORDS = {
    "tampered": (ngettext_lazy("%(count)s receipt altered after it was written",
                               "%(count)s receipts altered after they were written", "count"),
                 gettext_lazy("it proves nothing: find out who changed it, then decide whether the call happened"),
                 gettext_lazy("Investigate")),
    "unverified": (ngettext_lazy("%(count)s receipt that cannot be checked",
                                 "%(count)s receipts that cannot be checked", "count"),
                   gettext_lazy("an input of its identity is missing: a person decides whether the call happened"),
                   gettext_lazy("Investigate")),
    "disputed": (ngettext_lazy("%(count)s commit its target does not show",
                               "%(count)s commits their targets do not show", "count"),
                 gettext_lazy("the writer refused to reuse it: a person decides whether it happened"),
                 gettext_lazy("Investigate")),
    "missing": (ngettext_lazy("%(count)s call without a receipt", "%(count)s calls without a receipt", "count"),
                gettext_lazy("the ledger names it but its receipt is missing: a person decides"),
                gettext_lazy("Investigate")),
    "confirm": (ngettext_lazy("%(count)s call in doubt", "%(count)s calls in doubt", "count"),
                gettext_lazy("a person decides whether it happened"), gettext_lazy("Settle")),
    "query": (ngettext_lazy("%(count)s call in doubt the runtime can check",
                            "%(count)s calls in doubt the runtime can check", "count"),
              gettext_lazy("resume the run: it will ask the target whether the effect happened"),
              gettext_lazy("How to resume")),
}  # fmt: skip


def run_needs(*, run: Run, summary: RunSummary) -> list[Need]:
    """What the run needs from a person, most serious first, from its stored counts: calls in
    doubt by what they wait for, stale reservations, conflicts, other open findings. A kind with
    one call links to it (one query on the (run, decision, call_id) index); more, to the inbox."""
    needs = []
    counted = 0
    for kind in stats.NEEDS:
        count = summary.in_doubt_by_need.get(kind, 0)
        if not count:
            continue
        counted += count
        counted_words, detail, action = NEED_WORDS[kind]
        severity = WARNING if kind == "query" else ERROR
        url = _one_call_url(run, kind) if count == 1 else ""
        if url and kind == "query":
            url += "#resume-how"  # the call page's command that resumes it
        if not url:
            inbox_kind = kind if kind in (states.TAMPERED, states.DISPUTED) else states.IN_DOUBT
            url = f"{reverse('inbox')}?{urlencode({'run': run.run_id, 'kind': inbox_kind})}"
        needs.append(Need(severity, str(counted_words % {"count": count}), str(detail), str(action), url))
    if summary.in_doubt > counted:  # a summary stored before these counts were kept
        count = summary.in_doubt - counted
        url = f"{reverse('inbox')}?{urlencode({'run': run.run_id})}"
        in_doubt = ngettext("%(count)s call in doubt", "%(count)s calls in doubt", count) % {"count": count}
        needs.append(Need(ERROR, in_doubt, str(NEED_WORDS["confirm"][1]), pgettext("action", "Open"), url))
    findings = dict(summary.findings_by_code)
    if stale := findings.pop("stale_reservation", 0):
        needs.append(Need(WARNING,
                          ngettext("%(count)s stale reservation", "%(count)s stale reservations", stale)
                          % {"count": stale},
                          _("a task submission reserved and never finished: a resume finishes it or stops"),
                          _("Look at the reservations"), reverse("reservations")))  # fmt: skip
    if conflicts := findings.pop("submission_conflict", 0):
        url = f"{reverse('findings')}?{urlencode({'code': 'submission_conflict', 'run': run.run_id})}"
        needs.append(Need(WARNING,
                          ngettext("%(count)s submission conflict", "%(count)s submission conflicts", conflicts)
                          % {"count": conflicts},
                          _("one client_submission_id, two requests: no second task was written"),
                          _("Look at the conflict"), url))  # fmt: skip
    if summary.in_doubt:
        # Why those calls are in doubt: the lines above are the problems, these their evidence.
        findings = {code: n for code, n in findings.items() if code not in CALL_DOUBT_CODES}
    if others := sum(findings.values()):
        needs.append(Need(ERROR if set(findings) & set(DIGEST_CODES) else WARNING,
                          ngettext("%(count)s open finding", "%(count)s open findings", others) % {"count": others},
                          format_html_join(", ", "<code>{}</code>", ((code,) for code in sorted(findings))),
                          _("Look at the findings"), "#findings"))  # fmt: skip
    return needs


# The findings that say why a call is in doubt (a receipt that fails its check, is missing or
# stale): on the run page the call in doubt is the line, not each of its findings.
CALL_DOUBT_CODES = frozenset({
    "identity_mismatch", "identity_unverifiable", "contract_mismatch", "input_digest_mismatch", "effect_not_shown",
    "missing_receipt", "stale_call", "legacy_status", "invalid_status",
})  # fmt: skip


def _one_call_url(run: Run, kind: str) -> str:
    """The page of the run's one call in doubt of this kind ("" when it is not found)."""
    calls = Call.objects.filter(run=run, decision="query" if kind == "query" else "confirm")
    if kind in ("confirm", "query"):
        calls = calls.filter(receipt_present=True, verification=protocol.VERIFIED)
    elif kind == "missing":
        calls = calls.filter(receipt_present=False)
    else:
        calls = calls.filter(receipt_present=True, verification=VERIFICATION_OF[kind])
    call_id = calls.order_by("call_id").values_list("call_id", flat=True).first()
    return reverse("call", args=[run.run_id, call_id]) if call_id else ""


VERIFICATION_OF = {shown: verification for verification, shown in protocol.SHOWN_FOR_VERDICT.items()}


@dataclasses.dataclass
class DoubtPanel:
    """What a person reads before settling a call in doubt."""

    description: str  # what the call was meant to do (in the reader's language: evidence.words.doubt_text)
    evidence: doubt.Evidence | None  # what the target's side shows (None: nothing can look)
    reading: doubt.Reading | None  # what the evidence most likely means (None: it does not say)
    facts: tuple[str, ...]  # the evidence's facts as the page shows them (data, but for the dashboard's own)
    confirmation_file: str  # what the form would write, for an operator who settles by hand
    command: str  # the same, with the writer's command line


def doubt_panel(*, run: Run, call: Call) -> DoubtPanel:
    """The call in plain words and the target's evidence (read from the run directory, bounded)."""
    template = {
        "schema": protocol.CONFIRMATION_SCHEMA,
        "call_id": call.call_id,
        "resolution": "committed or rejected",
        "reason": "what you checked",
        "actor": "your name",
        "confirmed_at": "now, RFC 3339 UTC",
        "receipt_sha256": call.file_sha256,
        "confirmation_id": "sha256(canonical_json({call_id, resolution, receipt_sha256}))",
    }
    command = (
        f"python -m receipts confirm {shlex.quote(run.path)} {call.call_id} --resolution committed "
        f"--reason 'what you checked' --actor \"$USER\" --receipt-sha256 {call.file_sha256}"
    )
    from evidence.words import doubt_text  # the panel's sentences in the reader's language

    if hosts.owns(run):
        evidence = doubt.evidence_for(Path(run.path), call.tool, call.args, call.call_id, BUILTIN_ADAPTERS)
        facts = doubt_text.facts(evidence)
    else:
        evidence = doubt.Evidence(doubt.UNCLEAR, (f"the run's files are on host {run.host}: its target is read there",))
        facts = (doubt_text.elsewhere(run.host),)
    return DoubtPanel(
        description=doubt_text.description(call.tool, call.args),
        evidence=evidence,
        # An altered receipt's args are not what ran: its evidence is compared with them, and suggests nothing.
        reading=(
            doubt_text.reading(call.tool, evidence, queried=call.decision == "query")
            if call.verification == protocol.VERIFIED
            else None
        ),
        facts=facts,
        confirmation_file=json.dumps(template, indent=2),
        command=command,
    )


def by_actor(actor: str) -> Q:
    """The audit's "who" filter: a name (as it was then), or a person's id "#12", which finds them
    under every name they had and no one else who had one of those names."""
    person_id = actor.strip().removeprefix("#")
    if actor.strip().startswith("#") and person_id.isdigit() and len(person_id) <= 18:
        return Q(user_id=int(person_id))
    return Q(actor=actor)


def audit_entries(*, run_id: str = "", actor: str = "") -> QuerySet[AuditEntry]:
    """Legal holds and retention actions, newest first (the audit, beside the decisions)."""
    entries = with_run(AuditEntry.objects.all()).select_related("user")
    if run_id:
        entries = entries.filter(run__run_id=run_id)
    if actor:
        entries = entries.filter(by_actor(actor))
    return entries.order_by("-at", "-id")


def triage_history(*, finding: Finding, limit: int = 20) -> list[AuditEntry]:
    """A finding's triage acts, newest first: the audit's entries about it (on the (run, at) index)."""
    assert finding.run_id is not None  # only a run's findings are triaged
    entries = AuditEntry.objects.filter(run_id=finding.run_id, subject=finding.label).select_related("user")
    return list(entries.order_by("-at", "-id")[:limit])


def human_decisions(*, run_id: str = "", actor: str = "", resolution: str = "") -> QuerySet[HumanDecision]:
    """Every decision a person made on the dashboard, newest first (the audit)."""
    decisions = with_run(HumanDecision.objects.all()).select_related("user")
    if run_id:
        decisions = decisions.filter(run__run_id=run_id)
    if actor:
        decisions = decisions.filter(by_actor(actor))
    if resolution:
        decisions = decisions.filter(resolution=resolution)
    return decisions.order_by("-decided_at", "-id")


def run_events(*, run: Run, event_type: str = "") -> QuerySet[Event]:
    events = Event.objects.filter(run=run)
    if event_type:
        events = events.filter(type=event_type)
    return events.order_by("-seq")


def event_types(*, run: Run) -> list[str]:
    return sorted(run.event_type_counts)


def reuse_counts(*, run: Run, call_ids: Iterable[str]) -> dict[str, int]:
    """How many times each call was reused (``call_reused`` events): one query."""
    rows = (
        Event.objects.filter(run=run, type="call_reused", call_id__in=list(call_ids))
        .values_list("call_id")
        .annotate(n=Count("id"))
    )
    return dict(rows)


def disposition_history(*, run: Run, submission_ids: Iterable[str]) -> dict[str, list[Event]]:
    """Every ``submission`` event of these submissions, in ledger order: one query."""
    history: dict[str, list[Event]] = defaultdict(list)
    events = Event.objects.filter(run=run, type="submission", client_submission_id__in=list(submission_ids)).order_by(
        "seq"
    )
    for event in events:
        history[event.client_submission_id].append(event)
    return history


def legacy_submissions(*, run: Run) -> QuerySet[Event]:
    """Task creations without a client_submission_id: no record, only their events."""
    return Event.objects.filter(run=run, type="submission", client_submission_id="").order_by("seq")


def events_histogram(*, run: Run, buckets: int = 24) -> list[tuple[dt.datetime, int]]:
    """Events per equal slice of the run's time span, from the per-minute tallies: one
    query over at most one row per minute of the run, whatever its number of events."""
    if run.first_event_at is None or run.last_event_at is None:
        return []
    first = stats.minute_of(run.first_event_at)
    span = max(stats.minute_of(run.last_event_at) - first + 1, 1)
    width = dt.timedelta(minutes=span) / buckets
    start = stats.EPOCH + dt.timedelta(minutes=first)
    counts = [0] * buckets
    for minute, count in EventTally.objects.filter(run=run).values_list("minute", "count"):
        counts[min(buckets - 1, max(0, (minute - first) * buckets // span))] += count
    return [(start + width * index, counts[index]) for index in range(buckets)]


def decision_counts(*, run: Run) -> list[tuple[str, int]]:
    """How many calls get each recovery decision, most urgent first (as counted at import)."""
    counts = RunSummary.of(run).decisions
    return [(decision, counts[decision]) for decision in protocol.DECISIONS if counts.get(decision)]


def calls_by_decision(*, run: Run, decision: str = "") -> QuerySet[Call]:
    """The run's calls, most urgent decision first (a person's call before a reuse)."""
    rank = Case(*(When(decision=d, then=Value(i)) for i, d in enumerate(protocol.DECISIONS)), default=Value(99))
    calls = Call.objects.filter(run=run)
    if decision:
        calls = calls.filter(decision=decision)
    return calls.annotate(rank=rank).order_by("rank", "call_id")


def decision_segments(*, run: Run, decision: str = "") -> list[QuerySet[Call]]:
    """The same calls as ``calls_by_decision``, as one call_id-ordered list per decision (most
    urgent first) that keyset pagination walks on the (run, decision, call_id) index."""
    counts = dict(decision_counts(run=run))
    chosen = [decision] if decision else [d for d in protocol.DECISIONS if counts.get(d)]
    return [Call.objects.filter(run=run, decision=d) for d in chosen]


# --- findings and reservations --------------------------------------------


def open_findings(
    *, code: str = "", run_id: str = "", severity: str = "", view: str = triage.OPEN, now: dt.datetime | None = None
) -> tuple[QuerySet[Finding], QuerySet[Finding]]:
    """Open findings of ``view`` (``triage.view_filter``): (the digest mismatches, every other),
    each to be read by code and id. A runs root's findings have no run to triage: open only."""
    findings = with_run(Finding.objects.filter(triage.view_filter(view, now or protocol.utc_now()),
                                               closed_at__isnull=True))  # fmt: skip
    if code:
        findings = findings.filter(code=code)
    if run_id:
        findings = findings.filter(run__run_id=run_id)
    if severity:
        findings = findings.filter(severity=severity)
    return findings.filter(code__in=DIGEST_CODES), findings.exclude(code__in=DIGEST_CODES)


def finding_counts() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Open findings by code: (digest mismatches, the others), each ``[(code, count)]``."""
    counts = Counter(dict(Finding.objects.filter(closed_at__isnull=True).values_list("code").annotate(n=Count("id"))))
    digest = [(code, counts[code]) for code in DIGEST_CODES if counts.get(code)]
    others = sorted((code, count) for code, count in counts.items() if code not in DIGEST_CODES)
    return digest, others


@dataclasses.dataclass
class StaleItem:
    kind: str  # "reservation" or "call"
    run_id: str
    subject: str  # the client_submission_id or the call_id
    state: str
    since: dt.datetime | None
    task_present: bool | None
    digests_match: bool | None
    resume: str
    finding_id: int | None = None
    triage: str = ""  # its triage (evidence.review.triage.FIELDS), "" when open
    triage_by: str = ""
    triage_at: dt.datetime | None = None
    triage_reason: str = ""
    triage_until: dt.datetime | None = None
    triage_on_change: bool = False
    in_doubt: bool = False  # a call waiting for its target or a person: the page offers to settle it


def stale_findings(*, view: str = triage.OPEN, now: dt.datetime | None = None) -> QuerySet[Finding]:
    """The open stale_reservation and stale_call findings of ``view`` (the stale page reads them
    by key)."""
    rows = Finding.objects.filter(closed_at__isnull=True, code__in=STALE_CODES, run__isnull=False)
    return rows.filter(triage.view_filter(view, now or protocol.utc_now()))


def with_reservation_since(findings: QuerySet[Finding]) -> QuerySet[Finding]:
    """The findings, each stale_reservation with ``reservation_since``: since when its reservation
    has been in its state, as the reader judges it stale (its record's last update, else its
    reservation). The finding was seen at an import, maybe long after. A subquery per row of
    the page, not one query more."""
    reservation = Submission.objects.filter(run=OuterRef("run"), record_key=OuterRef("record_key"))
    since = reservation.annotate(since=Coalesce("updated_at", "reserved_at")).values("since")[:1]
    return findings.annotate(
        reservation_since=Case(
            When(code="stale_reservation", then=Subquery(since)), default=None, output_field=DateTimeField()
        )
    )


def stale_items(findings: Iterable[Finding], now: dt.datetime | None = None) -> list[StaleItem]:
    """What each stale finding is about, with what a resume would do: two queries a page,
    for the submissions and the calls its findings name."""
    findings = list(findings)
    runs = dict(Run.objects.filter(pk__in={f.run_id for f in findings}).values_list("pk", "run_id"))
    keys = {finding.record_key for finding in findings if finding.code == "stale_reservation"}
    fields = ("run_id", "record_key", "client_submission_id", "state", "updated_at", "reserved_at", "task_present")
    submissions = {
        (row[0], row[1]): row
        for row in Submission.objects.filter(record_key__in=keys).values_list(*fields, "task_matches")
    }
    call_ids = {finding.call_id for finding in findings if finding.code == "stale_call"}
    fields = ("run_id", "call_id", "status", "updated_at", "created_at", "decision", "decision_reason")
    calls = {(row[0], row[1]): row for row in Call.objects.filter(call_id__in=call_ids).values_list(*fields)}
    items = []
    for finding in triage.as_shown(findings, now or protocol.utc_now()):
        assert finding.run_id is not None  # a stale finding has a run (stale_findings)
        run_id = runs[finding.run_id]
        triaged = {"finding_id": finding.pk} | {name: getattr(finding, name) for name in triage.FIELDS}
        if finding.code == "stale_reservation":
            submission = submissions.get((finding.run_id, finding.record_key))
            if submission is not None:
                items.append(dataclasses.replace(_stale_reservation(run_id, *submission[2:]), **triaged))
        elif (call := calls.get((finding.run_id, finding.call_id))) is not None:
            _, _, status, updated_at, created_at, decision, reason = call
            since = updated_at or created_at
            item = StaleItem(
                "call", run_id, finding.call_id, status, since, None, None, f"{decision}: {reason}",
                in_doubt=protocol.in_doubt(decision),
            )  # fmt: skip
            items.append(dataclasses.replace(item, **triaged))
    return items


TRIAGED = ("finding_id", "triage", "triage_by", "triage_at", "triage_reason", "triage_until", "triage_on_change")


def _stale_reservation(
    run_id: str,
    client_submission_id: str,
    state: str,
    updated_at: dt.datetime | None,
    reserved_at: dt.datetime | None,
    task_present: bool,
    task_matches: bool,
) -> StaleItem:
    resume = reservation_resume(state=state, task_present=task_present, digests_match=task_matches)
    return StaleItem(
        "reservation",
        run_id,
        client_submission_id,
        state,
        updated_at or reserved_at,
        task_present,
        task_matches if task_present else None,
        resume,
    )
