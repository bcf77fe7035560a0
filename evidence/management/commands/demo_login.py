"""Create (or reset) the demo login and print it: `make demo` uses it."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from evidence.lib.roles import ensure_roles


class Command(BaseCommand):
    help = "Create or reset the 'demo' user with a fresh random password, and print the login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="where the dashboard is served")
        parser.add_argument(
            "--banner",
            action="store_true",
            help="print the login as a short block (`make demo` shows it), not one line",
        )

    def handle(self, *args, username: str, url: str, banner: bool, **options) -> None:
        password = secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        # The demo person holds every role, to try every page and act.
        user.groups.add(*ensure_roles().values())
        if not banner:
            self.stdout.write(f"Log in at {url} as {username} / {password}")
            return
        # The login only: this command serves nothing. `make demo` prints the block once its server
        # answers, and adds what only it knows (that the demo runs, its logs, how to stop it).
        self.stdout.write(
            "\n".join(
                (
                    "",
                    "  Callproof demo login",
                    f"    Open       {url}",
                    f"    User       {username}",
                    f"    Password   {password}",
                    "    Start at   the Inbox: settle send-message-killed",
                )
            )
        )
