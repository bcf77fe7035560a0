"""``manage.py host add NAME`` (a key for ``callproof ship``, printed once), ``host revoke NAME``,
``host move OLD NEW --reason TEXT`` (hand a host's runs to another host name)."""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evidence.ingest import shipping
from evidence.lib import hosts


class Command(BaseCommand):
    help = (
        "Operate the fleet's hosts. add: a key for the host's shipper, printed once; revoke: end its keys; "
        "move: hand every run of host OLD (and the decisions to write into them) to NEW."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="make a key for host NAME's shipper (callproof ship), printed once")
        add.add_argument("name", help="the host's name: its runs are shipped and shown under it")
        revoke = actions.add_parser("revoke", help="revoke every key of host NAME: its shipper is refused at once")
        revoke.add_argument("name")
        move = actions.add_parser(
            "move", help="hand every run of host OLD to host NEW (a renamed or replaced machine); OLD is retired"
        )
        move.add_argument("old", help="the host name the runs were imported under")
        move.add_argument("new", help="the host name that ships them from now on (EVIDENCE_HOST_NAME of its watch)")
        move.add_argument("--reason", required=True, help="why: kept in the audit of every run moved")

    def handle(self, *args, action: str, **options) -> None:
        if action == "add":
            try:
                self.stdout.write(shipping.new_key(options["name"]))
            except ValueError as error:
                raise CommandError(str(error)) from None
            return
        if action == "revoke":
            self.stdout.write(f"{shipping.revoke(options['name'])} key(s) of host {options['name']} revoked")
            return
        if action == "move":
            try:
                moved = hosts.move(old=options["old"], new=options["new"], reason=options["reason"],
                                   actor=f"manage.py host move ({getpass.getuser()})")  # fmt: skip
            except hosts.MoveRefusedError as refused:
                raise CommandError(str(refused)) from None
            self.stdout.write(f"{moved} run(s) of host {options['old']} are host {options['new']}'s now")
