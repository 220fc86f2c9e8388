"""``manage.py demo_admin`` (examples/management/commands/demo_admin.py) on PostgreSQL and
SQLite: the published default password only with DEBUG on; with DEBUG off a password of the
operator's (not the default, 12 characters or more) or a random one, printed; a refused value
writes nothing."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db

DEFAULT = "admin-demo-password"
PRINTED = re.compile(r"^admin user: (\S+)  password: (\S+)$")


@pytest.fixture(autouse=True)
def no_demo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_ADMIN_USER", raising=False)
    monkeypatch.delenv("DEMO_ADMIN_PASSWORD", raising=False)


def demo_admin(*, debug: bool) -> tuple[str, str]:
    """Run the command; the user name and password it printed."""
    out = io.StringIO()
    with override_settings(DEBUG=debug):
        call_command("demo_admin", stdout=out)
    printed = PRINTED.match(out.getvalue().strip())
    assert printed, out.getvalue()
    return printed[1], printed[2]


def can_log_in(username: str, password: str) -> bool:
    return Client().login(username=username, password=password)


def test_debug_on_keeps_the_published_default() -> None:
    assert demo_admin(debug=True) == ("admin", DEFAULT)

    user = get_user_model().objects.get(username="admin")
    assert user.is_staff and user.is_superuser
    assert can_log_in("admin", DEFAULT)


def test_debug_on_takes_the_operators_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_ADMIN_USER", "ops")
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "short")

    assert demo_admin(debug=True) == ("ops", "short")
    assert can_log_in("ops", "short")


def test_debug_off_without_a_password_makes_a_random_one_and_prints_it() -> None:
    username, first = demo_admin(debug=False)
    _, second = demo_admin(debug=False)

    assert username == "admin"
    assert len(first) >= 20 and first != second != DEFAULT
    assert can_log_in("admin", second)
    assert not can_log_in("admin", first)
    assert not can_log_in("admin", DEFAULT)


def test_debug_off_resets_a_user_left_with_the_default() -> None:
    demo_admin(debug=True)
    assert can_log_in("admin", DEFAULT)

    _, password = demo_admin(debug=False)

    assert not can_log_in("admin", DEFAULT)
    assert can_log_in("admin", password)


def test_debug_off_takes_a_long_password_of_the_operators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "twelve-chars")

    assert demo_admin(debug=False) == ("admin", "twelve-chars")
    assert can_log_in("admin", "twelve-chars")


@pytest.mark.parametrize("existing", [False, True], ids=["no-user", "existing-user"])
@pytest.mark.parametrize("value", [DEFAULT, "eleven-char"], ids=["default", "too-short"])
def test_debug_off_refuses_a_weak_password_and_writes_nothing(
        monkeypatch: pytest.MonkeyPatch, value: str, existing: bool) -> None:
    users = get_user_model().objects
    if existing:
        users.create_user("admin", password="the-operators-own-pw", is_staff=False)
    before = list(users.values_list("username", "password", "is_staff", "is_superuser"))
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", value)

    out = io.StringIO()
    with override_settings(DEBUG=False), pytest.raises(CommandError, match="DEMO_ADMIN_PASSWORD"):
        call_command("demo_admin", stdout=out)

    assert out.getvalue() == ""
    assert list(users.values_list("username", "password", "is_staff", "is_superuser")) == before
    assert not can_log_in("admin", value)
