import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or reset) the demo admin user and print its credentials."

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "admin-demo-password")
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"admin user: {username}  password: {password}")
