"""An idle worker's sleep (``Wakeup``): woken by a NOTIFY or a poke, never by one twice.

The LISTEN connection is read through libpq directly (``drain_notifications``); these
tests hold it to what psycopg's own reader did: every queued notification consumed, the
socket quiet again afterwards, a broken connection put aside instead of raised.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from jobs_engine import store
from jobs_engine.lanes.worker import Wakeup
from jobs_engine.store import is_postgres
from tests.db.test_enqueue import pg_connect

pytestmark = pytest.mark.django_db(transaction=True)

ASLEEP_S = 0.3


@pytest.fixture
def wakeup() -> Iterator[Wakeup]:
    waking = Wakeup(listen=True)
    yield waking
    waking.close()


def slept(wakeup: Wakeup, seconds: float) -> float:
    started = time.monotonic()
    wakeup.wait(seconds)
    return time.monotonic() - started


def notify(times: int = 1) -> None:
    with pg_connect(autocommit=True) as sender:
        for _ in range(times):
            sender.execute(f"NOTIFY {store.NOTIFY_CHANNEL}, 'fast'")


def test_a_poke_ends_the_wait_once(wakeup: Wakeup) -> None:
    wakeup.poke()
    wakeup.poke()
    assert slept(wakeup, 5) < 1
    assert slept(wakeup, ASLEEP_S) >= ASLEEP_S * 0.9, "a second poke woke the next wait too"


def sleeps_without_listener(wakeup: Wakeup) -> bool:
    """SQLite has no NOTIFY: no LISTEN connection, and the wait is the poll delay."""
    return wakeup._listener is None and slept(wakeup, ASLEEP_S) >= ASLEEP_S * 0.9


def test_notifications_wake_the_wait_once_and_are_all_consumed(wakeup: Wakeup) -> None:
    if not is_postgres():
        assert sleeps_without_listener(wakeup)
        return
    notify(times=3)
    assert slept(wakeup, 5) < 1, "a NOTIFY did not end the wait"
    assert wakeup._listener.pgconn.notifies() is None, "notifications left queued in libpq"
    assert slept(wakeup, ASLEEP_S) >= ASLEEP_S * 0.9, "the same notifications woke it again"
    notify()
    assert slept(wakeup, 5) < 1, "a later NOTIFY did not end the wait"


def test_a_broken_listener_is_put_aside_not_raised(wakeup: Wakeup) -> None:
    if not is_postgres():
        assert sleeps_without_listener(wakeup)
        return
    backend = wakeup._listener.info.backend_pid
    with pg_connect(autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    # The server's farewell message ends one wait, the closed socket the next.
    for _ in range(3):
        assert slept(wakeup, 5) < 1, "the closed connection did not end the wait"
        if wakeup._listener is None:
            break
    assert wakeup._listener is None, "the broken LISTEN connection was kept"
    assert slept(wakeup, ASLEEP_S) >= ASLEEP_S * 0.9, "waits on the poll delay meanwhile"
