"""Create (or reset) the demo login and print it: `make demo` uses it."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from evidence.roles import ensure_roles


class Command(BaseCommand):
    help = "Create or reset the 'demo' user with a fresh random password, and print the login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="where the dashboard is served")

    def handle(self, *args, username: str, url: str, **options) -> None:
        password = secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        # The demo person holds every role, to try every page and act.
        user.groups.add(*ensure_roles().values())
        self.stdout.write(f"Log in at {url} as {username} / {password}")
