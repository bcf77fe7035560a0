"""``manage.py api_token USERNAME --name NAME [--expires-in-days DAYS]``: a token for the JSON API, printed once."""

from __future__ import annotations

import datetime as dt

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from evidence.models import ApiToken
from evidence.web.api import new_token


class Command(BaseCommand):
    help = "Make a token for the JSON API that acts as USERNAME (with its roles); print it once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", required=True, help="what the token is for (a script, a host)")
        parser.add_argument("--revoke", action="store_true", help="delete the user's tokens of that name instead")
        parser.add_argument(
            "--expires-in-days", type=int, default=None, metavar="DAYS",
            help="the token stops working after DAYS days (default: until revoked, a password change or deactivation)",
        )  # fmt: skip

    def handle(self, *args, username: str, name: str, revoke: bool, expires_in_days: int | None, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if revoke:
            deleted, _ = ApiToken.objects.filter(user=user, name=name).delete()
            self.stdout.write(f"revoked {deleted} token(s) named {name!r} of {username}")
            return
        if expires_in_days is not None and not 1 <= expires_in_days <= 3650:
            raise CommandError("--expires-in-days must be from 1 to 3650")
        expires_at = timezone.now() + dt.timedelta(days=expires_in_days) if expires_in_days else None
        self.stdout.write(new_token(user=user, name=name, expires_at=expires_at))
