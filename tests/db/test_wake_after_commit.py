"""An enqueue wakes the workers of its lanes that wait, once its transaction commits.

A worker about to sleep asks for a wake-up (``store.wakeups_wanted``); an enqueue whose
insert finds the ask sends the lane's NOTIFY from a statement after its commit
(``enqueueing.wake_workers``), and an enqueue that finds none runs nothing after it. These
tests hold each promise of that: nothing before the commit or after a rollback, nothing to
a lane no worker waits on, one wake-up per ask, no statement after a commit nobody waits
for, and no lost wake-up for a worker that asks while the enqueue's transaction is still
open (the enqueue holds its lanes' lock until its commit, and the ask says so). SQLite has
neither NOTIFY nor the statement (the ``listener`` fixture shows it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs_engine import enqueue, enqueue_many, store
from jobs_engine.models import Job
from jobs_engine.registry import Target
from tests.conftest import is_postgres
from tests.db.test_enqueue import Boom, pg_connect

pytestmark = pytest.mark.django_db(transaction=True)

QUIET_S = 0.3  # how long "no notification" is listened for


@pytest.fixture
def listener(targets: Callable[..., Target]) -> Iterator[psycopg.Connection | None]:
    """A connection listening for the engine's wake-ups; None on SQLite, once it was shown
    that SQLite's enqueue runs the insert and nothing after it (no NOTIFY there)."""
    targets("t:fast")
    targets("t:long", lane="long")
    if not is_postgres():
        with CaptureQueriesContext(connection) as captured:
            enqueue("t:fast", 1)
        assert captured.captured_queries
        assert not any("notify" in q["sql"].lower() or store.WAKE_FUNCTION in q["sql"]
                       for q in captured.captured_queries)
        assert Job.objects.filter(payload=1).count() == 1
        Job.objects.all().delete()
        yield None
        return
    # A test before this one may have left an ask unanswered (the wait and wake sequences
    # are not rolled back): it is answered here, before anyone listens.
    store.workers_wake({"fast": (), "long": ()})
    with pg_connect(autocommit=True) as listening:
        listening.execute(f"LISTEN {store.NOTIFY_CHANNEL}")
        yield listening


def payloads(listener: psycopg.Connection, timeout: float = QUIET_S) -> list[str]:
    """The notifications' payloads within ``timeout``, in order."""
    return [n.payload for n in listener.notifies(timeout=timeout)]


def notified(listener: psycopg.Connection, timeout: float = QUIET_S) -> list[str]:
    """The lanes notified within ``timeout`` (each notification once, in order)."""
    return [payload.partition(":")[0] for payload in payloads(listener, timeout)]


def wake_statements(captured: CaptureQueriesContext) -> int:
    return sum(store.WAKE_FUNCTION in q["sql"] for q in captured.captured_queries)


def test_a_commit_wakes_a_lane_only_while_a_worker_of_it_waits(
        listener: psycopg.Connection | None) -> None:
    if listener is None:
        return
    enqueue("t:fast", 1)
    assert notified(listener) == [], "no worker asked: nothing to wake"
    store.wakeups_wanted({"fast"})
    enqueue("t:long", 2)
    assert notified(listener) == [], "only the fast lane's worker waits"
    enqueue("t:fast", 3)
    assert notified(listener) == ["fast"]
    enqueue("t:fast", 4)
    assert notified(listener) == [], "one wake-up per ask: that worker is awake"
    store.wakeups_wanted({"fast", "long"})
    enqueue_many([{"target": "t:fast", "payload": n, "key": f"k{n % 2}"} for n in range(5)]
                 + [{"target": "t:long", "payload": n} for n in range(3)])
    assert sorted(notified(listener)) == ["fast", "long"]


def test_the_wake_up_follows_the_commit_never_an_open_or_rolled_back_transaction(
        listener: psycopg.Connection | None) -> None:
    if listener is None:
        return
    store.wakeups_wanted({"fast", "long"})
    with transaction.atomic():
        enqueue("t:fast", 1, dedupe_key="n:1")
        enqueue("t:long", 2, dedupe_key="n:2")
        assert notified(listener) == [], "woken before the commit"
        assert Job.objects.count() == 2
    assert sorted(notified(listener)) == ["fast", "long"]

    store.wakeups_wanted({"fast"})
    with pytest.raises(Boom), transaction.atomic():
        enqueue("t:fast", 3, dedupe_key="n:3")
        raise Boom
    assert notified(listener) == [], "woken by a rollback"
    assert enqueue("t:fast", 1, dedupe_key="n:1").inserted is False
    assert notified(listener) == [], "a duplicate inserted nothing to wake for"
    enqueue("t:fast", 4, dedupe_key="n:4")
    assert notified(listener) == ["fast"], "the rollback used up the worker's ask"


def ask(lanes: str) -> bool:
    """A worker's ask from a connection of its own (``store.wakeups_wanted``)."""
    with pg_connect(autocommit=True) as worker:
        return worker.execute(f"SELECT {store.ASK_FUNCTION}(%s::text[])",
                              ["{" + lanes + "}"]).fetchone()[0]


def test_a_worker_that_asks_while_the_enqueue_is_open_is_told_so(
        listener: psycopg.Connection | None) -> None:
    """The race a look at the insert alone would lose: the worker polled before the
    commit, so it found nothing, then asked; the enqueue, which looked before the ask,
    wakes nobody at its commit. It holds its lanes' lock until then, so the ask says an
    enqueue is open, and the worker looks again soon (``WorkerProcess._loop``)."""
    if listener is None:
        return
    assert ask("fast") is True and ask("long") is True
    enqueue("t:fast", 0)  # answers those asks
    enqueue("t:long", 0)
    assert sorted(notified(listener)) == ["fast", "long"]
    with transaction.atomic():
        enqueue("t:fast", 1)
        assert ask("fast") is False, "the open enqueue was not seen"
        assert ask("long") is True, "another lane's enqueue is not this lane's"
        assert ask("long,fast") is False
        assert notified(listener) == []
    assert notified(listener) == [], "it looked before the asks"
    assert ask("fast") is True, "the lock outlived the commit"
    with pytest.raises(Boom), transaction.atomic():
        enqueue("t:long", 2)
        assert ask("long") is False
        raise Boom
    assert ask("long") is True, "the lock outlived the rollback"


def test_an_enqueue_that_finds_no_worker_waiting_runs_no_statement_after_its_commit(
        listener: psycopg.Connection | None) -> None:
    """While the workers are busy, an enqueue is one statement: the look at the wait
    numbers rides its insert."""
    if listener is None:
        return
    enqueue("t:fast", 0)  # answers the asks earlier tests left
    enqueue("t:long", 0)
    notified(listener)
    with CaptureQueriesContext(connection) as captured:
        enqueue("t:fast", 1)
        with transaction.atomic():
            enqueue("t:fast", 2)
            enqueue_many([{"target": "t:long", "payload": n} for n in range(3)])
    assert wake_statements(captured) == 0
    sent = [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 3 and all(store.ENQUEUING_FUNCTION in q for q in sent), sent
    assert notified(listener) == []
    store.wakeups_wanted({"fast"})
    with CaptureQueriesContext(connection) as captured:
        enqueue("t:fast", 3)
    assert wake_statements(captured) == 1
    assert notified(listener) == ["fast"]


def test_one_statement_wakes_every_lane_of_a_transaction(
        listener: psycopg.Connection | None) -> None:
    if listener is None:
        return
    store.wakeups_wanted({"fast", "long"})
    with CaptureQueriesContext(connection) as captured:
        with transaction.atomic():
            for n in range(5):
                enqueue("t:fast", n)
            with transaction.atomic():  # a savepoint's enqueue joins the same wake-up
                enqueue("t:long", 9)
            enqueue_many([{"target": "t:long", "payload": n} for n in range(3)])
        assert wake_statements(captured) == 1
    assert sorted(notified(listener)) == ["fast", "long"]
    store.wakeups_wanted({"fast"})
    with CaptureQueriesContext(connection) as captured:
        enqueue("t:fast", 1)
        enqueue("t:fast", 2)
    assert wake_statements(captured) == 1, "autocommit: after the commit that found the ask"


def test_a_savepoint_rolled_back_leaves_the_wake_up_of_a_later_enqueue(
        listener: psycopg.Connection | None) -> None:
    """Django drops the after-commit hooks of a savepoint rolled back, the wake-up among
    them: a later enqueue of the transaction must register its own."""
    if listener is None:
        return
    store.wakeups_wanted({"fast"})
    with transaction.atomic():
        with pytest.raises(Boom), transaction.atomic():
            enqueue("t:fast", 1)
            raise Boom
        enqueue("t:fast", 2)
    assert notified(listener, 2) == ["fast"]
    assert list(Job.objects.values_list("payload", flat=True)) == [2]


def test_a_transaction_django_does_not_manage_notifies_at_its_commit(
        listener: psycopg.Connection | None) -> None:
    """Autocommit off and no ``atomic``: there is no after-commit hook, so the NOTIFY
    rides the transaction when a worker waits, and nothing does when none waits."""
    if listener is None:
        return
    transaction.set_autocommit(False)
    try:
        enqueue("t:fast", 1)
        transaction.commit()
        assert notified(listener) == [], "nobody waited"
        store.wakeups_wanted({"fast"})
        transaction.commit()
        enqueue("t:fast", 2)
        assert notified(listener) == []
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert notified(listener, 2) == ["fast"]
    assert Job.objects.count() == 2


def test_a_wake_up_that_fails_loses_no_job_and_raises_nothing(
        listener: psycopg.Connection | None, caplog: pytest.LogCaptureFixture) -> None:
    if listener is None:
        return
    store.wakeups_wanted({"fast"})
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER FUNCTION {store.WAKE_FUNCTION}(text[], text[]) RENAME TO away")
    try:
        with caplog.at_level(logging.WARNING, logger="jobs_engine.enqueueing"), \
                transaction.atomic():
            result = enqueue("t:fast", 1)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER FUNCTION away(text[], text[]) RENAME TO {store.WAKE_FUNCTION}")
    assert result.inserted and Job.objects.filter(id=result.job_id).exists()
    assert "could not wake the workers of fast" in caplog.text
    assert notified(listener) == []
    enqueue("t:fast", 2)
    assert notified(listener) == ["fast"], "the ask still stood for the next commit"


def test_with_notify_off_an_enqueue_sends_no_wake_up(
        listener: psycopg.Connection | None, jobs_settings: Callable[..., object]) -> None:
    if listener is None:
        return
    jobs_settings(NOTIFY=False)
    store.wakeups_wanted({"fast"})
    with CaptureQueriesContext(connection) as captured:
        enqueue("t:fast", 1)
    assert wake_statements(captured) == 0
    assert notified(listener) == []


def test_a_fast_lane_wake_up_names_the_targets_of_the_commit(
        listener: psycopg.Connection | None, targets: Callable[..., Target]) -> None:
    """The poll that answers it reads those targets (``store.wake_targets``), not every
    registered one; a long-lane one names none (its reserve reads every target at once)."""
    if listener is None:
        return
    targets('t:"quoted" \\ name')
    store.wakeups_wanted({"fast", "long"})
    with transaction.atomic():
        enqueue("t:fast", 1)
        enqueue('t:"quoted" \\ name', 2)
        enqueue("t:long", 3)
    got = sorted(payloads(listener))
    assert got == ['fast:["t:\\"quoted\\" \\\\ name","t:fast"]', "long"], got
    assert store.wake_targets(got) == frozenset({'t:"quoted" \\ name', "t:fast"})


def test_every_insert_of_fast_lane_rows_is_counted(listener: psycopg.Connection | None
                                                   ) -> None:
    """``ENQUEUES_FAST`` moves with every insert of fast-lane rows, under the lane's lock,
    and after a commit that found a worker waiting; a busy worker reads its idle targets
    only when it moved (or an enqueue held the lock, ``Reads``)."""
    if listener is None:
        return

    def count() -> int:
        with pg_connect(autocommit=True) as reader:
            return reader.execute(f"SELECT COALESCE(pg_sequence_last_value("
                                  f"'{store.ENQUEUES_FAST}'), 0)").fetchone()[0]

    before = count()
    with transaction.atomic():
        enqueue("t:fast", 1)
        inserted = count()
        assert inserted > before, "not counted at the insert"
    assert count() == inserted, "nobody waited: nothing ran after the commit"
    store.wakeups_wanted({"fast"})
    enqueue("t:fast", 2)
    assert count() == inserted + (inserted - before) + 1, "not counted after the commit"
