"""``send_email``: an e-mail through an SMTP server, its Message-ID derived from the call_id.

Standard library only (``smtplib``, ``email``). SMTP has no idempotency key and
no way to ask a mailbox whether a message arrived, so the adapter has no
``query``: a message whose answer was lost is a call in doubt, and a person
decides by searching the mailbox for its Message-ID, ``<call_id@domain>``. The
dashboard's doubt panel shows what to search for (``email_evidence``,
registered for ``send_email`` in ``receipts.doubt``).

What is known to have sent nothing is ``Rejected`` (the server not reached, the
sender or every recipient refused, DATA refused, the message refused after it
was sent); a connection that breaks once the message's bytes went out is
``OutcomeUnknown``: the server may have taken it.
"""

from __future__ import annotations

import contextlib
import email.policy
import email.utils
import re
import smtplib
from collections.abc import Mapping
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from receipts.tools import UNCLEAR, Evidence, Fact, OutcomeUnknown, Rejected, short_text

DEFAULT_DOMAIN = "callproof.invalid"  # .invalid never resolves: a Message-ID's right side needs no real host
_DOMAIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_ADDRESS = re.compile(r"[^\s<>()\[\],;:\"@]+@[A-Za-z0-9.-]+")
_ARGS = {"to", "subject", "body", "from", "message_id_domain"}


def message_id(call_id: str, domain: str = DEFAULT_DOMAIN) -> str:
    """The Message-ID of the call's e-mail: the same call, the same id, in every process."""
    return f"<{call_id}@{domain}>"


def _address(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value.strip()):
        raise Rejected(f"{what} must be one plain e-mail address (name@domain), not {short_text(value, 80)}")
    return value.strip()


def _needs_smtputf8(args: Mapping[str, Any]) -> bool:
    """An address with a non-ASCII character (``josé@example.com``) goes out only with SMTPUTF8 (RFC 6531)."""
    return not all(address.isascii() for address in [args["from"], *args["to"]])


def _kind(code: int) -> str:
    """A 4xx reply is the server's "not now"; anything else is its "no"."""
    return "retryable" if 400 <= code < 500 else "permanent"


class SmtpAdapter:
    """Sends one e-mail per call through ``host:port``; not queryable (a person decides a call in doubt)."""

    name = "send_email"
    version = "1.0.0"

    def __init__(
        self,
        host: str = "localhost",
        port: int = 25,
        *,
        sender: str,
        domain: str = DEFAULT_DOMAIN,
        timeout: float = 30.0,
        starttls: bool = False,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        if not _DOMAIN.fullmatch(domain):
            raise ValueError(f"the Message-ID domain {domain!r} is not a host name")
        self.host, self.port, self.timeout = host, port, timeout
        self.sender = _address(sender, "the sender")
        self.domain = domain
        self.starttls, self.username, self.password = starttls, username, password

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Recipients sorted and without repeats; the sender and the Message-ID's domain written in.

        Both come from the adapter's settings unless the args give them, so the
        receipt alone says which Message-ID to search for. Normalising the result
        again changes nothing.
        """
        if not isinstance(args, Mapping):
            raise Rejected("args must be a JSON object")
        unknown = set(args) - _ARGS
        if unknown:
            raise Rejected(f"unknown argument(s): {', '.join(sorted(unknown))}")
        recipients = args.get("to")
        recipients = [recipients] if isinstance(recipients, str) else recipients
        if not isinstance(recipients, list) or not recipients:
            raise Rejected("argument 'to' must be an address or a non-empty list of addresses")
        subject, body = args.get("subject"), args.get("body")
        if not isinstance(subject, str) or "\r" in subject or "\n" in subject:
            raise Rejected("argument 'subject' must be one line of text")  # a header: no line breaks in it
        if not isinstance(body, str):
            raise Rejected("argument 'body' must be text")
        domain = args.get("message_id_domain", self.domain)
        if not isinstance(domain, str) or not _DOMAIN.fullmatch(domain):
            raise Rejected("argument 'message_id_domain' must be a host name")
        return {
            "from": _address(args.get("from", self.sender), "argument 'from'"),
            "to": sorted({_address(recipient, "each recipient") for recipient in recipients}),
            "subject": subject,
            "body": body,
            "message_id_domain": domain,
        }

    def message(self, args: Mapping[str, Any], call_id: str) -> EmailMessage:
        """The e-mail the call sends."""
        # Headers unfolded (up to RFC 5322's 998): the ids stay whole on one line, to be searched for.
        policy = email.policy.SMTPUTF8 if _needs_smtputf8(args) else email.policy.SMTP
        message = EmailMessage(policy=policy.clone(max_line_length=998))
        message["From"] = args["from"]
        message["To"] = ", ".join(args["to"])
        message["Subject"] = args["subject"]
        message["Message-ID"] = message_id(call_id, args["message_id_domain"])
        message["Date"] = email.utils.formatdate(usegmt=True)
        message["X-Callproof-Call-Id"] = call_id
        message.set_content(args["body"])
        return message

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        data = self.message(args, call_id).as_bytes()
        wanted = message_id(call_id, args["message_id_domain"])
        try:
            client = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        except (OSError, smtplib.SMTPException) as error:
            raise Rejected(f"the mail server was not reached, nothing was sent: {error}", kind="retryable") from error
        try:
            refused = self._envelope(client, args)
            reply = self._data(client, data, wanted)
        finally:
            with contextlib.suppress(OSError, smtplib.SMTPException):
                client.close()
        accepted = [recipient for recipient in args["to"] if recipient not in refused]
        return {"message_id": wanted, "accepted": accepted, "refused": refused, "reply": reply}

    def _envelope(self, client: smtplib.SMTP, args: Mapping[str, Any]) -> dict[str, list[Any]]:
        """Greeting, sender, recipients: nothing of the message has gone out yet, so any failure is a rejection."""
        try:
            client.ehlo_or_helo_if_needed()
            if self.starttls:
                client.starttls()
                client.ehlo()
            if self.username is not None:
                client.login(self.username, self.password or "")
            options: list[str] = []
            if _needs_smtputf8(args):
                if not client.has_extn("smtputf8"):
                    raise Rejected(
                        "an address has non-ASCII characters, and the server does not offer SMTPUTF8: nothing was sent",
                        kind="permanent",
                    )
                options = ["SMTPUTF8"]
            code, reply = client.mail(args["from"], options)
            if code != 250:
                said = reply.decode(errors="replace")
                raise Rejected(f"the server refused the sender: {code} {said}", kind=_kind(code))
            refused: dict[str, list[Any]] = {}
            for recipient in args["to"]:
                code, reply = client.rcpt(recipient)
                if code not in (250, 251):
                    refused[recipient] = [code, reply.decode(errors="replace")]
        except smtplib.SMTPResponseException as error:
            said = f"nothing was sent: {error.smtp_code} {error.smtp_error!r}"
            raise Rejected(said, kind=_kind(error.smtp_code)) from error
        except (OSError, smtplib.SMTPException) as error:
            raise Rejected(f"nothing was sent, the connection failed first: {error}", kind="retryable") from error
        if len(refused) == len(args["to"]):
            codes = sorted({code for code, _ in refused.values()})
            raise Rejected(f"every recipient was refused, nothing was sent: {refused}", kind=_kind(codes[-1]))
        return refused

    def _data(self, client: smtplib.SMTP, data: bytes, wanted: str) -> str:
        """The message itself. Once its bytes go out, only the server's answer says whether it took it."""
        try:
            code, reply = client.docmd("DATA")
        except (OSError, smtplib.SMTPException) as error:
            said = f"nothing was sent, the connection failed before the message: {error}"
            raise Rejected(said, kind="retryable") from error
        if code != 354:
            said = f"the server refused DATA, nothing was sent: {code} {reply.decode(errors='replace')}"
            raise Rejected(said, kind=_kind(code))
        # Dot-stuffing (RFC 5321, 4.5.2): a line starting with "." gets another one.
        payload = re.sub(rb"(?m)^\.", b"..", data)
        payload += b"" if payload.endswith(b"\r\n") else b"\r\n"
        try:
            client.send(payload + b".\r\n")
            code, reply = client.getreply()
        except (OSError, smtplib.SMTPException) as error:
            raise OutcomeUnknown(
                f"the connection broke after the message was sent, before the server answered ({error}): "
                f"search the mailbox for Message-ID {wanted}"
            ) from error
        text = reply.decode(errors="replace")
        if code != 250:
            raise Rejected(f"the server did not take the message: {code} {text}", kind=_kind(code))
        with contextlib.suppress(OSError, smtplib.SMTPException):
            client.quit()
        return f"{code} {text}"[:300]


# No ``evidence`` method on the adapter: the writer asks it before reusing a commit, and a mailbox
# cannot be read from here, so every commit would wait for a person. The dashboard gets this instead.
def email_evidence(
    run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
) -> Evidence:
    """What to search for in the mailbox: the Message-ID, the recipients, the subject. Never asks a server.

    ``args`` come from a receipt (data, possibly hostile): only shown, as text.
    """
    domain = args.get("message_id_domain") if isinstance(args, Mapping) else None
    if not isinstance(domain, str) or not _DOMAIN.fullmatch(domain):
        domain = DEFAULT_DOMAIN
    recipients = args.get("to") if isinstance(args, Mapping) else None
    shown = ", ".join(map(short_text, recipients)) if isinstance(recipients, list) else short_text(recipients)
    facts = [
        Fact("mail_not_asked", message_id=message_id(call_id, domain)),
        Fact(
            "mail_sent",
            to=short_text(shown, 300),
            sender=short_text(args.get("from") if isinstance(args, Mapping) else None),
        ),
        Fact("mail_subject", subject=short_text(args.get("subject") if isinstance(args, Mapping) else None, 200)),
    ]
    if isinstance(result, Mapping):
        facts.append(Fact("mail_answered", reply=short_text(result.get("reply"))))
    return Evidence(UNCLEAR, tuple(facts))
