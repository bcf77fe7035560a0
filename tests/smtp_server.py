"""A real SMTP server on loopback for the SMTP adapter's tests (aiosmtpd, the `test` extra).

    python -m tests.smtp_server MAILDIR PORT_FILE [--lose-answers]

Stores every message it accepts in the Maildir MAILDIR (aiosmtpd's own message
store) and writes the port it listens on, on 127.0.0.1, to PORT_FILE. With
``--lose-answers`` it stores a message and closes the connection before its
"250 OK" goes out: the message is taken, its answer lost. It refuses every
recipient named ``nobody@...``.

For the conformance kit, with CALLPROOF_TEST_SMTP_PORT and CALLPROOF_TEST_MAILDIR
set: ``adapter`` is a zero-argument factory, ``count_messages`` the counter.
"""

from __future__ import annotations

import argparse
import mailbox
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts.adapters.smtp import SmtpAdapter, message_id

EXAMPLE = {"to": ["ops@example.com"], "subject": "Deployed", "body": "The release is out.\n"}


def adapter() -> SmtpAdapter:
    """The adapter for the server the test started (its port in CALLPROOF_TEST_SMTP_PORT)."""
    made = SmtpAdapter("127.0.0.1", int(os.environ["CALLPROOF_TEST_SMTP_PORT"]), sender="agent@example.com", timeout=10)
    made.example_args = dict(EXAMPLE)  # type: ignore[attr-defined]  # what the kit sends
    made.failing_args = dict(EXAMPLE, to=["nobody@example.com"])  # type: ignore[attr-defined]  # the server refuses it
    return made


def messages_with_id(maildir: Path, wanted: str) -> list[mailbox.MaildirMessage]:
    """The stored messages whose Message-ID is ``wanted``."""
    return [message for message in mailbox.Maildir(maildir, create=False) if message["Message-ID"] == wanted]


def count_messages(run_dir: Path, args: Mapping[str, Any], call_id: str) -> int:
    """The kit's counter: messages in the store carrying the call's Message-ID."""
    wanted = message_id(call_id, args["message_id_domain"])
    return len(messages_with_id(Path(os.environ["CALLPROOF_TEST_MAILDIR"]), wanted))


def main() -> None:
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Mailbox

    parser = argparse.ArgumentParser()
    parser.add_argument("maildir")
    parser.add_argument("port_file")
    parser.add_argument("--lose-answers", action="store_true")
    parser.add_argument("--smtputf8", action="store_true", help="offer SMTPUTF8 (RFC 6531): non-ASCII addresses")
    options = parser.parse_args()

    class Store(Mailbox):
        async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:  # noqa: N802
            if address.startswith("nobody@"):
                return "550 5.1.1 no such mailbox"
            envelope.rcpt_tos.append(address)
            return "250 OK"

        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook
            status = await super().handle_DATA(server, session, envelope)
            if options.lose_answers:
                server.transport.close()  # stored, and the answer never goes out
            return status

    with socket.socket() as probe:  # a free port, chosen by the kernel
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(Store(options.maildir), hostname="127.0.0.1", port=port, enable_SMTPUTF8=options.smtputf8)
    controller.start()
    Path(options.port_file).write_text(str(port))
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    controller.stop()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
