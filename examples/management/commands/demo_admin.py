"""Create (or reset) the demo admin user and print its credentials.

With DEBUG on (``scripts/run.sh``) the password is ``DEMO_ADMIN_PASSWORD`` or the published
default. With DEBUG off the published default is never set: ``DEMO_ADMIN_PASSWORD`` must be
another value of at least ``MIN_LENGTH`` characters (else nothing is written), and without
it a random password is made and printed.
"""

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

# Published in docs/operators.md: fine for a laptop, refused with DEBUG off.
DEFAULT_PASSWORD = "admin-demo-password"
MIN_LENGTH = 12


def choose_password() -> str:
    chosen = os.environ.get("DEMO_ADMIN_PASSWORD", "")
    if settings.DEBUG:
        return chosen or DEFAULT_PASSWORD
    if not chosen:
        return secrets.token_urlsafe(18)
    if chosen == DEFAULT_PASSWORD:
        raise CommandError(
            "DEMO_ADMIN_PASSWORD is the published default and DEBUG is off: set another "
            f"value of at least {MIN_LENGTH} characters, or unset it for a random one")
    if len(chosen) < MIN_LENGTH:
        raise CommandError(
            f"DEMO_ADMIN_PASSWORD is shorter than {MIN_LENGTH} characters and DEBUG is off: "
            "set a longer value, or unset it for a random one")
    return chosen


class Command(BaseCommand):
    help = ("Create (or reset) the demo admin user and print its credentials (DEBUG off: "
            "DEMO_ADMIN_PASSWORD or a random password, never the published default).")

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = choose_password()  # before any write: a refused value changes nothing
        with transaction.atomic():
            user, _ = get_user_model().objects.get_or_create(username=username)
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
        self.stdout.write(f"admin user: {username}  password: {password}")
