"""``manage.py api_token USERNAME --name NAME``: a token for the JSON API, printed once."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from evidence.api import new_token
from receipts.models import ApiToken


class Command(BaseCommand):
    help = "Make a token for the JSON API that acts as USERNAME (with its roles); print it once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", required=True, help="what the token is for (a script, a host)")
        parser.add_argument("--revoke", action="store_true", help="delete the user's tokens of that name instead")

    def handle(self, *args, username: str, name: str, revoke: bool, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if revoke:
            deleted, _ = ApiToken.objects.filter(user=user, name=name).delete()
            self.stdout.write(f"revoked {deleted} token(s) named {name!r} of {username}")
            return
        self.stdout.write(new_token(user=user, name=name))
