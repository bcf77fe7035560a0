"""Alerts that reach a person: the inbox's items, told to whoever a notification rule names.

A rule (``NotificationRule``) names a destination (a webhook, or e-mail addresses) and filters
(run id glob, host, tools, severities, kinds). The worker's ``notify`` task, queued after every
import pass that changed something and by the ``alerts`` maintenance timer, does two things:

- ``scan``: reads the open inbox (``inbox.inbox_segments``: its indexed queries, in chunks, at
  most ``SCAN_LIMIT`` items) and makes one ``Notification`` per rule and item not yet told
  (its key: kind, run, subject; the database's partial unique constraint keeps it once). An
  item that left the open inbox (settled, acknowledged, snoozed, closed) closes its
  notification: one still pending is withdrawn, never sent. The item opening again (a snooze
  ending) is a new notification.
- ``deliver_due``: sends each pending notification whose time has come. A failure is tried
  again after ``EVIDENCE_ALERTS_RETRY_SECONDS``, doubling to 60 times that, and given up after
  ``EVIDENCE_ALERTS_MAX_ATTEMPTS`` tries; every try is a ``DeliveryAttempt`` (the delivery log).
  A webhook's request is bounded (``EVIDENCE_WEBHOOK_TIMEOUT_SECONDS``, ``RESPONSE_LIMIT``,
  no redirects), so a slow or down receiver holds the others back by at most its timeout.

A webhook's body is signed as Stripe's are: ``Callproof-Signature: t=<unix time>,v1=<hex
HMAC-SHA256 of "<t>.<body>" with the rule's secret>`` (``signature``; docs/reference.md
shows a receiver's check).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import hashlib
import hmac
import ipaddress
import itertools
import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core import mail
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.urls import reverse
from django.utils import translation
from django_tasks import task

from evidence.lib.pagination import every_row
from evidence.models import DeliveryAttempt, Notification, NotificationRule, Run
from evidence.review import inbox, triage
from receipts import protocol, states
from receipts.reader import evidence_page

log = logging.getLogger("callproof.alerts")

SCAN_LIMIT = 10_000  # open items read a scan: the inbox is what people must decide, not the ledger
DELIVER_BATCH = 200  # notifications sent a task run (the next run takes the rest)
RESPONSE_LIMIT = 64 * 1024  # bytes of a receiver's answer read (only its status matters)
EVENT = "inbox.item.opened"  # the webhook body's "type"
SIGNATURE_HEADER = "Callproof-Signature"
SEVERITIES = ("error", "warning")
LOG_DELETE_BATCH = 5000  # delivery log rows removed at a time, past their keep


class WebhookRefused(ValueError):  # noqa: N818 - a verdict, as exports.ExportRefused
    """A webhook address this server will not call (its scheme, or where it leads)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


# The rule's filters ------------------------------------------------------------------------


def lines(text: str) -> list[str]:
    """A rule's list field (one a line, or separated by commas or spaces) as its items."""
    return [part for part in text.replace(",", " ").split() if part]


def matches(rule: NotificationRule, item: inbox.InboxItem, host: str) -> bool:
    """Whether ``rule`` is about ``item`` (of a run of ``host``; a silent host is its own)."""
    if rule.kinds and item.kind not in _kinds(rule.kinds):
        return False
    if rule.severities and item.severity not in lines(rule.severities):
        return False
    if rule.tools and item.tool not in lines(rule.tools):
        return False
    if rule.host and rule.host != host:
        return False
    return not rule.runs or (bool(item.run_id) and fnmatch.fnmatchcase(item.run_id, rule.runs))


def _kinds(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def key_of(item: inbox.InboxItem) -> str:
    """The item's stable key: the same item in every scan, another when any part differs."""
    return f"{item.kind}|{item.run_id}|{item.subject}"[:700]


def path_of(item: inbox.InboxItem) -> str:
    """Where the item is shown on this site: what its inbox row's link opens."""
    if item.action in ("settle", "resume"):
        return reverse("call", args=[item.run_id, item.subject])
    if item.action == "host":
        return reverse("hosts")
    if item.finding_id is not None:
        return reverse("triage", args=[item.finding_id])
    return reverse("run", args=[item.run_id])


def link_of(path: str) -> str:
    """An absolute link when ``EVIDENCE_PUBLIC_URL`` says where the site is; the path otherwise."""
    return settings.EVIDENCE_PUBLIC_URL + path if settings.EVIDENCE_PUBLIC_URL else path


# Finding what to tell ----------------------------------------------------------------------


@dataclasses.dataclass
class ScanReport:
    items: int = 0
    opened: int = 0
    closed: int = 0
    complete: bool = True  # False: more than SCAN_LIMIT open items, so none was closed


def scan(*, now: dt.datetime | None = None) -> ScanReport:
    """Make a notification for each enabled rule and open item not yet told; close those whose
    item left the open inbox."""
    now = now or protocol.utc_now()
    report = ScanReport()
    rules = list(NotificationRule.objects.filter(enabled=True).order_by("pk"))
    if not rules:
        return report
    rows = every_row(inbox.inbox_segments(view=triage.OPEN, now=now))
    items = list(itertools.islice(rows, SCAN_LIMIT + 1))
    if len(items) > SCAN_LIMIT:
        items, report.complete = items[:SCAN_LIMIT], False
        log.warning("the open inbox is larger than a scan reads: items past it are told later",
                    extra={"event": "alerts_scan_truncated", "count": SCAN_LIMIT})  # fmt: skip
    report.items = len(items)
    hosts = dict(
        Run.objects.filter(run_id__in={item.run_id for item in items if item.run_id}).values_list(
            "run_id", "host__name"
        )
    )
    open_keys = set(Notification.objects.filter(rule__in=rules, closed_at__isnull=True).values_list("rule_id", "key"))
    seen: set[tuple[int, str]] = set()
    for item in items:
        key = key_of(item)
        host = item.subject if item.kind in (inbox.HOST, inbox.STALLED) else hosts.get(item.run_id) or ""
        for rule in rules:
            if not matches(rule, item, host):
                continue
            seen.add((rule.pk, key))
            if (rule.pk, key) in open_keys:
                continue
            report.opened += _open(rule, item, key, now)
    if report.complete:
        gone = [pair for pair in open_keys if pair not in seen]
        report.closed = _close(gone, now)
    return report


def _open(rule: NotificationRule, item: inbox.InboxItem, key: str, now: dt.datetime) -> int:
    try:
        with transaction.atomic():
            Notification.objects.create(
                rule=rule, key=key, kind=item.kind, severity=item.severity, run_id=item.run_id,
                subject=item.subject[:400], path=path_of(item), opened_at=now, next_at=now,
            )  # fmt: skip
    except IntegrityError:  # another scan at the same moment made it: told once all the same
        return 0
    return 1


def _close(pairs: Iterable[tuple[int, str]], now: dt.datetime) -> int:
    """Close the open notifications of these (rule, key) pairs: a pending one is withdrawn."""
    closed = 0
    for rule_id, key in pairs:
        rows = Notification.objects.filter(rule_id=rule_id, key=key, closed_at__isnull=True)
        rows.filter(state=Notification.PENDING).update(state=Notification.WITHDRAWN, next_at=None)
        closed += rows.update(closed_at=now)
    return closed


# Telling -----------------------------------------------------------------------------------


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The ``Callproof-Signature`` header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(notification: Notification) -> dict[str, object]:
    """The webhook's JSON body: the item, its state as the table of states says it (its name,
    glyph, word and what to do, in the site's language) for an item that is a state, and a
    one-line text a Slack incoming webhook shows."""
    link = link_of(notification.path)
    name = inbox.STATE_OF_KIND.get(notification.kind, "")
    if name:
        state = states.STATES[name]
        language = evidence_page.page_language(settings.LANGUAGE_CODE)
        shown, to_do = f"{state.glyph} {state.word(language)}", state.to_do(language)
    else:
        with translation.override(settings.LANGUAGE_CODE):
            shown, to_do = inbox.kind_label(notification.kind), ""
    where = f"run {notification.run_id}, " if notification.run_id else ""
    line = f"[{notification.severity}] {shown}: {where}{notification.subject}" + (f". {to_do}" if to_do else "")
    shown_link = f"<{link}|open>" if link.startswith("http") else link
    return {
        "type": EVENT,
        "item": {
            "kind": notification.kind,
            "severity": notification.severity,
            "run_id": notification.run_id,
            "subject": notification.subject,
            "state": name or notification.kind,
            "shown": shown,
            "to_do": to_do,
            "link": link,
            "opened_at": protocol.format_time(notification.opened_at),
        },
        "text": f"{_slack_escape(line)} {shown_link}",
    }


def check_url(url: str) -> tuple[str, int]:
    """Where a webhook may be sent, or ``WebhookRefused``: http or https only; a host named in
    ``EVIDENCE_WEBHOOK_ALLOWED_HOSTS`` when it is set, otherwise one whose every address is public."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused("scheme")
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    allowed = settings.EVIDENCE_WEBHOOK_ALLOWED_HOSTS
    if allowed:
        if host not in allowed:
            raise WebhookRefused("host_not_allowed")
        return host, port
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        raise WebhookRefused("dns") from None
    for address in addresses:
        ip = ipaddress.ip_address(str(address).split("%")[0])
        if not ip.is_global:
            raise WebhookRefused("private_address")
    return host, port


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 3xx is the receiver's answer, never followed: it could lead anywhere


_OPENER = urllib.request.build_opener(_NoRedirects, urllib.request.ProxyHandler({}))


def post_webhook(rule: NotificationRule, body: bytes) -> tuple[int | None, str]:
    """POST ``body`` to the rule's webhook: (HTTP status, "" or an error code)."""
    try:
        check_url(rule.url)
    except WebhookRefused as refused:
        return None, refused.code
    timestamp = int(time.time())
    headers = {"Content-Type": "application/json", "User-Agent": "callproof-alerts",
               SIGNATURE_HEADER: signature(rule.secret, body, timestamp)}  # fmt: skip
    # check_url above allowed http and https only.
    request = urllib.request.Request(rule.url, data=body, method="POST", headers=headers)  # noqa: S310
    try:
        with _OPENER.open(request, timeout=settings.EVIDENCE_WEBHOOK_TIMEOUT_SECONDS) as answer:
            answer.read(RESPONSE_LIMIT)
            status = answer.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code, f"http_{error.code}"
    except TimeoutError:
        return None, "timeout"
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, TimeoutError | socket.timeout):
            return None, "timeout"
        if isinstance(reason, ConnectionRefusedError):
            return None, "refused"
        return None, f"unreachable: {reason}"[:400]
    except OSError as error:
        return None, f"{type(error).__name__}: {error}"[:400]
    return status, "" if 200 <= status < 300 else f"http_{status}"


def send_email(rule: NotificationRule, notification: Notification) -> str:
    """The notification as a plain-text e-mail to the rule's addresses: "" or an error code."""
    body = payload(notification)
    item = body["item"]
    assert isinstance(item, dict)
    subject = f"[Callproof] {item['state']}: {item['run_id'] or item['subject']}"
    text = (
        f"{body['text']}\n\nkind: {item['kind']}\nseverity: {item['severity']}\nrun: {item['run_id']}\n"
        f"subject: {item['subject']}\n\n{item['link']}\n"
    )
    try:
        mail.send_mail(subject, text, None, lines(rule.emails), fail_silently=False)
    except (OSError, mail.BadHeaderError) as error:
        if isinstance(error, TimeoutError | socket.timeout):
            return "timeout"
        if isinstance(error, ConnectionRefusedError):
            return "refused"
        return f"{type(error).__name__}: {error}"[:400]
    return ""


def retry_after(attempts: int) -> dt.timedelta:
    """How long after its ``attempts``-th failed try a notification is tried again."""
    base = settings.EVIDENCE_ALERTS_RETRY_SECONDS
    return dt.timedelta(seconds=min(base * 2 ** (attempts - 1), base * 60))


@dataclasses.dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    gave_up: int = 0
    busy: int = 0  # claimed by another worker


def deliver_due(*, now: dt.datetime | None = None) -> DeliveryReport:
    """Send the pending notifications whose time has come, oldest first, at most ``DELIVER_BATCH``."""
    now = now or protocol.utc_now()
    report = DeliveryReport()
    if not settings.EVIDENCE_PUBLIC_URL and Notification.objects.filter(_due(now)).exists():
        log.warning("EVIDENCE_PUBLIC_URL is not set: notifications carry a path, not a link",
                    extra={"event": "alerts_no_public_url"})  # fmt: skip
    due = Notification.objects.filter(_due(now)).select_related("rule").order_by("next_at", "pk")
    for notification in due[:DELIVER_BATCH]:
        outcome = deliver(notification, now=now)
        setattr(report, outcome, getattr(report, outcome) + 1)
    return report


def _due(now: dt.datetime) -> Q:
    return Q(state=Notification.PENDING, next_at__lte=now, closed_at__isnull=True, rule__enabled=True)


def deliver(notification: Notification, *, now: dt.datetime) -> str:
    """One try: ``delivered``, ``failed`` (tried again later) or ``gave_up``. The try is claimed
    first (its next time moved past the try's longest), so two workers never send it both."""
    lease = now + dt.timedelta(seconds=settings.EVIDENCE_WEBHOOK_TIMEOUT_SECONDS * 4 + 30)
    mine = Notification.objects.filter(pk=notification.pk, state=Notification.PENDING, attempts=notification.attempts)
    claimed = mine.update(next_at=lease, attempts=F("attempts") + 1)
    if not claimed:
        return "busy"  # another worker has it
    attempts = notification.attempts + 1
    rule = notification.rule
    status: int | None = None
    if rule.channel == NotificationRule.WEBHOOK:
        body = json.dumps(payload(notification), ensure_ascii=False, sort_keys=True).encode()
        status, error = post_webhook(rule, body)
    else:
        error = send_email(rule, notification)
    at = protocol.utc_now()
    if not error:
        Notification.objects.filter(pk=notification.pk).update(state=Notification.SENT, sent_at=at, next_at=None)
        DeliveryAttempt.objects.create(notification=notification, at=at, outcome=DeliveryAttempt.DELIVERED,
                                       status=status)  # fmt: skip
        log.info("notification sent", extra={"event": "notification_sent", "run_id": notification.run_id,
                                              "rule": rule.pk, "key": notification.key})  # fmt: skip
        return DeliveryAttempt.DELIVERED
    if attempts >= settings.EVIDENCE_ALERTS_MAX_ATTEMPTS:
        Notification.objects.filter(pk=notification.pk).update(state=Notification.GAVE_UP, next_at=None)
        DeliveryAttempt.objects.create(notification=notification, at=at, outcome=DeliveryAttempt.GAVE_UP,
                                       status=status, error=error)  # fmt: skip
        log.warning("notification given up", extra={"event": "notification_gave_up", "rule": rule.pk,
                                                     "key": notification.key, "detail": error})  # fmt: skip
        return DeliveryAttempt.GAVE_UP
    next_at = at + retry_after(attempts)
    Notification.objects.filter(pk=notification.pk).update(next_at=next_at)
    DeliveryAttempt.objects.create(notification=notification, at=at, outcome=DeliveryAttempt.FAILED, status=status,
                                   error=error, next_at=next_at)  # fmt: skip
    log.warning("notification not delivered yet", extra={"event": "notification_failed", "rule": rule.pk,
                                                          "key": notification.key, "detail": error})  # fmt: skip
    return DeliveryAttempt.FAILED


def next_due() -> dt.datetime | None:
    """When the earliest pending notification is to be tried."""
    row = Notification.objects.filter(state=Notification.PENDING, closed_at__isnull=True, next_at__isnull=False)
    return row.order_by("next_at").values_list("next_at", flat=True).first()


def remove_old_log(*, now: dt.datetime) -> int:
    """The delivery log's rows past ``EVIDENCE_ALERTS_LOG_KEEP_DAYS``, and closed notifications
    as old with no row left, removed in batches."""
    limit = now - dt.timedelta(days=settings.EVIDENCE_ALERTS_LOG_KEEP_DAYS)
    removed = 0
    while True:
        ids = list(DeliveryAttempt.objects.filter(at__lt=limit).values_list("pk", flat=True)[:LOG_DELETE_BATCH])
        if not ids:
            break
        removed += DeliveryAttempt.objects.filter(pk__in=ids).delete()[0]
    Notification.objects.filter(closed_at__lt=limit, attempts_made__isnull=True).delete()
    return removed


# The worker's task -------------------------------------------------------------------------


def run(*, now: dt.datetime | None = None) -> dict[str, object]:
    """What the ``notify`` task does: scan, deliver what is due, trim the log."""
    now = now or protocol.utc_now()
    found = scan(now=now)
    sent = deliver_due(now=now)
    remove_old_log(now=now)
    return {"opened": found.opened, "closed": found.closed, "delivered": sent.delivered, "failed": sent.failed,
            "gave_up": sent.gave_up}  # fmt: skip


def queue(*, at: dt.datetime | None = None) -> bool:
    """Queue the ``notify`` task (to run at ``at``, or at once) unless one already waits to run
    by then: an import pass every few seconds queues one at a time, not one a pass."""
    from django_tasks_db.models import DBTaskResult

    if not NotificationRule.objects.filter(enabled=True).exists():
        return False
    waiting = DBTaskResult.objects.filter(task_path=notify.module_path)
    if waiting.ready().exists() or (at is not None and waiting.filter(status="READY", run_after__lte=at).exists()):
        return False
    (notify.using(run_after=at) if at is not None else notify).enqueue()
    return True


# The rules, as the admin role makes and changes them (/notifications/) --------------------

RULE_ACTIONS = ("enable", "disable", "delete")


def rule_add(*, user: Any, fields: dict[str, Any]) -> NotificationRule:
    """A new rule from a valid ``NotificationRuleForm``'s data."""
    channel = str(fields["channel"])
    made = NotificationRule.objects.create(
        name=fields["name"], created_by=user, created_at=protocol.utc_now(), channel=channel,
        url=fields["url"] if channel == NotificationRule.WEBHOOK else "",
        secret=fields["secret"] if channel == NotificationRule.WEBHOOK else "",
        emails="\n".join(lines(str(fields["emails"]))) if channel == NotificationRule.EMAIL else "",
        runs=fields["runs"], host=fields["host"], tools="\n".join(lines(str(fields["tools"]))),
        severities=" ".join(fields["severities"]), kinds="\n".join(fields["kinds"]),
    )  # fmt: skip
    log.info("notification rule added", extra={"event": "notification_rule_added", "rule": made.pk,
                                               "actor": getattr(user, "username", "")})  # fmt: skip
    return made


def rule_act(*, rule: NotificationRule, action: str, user: Any) -> None:
    """Turn a rule on or off, or remove it (with its notifications and their log)."""
    if action == "delete":
        rule.delete()
    else:
        NotificationRule.objects.filter(pk=rule.pk).update(enabled=action == "enable")
    log.info("notification rule changed", extra={"event": "notification_rule_" + action, "rule": rule.pk,
                                                 "actor": getattr(user, "username", "")})  # fmt: skip


def delivery_log() -> QuerySet[DeliveryAttempt]:
    """Every try, newest first (the page pages it by key)."""
    return DeliveryAttempt.objects.select_related("notification", "notification__rule")


@task()
def notify() -> dict[str, object]:
    """What the worker runs: tell the notification rules' destinations of the inbox's new items,
    then queue itself for the earliest retry still due."""
    done = run()
    later = next_due()
    if later is not None:
        queue(at=later)
    return done
