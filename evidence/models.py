"""Rows imported from run directories. The importer is the only writer.

Unique constraints make a double import impossible, not merely unlikely:
run+call_id, run+seq, run+client_submission_id, run+code+subject. Those keys
lead with the run, so a foreign key to Run has no index of its own
(``db_index=False``): every index is paid for on each of a million inserts.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from receipts import findings, protocol, recovery
from receipts.protocol import EMPTY_SHA256, ZERO_HASH

# A run whose last event is older than this is shown as not live, and its page stops refreshing.
LIVE_WINDOW = dt.timedelta(minutes=10)
# A run whose files changed stays hot this long, finished or not: a writer between two calls, or
# one that has just finished, writes again soon (its last receipt, a sweep), and a person's
# decision written into it is read back by the next pass.
HOT_AFTER_CHANGE = dt.timedelta(minutes=10)
# Not finished and not found abandoned: a run that may still write, checked by every pass.
# "IN (false)", not "= false": SQLite's planner takes "NOT finished", Django's form of the
# latter, for no index's range, and would read every run.
ACTIVE = Q(finished__in=[False], abandoned_at__isnull=True)


# How a record keeps who acted: the user's primary key, never reused (PostgreSQL's sequences, SQLite's
# AUTOINCREMENT), so a person renamed, or removed and their name taken by a new account, is told
# apart from whoever has the name now. No constraint and nothing done on delete: the id stays when
# the account goes (a foreign key would set it null).
PERSON_ID: dict[str, Any] = {"on_delete": models.DO_NOTHING, "db_constraint": False}


class JSONTextField(models.TextField):
    """A JSON value kept as JSON text.

    PostgreSQL's ``jsonb`` refuses ``\u0000``, which JSON allows in any string
    (the writer can write one), and would re-order what was written; text keeps
    it as it came, on both databases. Only the search box reads inside one: a call's
    arguments, as text (``selectors.search``).
    """

    # For django-stubs: any JSON value goes in and comes out, not the text it is kept as.
    _pyi_private_set_type: Any
    _pyi_private_get_type: Any

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        return None if value is None else json.loads(value)

    def get_prep_value(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


class ByteOrderCharField(models.CharField):
    """Text compared as its bytes on every database: what starts with "a9" is the range from
    "a9" to "a:" (a re-import's buckets, ``rereading._bucket_range``; a prefix search). SQLite's
    default, ``BINARY``, is; on PostgreSQL the column takes ``"C"``, whatever the database's
    collation (a language's sorts ":" before the digits, or ignores it). Migration 0005."""

    def db_parameters(self, connection: Any) -> Any:
        parameters = super().db_parameters(connection)
        if connection.vendor == "postgresql":
            parameters["collation"] = "C"
        return parameters


class Host(models.Model):
    """A machine whose importer ships its runs here (``import_runs`` registers it, and beats
    its heart after every pass). It owns the runs it imported: it alone writes a person's
    decision into their directories."""

    name = models.CharField(max_length=128, unique=True)
    runs_root = models.TextField()
    version = models.CharField(max_length=32)
    pid = models.BigIntegerField(null=True)
    started_at = models.DateTimeField()
    # The end of its last pass (the start of its first, until that ends): its heartbeat.
    last_seen_at = models.DateTimeField()
    last_pass_seconds = models.FloatField(null=True)  # longer than its interval: it falls behind (a shipper's too)
    stopped_at = models.DateTimeField(null=True)  # it said it stopped (SIGTERM, Ctrl-C)
    watching = models.BooleanField(default=False)  # ships continuously: its silence is a problem
    # The watching importer that holds the name: a random token per process. Another importer
    # under the same name is refused while this one reports, and only the holder beats the
    # heart or says the host stopped (hosts.register).
    lease = models.CharField(max_length=64, default="", blank=True)
    # The machine the holder runs on (its host name and boot id): a watch restarted there after
    # a crash takes the name at once from its dead predecessor (hosts.register).
    machine = models.CharField(max_length=300, default="", blank=True)
    refused_at = models.DateTimeField(null=True)  # a second importer under this name was refused then
    refused_from = models.TextField(default="", blank=True)  # ... the runs root it said it ships
    # The last pass that failed (the database unreachable, an ended connection): what, and when.
    last_error = models.TextField(default="", blank=True)
    last_error_at = models.DateTimeField(null=True)
    # What a host that ships (``callproof ship``) said and was told, on the server's clock
    # (evidence/ingest/mirror.py). Its clock less the server's at its last request, by the time
    # its shipper sent: a host whose clock is off is told apart from one whose runs are old.
    clock_offset_seconds = models.FloatField(null=True)
    # The pushes it may make now, a bucket refilled at EVIDENCE_SHIP_PUSHES_PER_MINUTE.
    push_tokens = models.FloatField(default=0)
    push_tokens_at = models.DateTimeField(null=True)
    # Its pushes refused since then, none taken since (null: the last one was taken), and why.
    push_refused_since = models.DateTimeField(null=True)
    push_refusal = models.TextField(default="", blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("host")
        verbose_name_plural = _("hosts")

    def __str__(self) -> str:
        return self.name


class RunQuerySet(models.QuerySet):
    def unfinished(self) -> RunQuerySet:
        """Runs that may still write: ``protocol.run_is_finished``, said in SQL."""
        return self.exclude(state__in=protocol.FINISHED_STATES)

    def hot(self, now: dt.datetime) -> RunQuerySet:
        """The hot set: runs every pass of a watch checks (docs/operations.md, "How a pass chooses
        what to check"). Never checked (new, or imported before the hot set), changed within
        ``HOT_AFTER_CHANGE``, a stale-age deadline due, or not finished and not abandoned.
        ``Run.is_hot`` is the same rule for one row; each branch is a range of its own index."""
        return self.filter(archived=False).filter(
            Q(checked_at__isnull=True) | Q(changed_at__gte=now - HOT_AFTER_CHANGE) | Q(next_stale_at__lte=now) | ACTIVE
        )

    def cold_due(self, now: dt.datetime, sweep: dt.timedelta) -> RunQuerySet:
        """Runs whose last check is ``sweep`` old: a cold run is checked this often, so that a
        late receipt or a tampered file in it is still found, later."""
        return self.filter(archived=False, checked_at__lte=now - sweep)


class Run(models.Model):
    run_id = models.CharField(max_length=128, unique=True)
    path = models.TextField()  # on its host
    # The host whose importer imported it: its directory is on that machine.
    host = models.ForeignKey(Host, on_delete=models.PROTECT, null=True, related_name="runs", db_index=False)
    state = models.CharField(max_length=64, blank=True)
    # ``protocol.run_is_finished(state)``, stored with it: "state NOT IN (...)" is no index's
    # range, and the hot set finds the runs that may still write on an index.
    finished = models.BooleanField(default=False)
    attempts = models.BigIntegerField(null=True)
    contract_sha256 = models.CharField(max_length=64, blank=True)
    # Its steer.json's SHA-256 when imported (``reader.birth_digest``): which run a directory holds.
    # Retention removes a directory only when it still holds this run, never another run that
    # took its name (a new run under an archived id, another host's copy).
    steer_sha256 = models.CharField(max_length=64, blank=True, default="")
    # A shipped run archived from the server's mirror: its host removed its own copy then
    # (``callproof ship``, an instruction), or kept it, and why (it held another run).
    host_copy_removed_at = models.DateTimeField(null=True)
    # When the dashboard told the host, just before it removed its copy, that no legal hold stood:
    # from then on the removal is decided (a hold set later keeps the archive, not the host's copy).
    host_copy_removal_confirmed_at = models.DateTimeField(null=True)
    host_copy_kept = models.TextField(blank=True, default="")
    # How far the ledger was read, and a digest of that prefix: the next
    # import parses only what was appended, and notices a rewrite.
    ledger_offset = models.BigIntegerField(default=0)
    ledger_prefix_sha256 = models.CharField(max_length=64, default=EMPTY_SHA256)
    ledger_last_seq = models.BigIntegerField(default=0)
    ledger_last_line_sha256 = models.CharField(max_length=64, default=ZERO_HASH)
    ledger_line_no = models.BigIntegerField(default=0)
    # Whether a line has carried prev_sha256: from then on a line without it breaks the chain.
    ledger_chained = models.BooleanField(default=False)
    # The ledger's size, mtime, ctime and inode when it was last read to its end: the same
    # again means no line was added or changed, and the ledger is not read (nor hashed).
    ledger_signature = models.CharField(max_length=100, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    # The receipts' names and signatures as last imported, a digest per first two characters of
    # the call id (rereading.receipt_buckets): a re-import reads and checks the buckets that differ.
    receipt_buckets = JSONTextField(default=dict)
    # The earliest moment a stale_* finding can appear with no file changing.
    next_stale_at = models.DateTimeField(null=True)
    event_count = models.BigIntegerField(default=0)
    first_event_at = models.DateTimeField(null=True)
    last_event_at = models.DateTimeField(null=True)  # as the run's host wrote it: its clock's word
    # The last event on the server's clock (``hosts.checked_activity``): the host's time, checked
    # against when the server received it. What retention and "abandoned" judge a run by.
    activity_at = models.DateTimeField(null=True)
    archived = models.BooleanField(default=False)
    archived_at = models.DateTimeField(null=True)
    archive_path = models.TextField(blank=True)  # the .tar.gz under EVIDENCE_ARCHIVE_ROOT
    bodies_stripped_at = models.DateTimeField(null=True)  # args, results and payloads replaced by digests
    # A legal hold keeps the run whatever its age; set and lifted by a person, with a reason (audited).
    legal_hold = models.BooleanField(default=False)
    legal_hold_reason = models.TextField(blank=True)
    legal_hold_by = models.CharField(max_length=150, blank=True)
    legal_hold_since = models.DateTimeField(null=True)
    imported_at = models.DateTimeField(null=True)
    # Kept at import time so that no page counts over a million rows: events by
    # type (added batch by batch), and ``stats.refresh_run_summary``'s counts.
    event_type_counts = JSONTextField(default=dict)
    summary = JSONTextField(null=True)
    needs_attention = models.BooleanField(default=False)
    # Retention's facts, kept with the summary: when the run's clock started (its last event, a
    # person's later decision or hold) and whether anything keeps it whatever its age. The
    # retention page filters, pages and totals on these, never by planning every run.
    retention_clock_from = models.DateTimeField(null=True)
    retention_blocked = models.BooleanField(default=False)
    body_bytes = models.BigIntegerField(default=0)  # what stripping the bodies would free
    # The hot set's facts (``RunQuerySet.hot``): when a pass last compared the files with what
    # was imported (null: never, so the next pass does), when they were last known to change (a
    # pass found them changed, or a person's decision was written into them), and since when the
    # run is abandoned (its run_abandoned finding is open).
    checked_at = models.DateTimeField(null=True)
    changed_at = models.DateTimeField(null=True)
    abandoned_at = models.DateTimeField(null=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["run_id"]
        indexes = [
            models.Index(fields=["state"]),
            # The runs list, newest activity first, paged by key.
            models.Index(fields=["last_event_at", "run_id"], name="run_activity_idx"),
            # The hot set and the cold sweep, one index a branch (RunQuerySet.hot, cold_due).
            models.Index(fields=["checked_at"], name="run_checked_idx"),
            models.Index(fields=["changed_at"], name="run_changed_idx"),
            models.Index(fields=["next_stale_at"], name="run_stale_due_idx"),
            models.Index(fields=["finished", "abandoned_at"], name="run_active_idx"),
        ]
        permissions = [
            ("browse", "Can browse runs, calls, findings, the inbox, the audit and retention"),
            ("export_evidence", "Can download a run's redacted evidence"),
            ("set_legal_hold", "Can set or lift a legal hold on a run"),
        ]

    def __str__(self) -> str:
        return self.run_id

    @property
    def is_finished(self) -> bool:
        """A finished run writes nothing more: its page stops refreshing, retention may act."""
        return protocol.run_is_finished(self.state)

    @property
    def is_live(self) -> bool:
        """Not finished, and wrote an event lately (on the server's clock, ``activity_at``): a
        killed run left "retrying" is not live."""
        last = self.activity_at or self.last_event_at
        if self.is_finished or last is None:
            return False
        return protocol.utc_now() - last < LIVE_WINDOW

    def is_hot(self, now: dt.datetime) -> bool:
        """Whether every pass of a watch checks it: ``RunQuerySet.hot``'s rule, for this row."""
        if self.archived:
            return False
        return (
            self.checked_at is None
            or (self.changed_at is not None and self.changed_at >= now - HOT_AFTER_CHANGE)
            or (self.next_stale_at is not None and self.next_stale_at <= now)
            or (self.abandoned_at is None and not self.is_finished)
        )

    @property
    def last_activity_at(self) -> dt.datetime | None:
        """Its last event on the server's clock (``activity_at``; the host's time for a run
        imported before it was kept), or for a run with none, when its files last changed."""
        return self.activity_at or self.last_event_at or self.changed_at


def is_abandoned(state: str, last_activity_at: dt.datetime | None, now: dt.datetime, after: dt.timedelta) -> bool:
    """The one rule for "abandoned": not finished (``protocol.run_is_finished``), and no event
    (nor, for a run with no event, a change of its files) for ``after``. The pass that checks a
    run asks it, and opens or closes the run's run_abandoned finding."""
    if protocol.run_is_finished(state) or last_activity_at is None:
        return False
    return now - last_activity_at >= after


def with_run(rows: models.QuerySet) -> models.QuerySet:
    """Rows joined with their run, without the run's stored counts: JSON that would be
    decoded once per row by a list that only shows the run's name."""
    return rows.select_related("run").defer("run__summary", "run__event_type_counts")


class CallQuerySet(models.QuerySet):
    def in_doubt(self) -> CallQuerySet:
        """Calls whose recovery decision waits for the target or a person: ``protocol.in_doubt``,
        said in SQL (on the index that leads with the decision)."""
        return self.filter(decision__in=protocol.IN_DOUBT_DECISIONS)


class Call(models.Model):
    """One per call_id per run: every receipt, and every call_id the ledger names."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="calls", db_index=False)
    call_id = ByteOrderCharField(max_length=200)  # its ranges follow prefixes (a re-import's buckets)
    receipt_present = models.BooleanField(default=True)
    file_sha256 = models.CharField(max_length=64, blank=True)
    declared_call_id = models.TextField(blank=True)
    status = models.CharField(max_length=32, blank=True)
    tool = models.TextField(blank=True)
    tool_version = models.TextField(blank=True)
    identity = models.TextField(blank=True)
    contract_sha256 = models.TextField(blank=True)
    attempt = models.BigIntegerField(null=True)
    args = JSONTextField(null=True)
    input_sha256 = models.TextField(blank=True)
    recomputed_input_sha256 = models.CharField(max_length=64, blank=True)  # of the args as imported
    output_sha256 = models.TextField(blank=True)
    result = JSONTextField(null=True)
    error = JSONTextField(null=True)
    error_kind = models.CharField(max_length=32, blank=True)
    queryable = models.BooleanField(default=False)
    created_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField(null=True)
    recomputed_call_id = models.CharField(max_length=64, blank=True)
    verification = models.CharField(max_length=16, blank=True)  # verified, mismatch, unverifiable
    decision = models.CharField(max_length=16, blank=True)
    decision_reason = models.TextField(blank=True)
    # size.mtime_ns.ctime_ns.inode of the receipt when read: unchanged, it is not read again.
    file_signature = models.CharField(max_length=100, blank=True)

    objects = CallQuerySet.as_manager()

    class Meta:
        ordering = ["run", "call_id"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="call_unique_per_run")]
        indexes = [
            # call_id prefix search is a range scan on this index (see selectors).
            models.Index(fields=["call_id"], name="call_id_prefix_idx"),
            # The recovery page walks one decision at a time by call_id (keyset pagination).
            models.Index(fields=["run", "decision", "call_id"], name="call_run_decision_idx"),
            # The inbox reads only unsettled calls, across runs, oldest first.
            models.Index(fields=["decision", "updated_at"], name="call_decision_updated_idx"),
        ]

    def __str__(self) -> str:
        return self.call_id

    @property
    def in_doubt(self) -> bool:
        """Its recovery decision waits for the target or a person (``protocol.in_doubt``)."""
        return protocol.in_doubt(self.decision)

    @property
    def shown_status(self) -> str:
        """The status a page shows (``recovery.shown_status``): a receipt that fails its identity
        check is never "committed", a call a person settled shows as settled."""
        return recovery.shown_status(
            present=self.receipt_present, status=self.status, verification=self.verification, decision=self.decision
        )

    @property
    def settled(self) -> bool:
        """A person's confirmation decides it (``recovery.SETTLED_SHOWN``)."""
        return self.shown_status in recovery.SETTLED_SHOWN.values()


class Submission(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="submissions", db_index=False)
    client_submission_id = models.CharField(max_length=256)
    record_key = models.CharField(max_length=64)
    file_sha256 = models.CharField(max_length=64)
    digest_schema_version = models.TextField(blank=True)
    request_digest = models.TextField(blank=True)
    recomputed_digest = models.CharField(max_length=64, blank=True)
    request = JSONTextField(null=True)
    state = models.CharField(max_length=32, blank=True)
    task_id = models.TextField(blank=True)
    task_path = models.TextField(blank=True)
    task_sha256 = models.TextField(blank=True)
    task_present = models.BooleanField(default=False)
    task_file_sha256 = models.CharField(max_length=64, blank=True)
    task_matches = models.BooleanField(default=False)
    creation_result = JSONTextField(null=True)
    reserved_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["run", "client_submission_id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "client_submission_id"], name="submission_unique_per_run")
        ]
        indexes = [models.Index(fields=["client_submission_id"]), models.Index(fields=["state", "updated_at"])]

    def __str__(self) -> str:
        return self.client_submission_id


class Event(models.Model):
    """One per ledger line that has a seq; the line's whole object is in payload."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.BigIntegerField()
    line_no = models.BigIntegerField()
    ts = models.DateTimeField(null=True)
    type = models.CharField(max_length=64)
    call_id = models.CharField(max_length=200, blank=True)
    client_submission_id = models.CharField(max_length=256, blank=True)
    disposition = models.CharField(max_length=16, blank=True)
    request_digest = models.CharField(max_length=64, blank=True)
    line_sha256 = models.CharField(max_length=64)
    payload = JSONTextField()  # the line's own JSON text
    # A receipt event's status (null for other events): which calls the ledger records as committed.
    # Nullable so that adding it to a table of millions of events is an ALTER, not a copy (SQLite).
    status = models.CharField(max_length=16, null=True)  # noqa: DJ001

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_unique_per_run")]
        indexes = [
            models.Index(fields=["run", "type", "seq"]),
            models.Index(fields=["run", "call_id", "seq"], name="event_call_idx"),
            # Submission events by id, and legacy ones (no id). Partial: the other events, nearly
            # all of a long ledger, cost it nothing on import. Queries name the type, as it does.
            models.Index(
                fields=["run", "client_submission_id", "seq"],
                condition=Q(type="submission"),
                name="event_submission_idx",
            ),
        ]
        # Every index is paid for on each of a million inserts: these are the ones a page reads.

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq}"


class EventTally(models.Model):
    """How many events of a run fall in each minute: the run page's histogram reads these,
    never the events. Added to batch by batch as the ledger is imported."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tallies", db_index=False)
    minute = models.BigIntegerField()  # minutes since the Unix epoch, UTC
    count = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "minute"], name="tally_unique_per_run")]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.minute}: {self.count}"


class Finding(models.Model):
    """What a reader reported. Closed (never deleted) when it no longer holds."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="findings", null=True, db_index=False)
    root = models.TextField(blank=True)  # for findings about the runs root itself (no run)
    code = models.CharField(max_length=40)
    subject = models.CharField(max_length=400)
    detail = models.TextField(blank=True)
    severity = models.CharField(max_length=8)
    scope = models.CharField(max_length=8, default=findings.FILES)  # findings.py says what each scope means
    call_id = models.CharField(max_length=200, blank=True)
    stored_value = models.TextField(blank=True)
    recomputed_value = models.TextField(blank=True)
    # What could not be kept anywhere else: a ledger line whose seq was taken, as written.
    evidence = models.TextField(blank=True)
    record_key = models.CharField(max_length=64, blank=True)  # the submission record it is about, if any
    # The detail's sentence (receipts.findings.SENTENCES) and the values it quotes, so that a page
    # words it in the reader's language (evidence/words/finding_words.py); "" for a detail written
    # before, which is shown as it was stored.
    sentence = models.CharField(max_length=80, blank=True, default="", db_default="")
    detail_values = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    closed_at = models.DateTimeField(null=True)
    # A person's triage (evidence/review/triage.py): "" (open), acknowledged, or snoozed until
    # ``triage_until`` and/or until the import sees it change (``triage_on_change``). Reasons,
    # who and when are kept here for the lists; every act is in the audit too.
    # Defaults in the database too: the importer's bulk upsert names only the columns it writes.
    triage = models.CharField(max_length=16, blank=True, default="", db_default="")
    triage_until = models.DateTimeField(null=True)
    triage_on_change = models.BooleanField(default=False, db_default=False)
    triage_reason = models.TextField(blank=True, default="", db_default="")
    triage_by = models.CharField(max_length=150, blank=True, default="", db_default="")
    triage_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["code", "subject"]
        permissions = [("triage_finding", "Can acknowledge or snooze a finding, and undo either")]
        constraints = [
            models.UniqueConstraint(fields=["run", "code", "subject"], name="finding_unique_per_run"),
            models.UniqueConstraint(
                fields=["root", "code", "subject"], condition=Q(run__isnull=True), name="finding_unique_per_root"
            ),
        ]
        indexes = [
            # Open findings by code, paged by key (the findings page, the inbox, the stale page).
            models.Index(fields=["closed_at", "code", "id"], name="finding_open_code_idx"),
            models.Index(fields=["closed_at", "severity"]),
            models.Index(fields=["run", "closed_at"]),
            models.Index(fields=["run", "call_id"]),
            # The triaged few: the acknowledged and snoozed views, the snoozes whose time has come
            # (a range on triage_until against now: no timer wakes them), the import's check.
            models.Index(fields=["triage", "triage_until"], name="finding_triage_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.code}: {self.subject}"

    @property
    def label(self) -> str:
        """What the audit says an act was about."""
        return f"{self.code}: {self.subject}"


class Confirmation(models.Model):
    """A human decision file from confirmations/ (the confirmation issue writes them)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="confirmations", db_index=False)
    call_id = models.CharField(max_length=200)
    file_sha256 = models.CharField(max_length=64)
    resolution = models.TextField(blank=True)
    reason = models.TextField(blank=True)
    actor = models.TextField(blank=True)
    confirmed_at = models.DateTimeField(null=True)
    receipt_sha256 = models.TextField(blank=True)
    confirmation_id = models.TextField(blank=True)
    valid = models.BooleanField(default=False)
    problem = models.TextField(blank=True)
    # Where the decision was made (``evidence.ingest.provenance``): "" when a decision made on the
    # dashboard matches it (same call, resolution and receipt), else the name of the run's host when
    # the import first found it valid: the host's word, by a name in a file that is no account.
    made_on_host = models.CharField(max_length=128, blank=True, default="", db_default="")

    class Meta:
        ordering = ["run", "call_id"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="confirmation_unique_per_run")]
        permissions = [("confirm_call", "Can confirm whether a prepared or unknown call took effect")]

    def __str__(self) -> str:
        return self.call_id


class HumanDecision(models.Model):
    """A person's decision about a call in doubt, made on the dashboard: the audit trail.

    Written once by ``settle.settle_call`` and never edited (the admin shows it
    read-only). One per call: the unique constraint is what lets exactly one of
    two people deciding at once win. Deleted only when withdrawn before it was
    written into the run directory (``evidence.ingest.withdrawal``), with an
    audit entry (``AuditEntry.DECISION_WITHDRAWN``) that keeps it whole.
    """

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="human_decisions")
    call_id = models.CharField(max_length=200)
    resolution = models.CharField(max_length=16)
    reason = models.TextField()
    # The person: their id, which no rename changes and no later account takes (PERSON_ID), and
    # their name when they decided. Both outlive the account.
    user = models.ForeignKey("auth.User", null=True, related_name="+", **PERSON_ID)
    actor = models.CharField(max_length=150)
    decided_at = models.DateTimeField()
    receipt_sha256 = models.CharField(max_length=64)
    confirmation_id = models.CharField(max_length=64)
    client_address = models.GenericIPAddressField(null=True)
    # Written into the run directory (``delivery``): when, and by which host; or why it never
    # can be (the receipt changed since, another decision is there), with a finding on the run.
    delivered_at = models.DateTimeField(null=True)
    delivered_by = models.CharField(max_length=128, blank=True)
    undeliverable = models.TextField(blank=True)
    delivery_error = models.TextField(blank=True)  # the last attempt's, when it may still succeed

    class Meta:
        ordering = ["-decided_at", "id"]
        verbose_name = _("settle decision")
        verbose_name_plural = _("settle decisions")
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="one_decision_per_call")]
        indexes = [
            models.Index(fields=["decided_at"]),
            models.Index(fields=["actor", "decided_at"]),
            # What a host's importer still has to write: few rows, read every pass.
            models.Index(
                fields=["run"], condition=Q(delivered_at__isnull=True, undeliverable=""), name="decision_pending_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.actor}: {self.call_id[:12]} {self.resolution}"

    @property
    def pending(self) -> bool:
        """Decided, and not yet written into the run directory (nor refused there)."""
        return self.delivered_at is None and not self.undeliverable


class AuditEntry(models.Model):
    """Every retention action, legal hold, evidence export and triage, beside the people's
    decisions (HumanDecision).

    Written once, never edited or deleted; the admin shows it read-only.
    """

    LEGAL_HOLD_SET, LEGAL_HOLD_LIFTED = "legal_hold_set", "legal_hold_lifted"
    BODIES_STRIPPED, RUN_ARCHIVED = "bodies_stripped", "run_archived"
    EVIDENCE_EXPORTED = "evidence_exported"
    # Triage (evidence/review/triage.py): a person's four acts, and the import ending a triage.
    ACKNOWLEDGED, UNACKNOWLEDGED = "finding_acknowledged", "finding_unacknowledged"
    SNOOZED, UNSNOOZED = "finding_snoozed", "finding_unsnoozed"
    TRIAGE_ENDED = "triage_ended"
    HOST_MOVED = "host_moved"  # the run was handed to another host (``manage.py host move``)
    HOST_COPY_REMOVED = "host_copy_removed"  # archived from the mirror: its host removed its own copy
    # A person's account renamed or removed (evidence/lib/people.py): about no run; the subject names
    # the person by id and name.
    PERSON_RENAMED, PERSON_REMOVED = "person_renamed", "person_removed"
    # "I'm on it" (evidence/review/claims.py): a person claims an inbox item, lets it go (by hand, or by
    # settling or triaging it), or their claim runs out; the subject names the item.
    CLAIMED, CLAIM_RELEASED, CLAIM_EXPIRED = "claimed", "claim_released", "claim_expired"
    # An import found a valid confirmation that no decision made on the dashboard matches
    # (evidence/ingest/provenance.py): once per confirmation; the subject is the call_id.
    DECISION_MADE_ON_HOST = "decision_made_on_host"
    # A person took back a decision not yet written into the run directory (evidence/ingest/withdrawal.py);
    # the subject is the call_id, the reason the decision as it was, and it leaves HumanDecision.
    DECISION_WITHDRAWN = "decision_withdrawn"

    # None for an act on a person (a rename, a removal), which is about no run.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, null=True, related_name="audit_entries")
    action = models.CharField(max_length=32)
    subject = models.CharField(max_length=450, blank=True, default="")  # what in the run: a finding's label
    actor = models.CharField(max_length=150)  # a person's name then, or the command that acted
    user = models.ForeignKey("auth.User", null=True, related_name="+", **PERSON_ID)  # the person who acted
    at = models.DateTimeField()
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["at"]), models.Index(fields=["run", "at"])]
        # Django's default plural adds an "s": "audit entrys".
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit entries")

    def __str__(self) -> str:
        return f"{self.actor}: {self.action} {self.run_id or self.subject}"


class Claim(models.Model):
    """A person's "I'm on it" on one inbox item (evidence/review/claims.py), while it lasts: at most one
    an item (the unique constraint is what two people claiming at once meet), gone when released;
    one past ``expires_at`` is over, whether or not the sweep has removed it yet."""

    kind = models.CharField(max_length=32)  # the inbox kind (evidence/inbox.KINDS)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="claims", db_index=False)
    subject = models.CharField(max_length=450)  # the item's: a call_id, a finding's subject
    actor = models.CharField(max_length=150)  # the person's name then
    user = models.ForeignKey("auth.User", related_name="+", **PERSON_ID)
    claimed_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "kind", "subject"], name="claim_one_per_item")]
        indexes = [models.Index(fields=["expires_at"], name="claim_expires_idx")]
        verbose_name = _("claim")
        verbose_name_plural = _("claims")

    def __str__(self) -> str:
        return f"{self.actor}: {self.kind} {self.subject}"


class ShippedRun(models.Model):
    """A run as its host's shipper sends it (``callproof ship``): what the server's mirror holds
    of it, what the host said it holds, and why it does not arrive, on the server's clock
    (evidence/ingest/mirror.py). A run is one generation: the SHA-256 of its steer.json, so that
    a new run under an old run_id is told apart from the one the mirror holds."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="shipped_runs")
    run_id = models.CharField(max_length=128)
    generation = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()  # its first push or report: a host's new runs an hour are bounded
    # The host's ledger as its shipper last said, and the mirror's; every byte the mirror holds of it.
    host_ledger_bytes = models.BigIntegerField(default=0)
    mirror_ledger_bytes = models.BigIntegerField(default=0)
    mirror_bytes = models.BigIntegerField(default=0)
    reported_at = models.DateTimeField()  # when its shipper last said anything of it
    received_at = models.DateTimeField(null=True)  # when the last of its bytes arrived
    # Since when the mirror is short of the host's ledger with no byte of it arriving (a push
    # that brings some starts it again): longer than EVIDENCE_SHIP_STUCK_AFTER_SECONDS, it is stuck.
    behind_since = models.DateTimeField(null=True)
    # A pass's pushes of it not all made yet: the importer waits for the last (while they come).
    arriving = models.BooleanField(default=False)
    # Why it cannot be sent, as its shipper last said (a file it cannot read, a ledger unlike the
    # mirror's, a push the server refused), and since when; "" once it can.
    problem = models.TextField(default="", blank=True)
    problem_since = models.DateTimeField(null=True)
    # The SHA-256 of the mirror's ledger, and the state of the file it is of (size, time, inode):
    # a 409 says it, hashed once for each state however many pushes are refused.
    ledger_digest = models.CharField(max_length=64, blank=True, default="")
    ledger_digest_of = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "run_id"], name="shipped_run_unique_per_host")]
        indexes = [
            models.Index(fields=["host", "created_at"], name="shipped_run_created_idx"),
            # The runs that do not arrive (``mirror.stuck``), one index a branch.
            models.Index(fields=["behind_since"], name="shipped_run_behind_idx"),
            models.Index(fields=["problem_since"], name="shipped_run_problem_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.host}: {self.run_id}"


class HostKey(models.Model):
    """A host's key for ``callproof ship`` (``manage.py host add NAME``): only its SHA-256 is
    kept. A request with it is that host's, whatever name it says; it reaches only that host's
    runs. Revoked keys stay, so the audit can say which key shipped what."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="keys")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)  # the key's first characters, to tell keys apart
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True)
    revoked_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.host}: {self.prefix}…"


class ApiToken(models.Model):
    """A token for the JSON API (``manage.py api_token``): only its SHA-256 is kept, so a
    database that leaks leaks no token. It acts as its user, with that user's roles."""

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)  # what it is for, to find it again
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField(null=True)  # None: until revoked
    # The digest of the user's password hash when the token was made: a password changed
    # since (a person who lost control of the account resets it) ends every token at once.
    password_fingerprint = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"{self.user}: {self.name}"


class Export(models.Model):
    """A run's redacted evidence that a person asked for on the run page: made by the worker
    (evidence/export/jobs.py), its progress shown while it runs, its zip downloaded when done, removed
    ``EVIDENCE_EXPORT_KEEP_HOURS`` after it finished (a copy: the run can be exported again)."""

    WAITING, RUNNING, DONE, FAILED = "waiting", "running", "done", "failed"
    STATES = [(WAITING, "waiting"), (RUNNING, "running"), (DONE, "done"), (FAILED, "failed")]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="exports", db_index=False)
    requested_by = models.ForeignKey("auth.User", on_delete=models.SET_NULL, null=True, related_name="+")
    state = models.CharField(max_length=16, choices=STATES, default=WAITING)
    task_id = models.CharField(max_length=64, blank=True)  # the queue's id of the task making it
    done = models.PositiveBigIntegerField(default=0)  # rows written so far, of ``total``
    total = models.PositiveBigIntegerField(default=0)
    path = models.TextField(blank=True)  # the zip under EVIDENCE_EXPORT_ROOT, once done
    size = models.PositiveBigIntegerField(null=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    # The language of the person who asked (a code of settings.LANGUAGES): the worker writes the
    # export's page in it. Empty (an export asked for before languages were kept): the default.
    language = models.CharField(max_length=16, blank=True, default="")
    # The worker making it beats this while it runs, on the database's clock (exports.make): a
    # running export whose heartbeat is older than EVIDENCE_EXPORT_LEASE_SECONDS lost its worker.
    heartbeat_at = models.DateTimeField(null=True)

    # What ``error`` says of an export whose worker stopped under it: the page words it.
    WORKER_LOST = "worker lost: the worker making it stopped before it finished (killed or restarted)"
    # The codes ``error`` keeps of a failure the worker saw, as JSON with their values
    # (exports.failure_of): the page words them in its reader's language.
    DISK_FULL, NOT_WRITTEN = "disk_full", "not_written"

    class Meta:
        indexes = [
            # The run page shows its newest exports; the maintenance task finds the finished ones.
            models.Index(fields=["run", "created_at"], name="export_run_idx"),
            models.Index(fields=["finished_at"], name="export_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}: export {self.pk} {self.state}"

    @property
    def finished(self) -> bool:
        return self.state in (self.DONE, self.FAILED)

    @property
    def worker_lost(self) -> bool:
        return self.state == self.FAILED and self.error == self.WORKER_LOST

    @property
    def failure(self) -> dict[str, str]:
        """Why it failed, as a code and its values; an error kept as text before codes were
        (English: issue 36) is the code ``text`` with that text as its detail."""
        if self.worker_lost:
            return {"code": "worker_lost"}
        try:
            kept = json.loads(self.error)
        except ValueError:
            kept = None
        if isinstance(kept, dict) and kept.get("code") in (self.DISK_FULL, self.NOT_WRITTEN):
            return {"code": kept["code"], "detail": str(kept.get("detail", ""))}
        return {"code": "text", "detail": self.error}

    @property
    def percent(self) -> int:
        return min(100, self.done * 100 // self.total) if self.total else 0


class NotificationRule(models.Model):
    """Who is told of which inbox items, and how (evidence/review/alerts.py): a webhook, or e-mail.

    The filters are ANDed; an empty one matches everything. Made and changed by the admin role
    on /notifications/ (``receipts.manage_notifications``)."""

    WEBHOOK, EMAIL = "webhook", "email"
    CHANNELS = [(WEBHOOK, "webhook"), (EMAIL, "e-mail")]

    name = models.CharField(max_length=200)
    created_by = models.ForeignKey("auth.User", on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField()
    enabled = models.BooleanField(default=True)
    channel = models.CharField(max_length=16, choices=CHANNELS)
    url = models.CharField(max_length=2000, blank=True)  # the webhook's: http or https
    # The webhook's signing secret (HMAC-SHA256, alerts.signature): the receiver holds it too.
    secret = models.CharField(max_length=200, blank=True)
    emails = models.TextField(blank=True)  # e-mail addresses, one a line
    runs = models.CharField(max_length=200, blank=True)  # a glob on run_id ("nightly-*")
    host = models.CharField(max_length=200, blank=True)  # only the runs of this host (its name)
    tools = models.TextField(blank=True)  # tool names, one a line: a call's tool (other items have none)
    severities = models.CharField(max_length=64, blank=True)  # "error", "warning", space-separated
    kinds = models.CharField(max_length=400, blank=True)  # inbox kinds (inbox.KINDS), one a line

    class Meta:
        permissions = [("manage_notifications", "Can add, change and remove notification rules")]

    def __str__(self) -> str:
        return f"{self.name} ({self.channel})"


class Notification(models.Model):
    """One inbox item told to one rule: made when the item is first seen open, sent once (with
    retries), closed when the item leaves the open inbox. The item opening again is a new row.
    ``key`` is the item's: kind, run and subject."""

    PENDING, SENT, GAVE_UP, WITHDRAWN = "pending", "sent", "gave_up", "withdrawn"
    STATES = [(PENDING, "pending"), (SENT, "sent"), (GAVE_UP, "gave up"), (WITHDRAWN, "withdrawn")]

    rule = models.ForeignKey(NotificationRule, on_delete=models.CASCADE, related_name="notifications")
    key = models.CharField(max_length=700)
    kind = models.CharField(max_length=32)
    severity = models.CharField(max_length=16)
    run_id = models.CharField(max_length=128, blank=True)
    subject = models.CharField(max_length=400)
    path = models.CharField(max_length=2000)  # where the item is shown, on this site
    state = models.CharField(max_length=16, choices=STATES, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField()
    next_at = models.DateTimeField(null=True)  # when a pending one is (re)tried
    sent_at = models.DateTimeField(null=True)
    closed_at = models.DateTimeField(null=True)  # the item left the open inbox

    class Meta:
        constraints = [
            # One open notification per rule and item: the dedupe, kept by the database.
            models.UniqueConstraint(
                fields=["rule", "key"], condition=Q(closed_at__isnull=True), name="notify_open_once"
            )
        ]
        indexes = [models.Index(fields=["state", "next_at"], name="notify_due_idx")]

    def __str__(self) -> str:
        return f"{self.key} -> {self.rule_id}: {self.state}"


class DeliveryAttempt(models.Model):
    """One try at telling a rule's destination of an item: the delivery log (/notifications/),
    kept ``EVIDENCE_ALERTS_LOG_KEEP_DAYS``."""

    DELIVERED, FAILED, GAVE_UP = "delivered", "failed", "gave_up"
    OUTCOMES = [(DELIVERED, "delivered"), (FAILED, "failed"), (GAVE_UP, "gave up")]

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="attempts_made")
    at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=OUTCOMES)
    status = models.PositiveIntegerField(null=True)  # the receiver's HTTP status
    error = models.CharField(max_length=400, blank=True)  # a code: timeout, refused, http_500, ...
    next_at = models.DateTimeField(null=True)  # the next try, after a failure

    class Meta:
        indexes = [models.Index(fields=["at", "id"], name="delivery_at_idx")]

    def __str__(self) -> str:
        return f"{self.notification_id} at {self.at}: {self.outcome}"
