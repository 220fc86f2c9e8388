"""An idle worker's sleep (``Wakeup``) and the poll that answers its end.

The sleep is woken by a NOTIFY or a poke, never by one twice. The LISTEN connection is
read through libpq directly (``drain_notifications``); these tests hold it to what
psycopg's own reader did: every queued notification consumed, the socket quiet again
afterwards, a broken connection put aside instead of raised. The poll after a sleep that
was woken goes straight to the rows, and leaves what fell due meanwhile to the next.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, transaction

from jobs_engine import enqueue, store
from jobs_engine.conf import load_settings
from jobs_engine.lanes.worker import Wakeup, WorkerProcess
from jobs_engine.registry import Target
from jobs_engine.store import is_postgres
from jobs_engine.store.planning import REPLAN_S, Planner
from tests.db.test_enqueue import pg_connect
from tests.helpers import FakeMonotonic

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


def test_pokes_before_a_wait_write_one_byte_and_the_next_poke_wakes_again(
        wakeup: Wakeup) -> None:
    for _ in range(100):  # a busy long lane: two pokes a job
        wakeup.poke()
    assert os.read(wakeup._read_fd, 4096) == b"!", "each poke wrote a byte of its own"
    os.write(wakeup._write_fd, b"!")  # put it back for the wait to read
    assert wakeup.wait(5) is True
    wakeup.poke()  # the wait read the byte: this poke must write again
    assert slept(wakeup, 5) < 1, "a poke after a wait was taken as already written"
    threading.Timer(0.1, wakeup.poke).start()  # from a handler's thread, mid-wait
    assert slept(wakeup, 5) < 1


def test_the_wait_says_whether_it_was_woken(wakeup: Wakeup) -> None:
    assert wakeup.wait(0.05) is False  # slept its time
    wakeup.poke()
    assert wakeup.wait(5) is True
    assert wakeup.wait(0) is False  # no sleep at all: a busy worker's next poll


def sleeps_without_listener(wakeup: Wakeup) -> bool:
    """SQLite has no NOTIFY: no LISTEN connection, and the wait is the poll delay."""
    return wakeup._listener is None and slept(wakeup, ASLEEP_S) >= ASLEEP_S * 0.9


def test_notifications_wake_the_wait_once_and_are_all_consumed(wakeup: Wakeup) -> None:
    if not is_postgres():
        assert sleeps_without_listener(wakeup)
        return
    notify(times=3)
    time.sleep(ASLEEP_S)  # all three in the socket (three commits: they may come apart)
    started = time.monotonic()
    assert wakeup.wait(5) is True
    assert time.monotonic() - started < 1, "a NOTIFY did not end the wait"
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


# -- the poll after a wake-up ---------------------------------------------------------------


def test_the_poll_answering_a_wake_up_reads_the_table_size_it_has() -> None:
    """The planner's estimate of the table is read again once a ``REPLAN_S`` (it tells
    whether a burst outgrew the statistics), but not by the poll answering a wake-up: by
    the poll after it."""
    clock = FakeMonotonic()
    reads: list[str] = []
    planner = Planner(clock=clock, row_estimate=lambda name: reads.append(name) or len(reads))
    assert planner.planned_rows("t") == 1
    assert planner.planned_rows("t") == 1  # within a REPLAN_S
    clock.advance(REPLAN_S)
    planner.poll_woken(True)
    assert planner.planned_rows("t") == 1
    planner.poll_woken(False)
    assert planner.planned_rows("t") == 2
    assert planner.planned_rows("t", fresh=True) == 3


class AlwaysWoken:
    """A ``Wakeup`` whose every wait is ended early, ``waits`` times, then stops."""

    notified = False
    named: frozenset[str] = frozenset()
    listening = False  # no wake-up to ask for: the loop's asks are tested below

    def __init__(self, waits: int) -> None:
        self.waits = waits
        self.stopping = False

    def wait(self, seconds: float) -> bool:
        self.waits -= 1
        self.stopping = self.waits <= 0
        return True


@pytest.mark.usefixtures("planner_clock")  # the planner put back after the test
def test_a_worker_woken_again_and_again_keeps_house_every_other_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a poll that follows a wait ended early answers a wake-up, and never two polls in
    a row: the housekeeping it leaves (the clock, plans, rescues) is done at the next."""
    worker = WorkerProcess({"long"}, load_settings({}, environ={}))
    worker.wakeup = AlwaysWoken(waits=5)  # type: ignore[assignment]
    worker._heartbeat_ok_until = float("inf")
    polls: list[tuple[bool, bool]] = []
    monkeypatch.setattr(worker.long, "run_once",
                        lambda *, woken: polls.append((woken, worker.planner.woken)) or 0)
    worker._loop()
    assert polls == [(False, False), (True, True), (False, False), (True, True), (False, False)]


@pytest.mark.usefixtures("planner_clock")  # the planner put back after the test
def test_a_pass_that_handed_rows_asks_whether_the_statistics_know_of_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a pass that handed rows the worker asks ``Planner.analyze_when_behind``, which
    analyses the table when the planner believes it holds fewer. A pass that handed none
    asks nothing: in an outage, a step that ran no statement would count as the database
    reachable again."""
    worker = WorkerProcess({"long"}, load_settings({}, environ={}))
    worker.wakeup = AlwaysWoken(waits=2)  # type: ignore[assignment]
    worker._heartbeat_ok_until = float("inf")
    handed = iter([150, 0])
    monkeypatch.setattr(worker.long, "run_once", lambda *, woken: next(handed))
    asked: list[int] = []
    monkeypatch.setattr(Planner, "analyze_when_behind",
                        lambda self, rows: asked.append(rows) or False)
    worker._loop()
    assert asked == [150]


# -- asking for a wake-up -------------------------------------------------------------------


def sequence_value(name: str) -> int:
    with pg_connect(autocommit=True) as reader:
        return reader.execute(f"SELECT COALESCE(pg_sequence_last_value('{name}'), 0)"
                              ).fetchone()[0]


@contextlib.contextmanager
def looping(worker: WorkerProcess) -> Iterator[None]:
    """``worker``'s loop in a thread of its own while the block runs."""
    worker.start()

    def loop() -> None:
        try:
            worker._loop()
        finally:
            assert worker.long is not None
            worker.long.shutdown(wait=True)
            connection.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        assert worker.wakeup is not None
        worker.wakeup.stop()
        thread.join(10)
        worker.wakeup.close()
    assert not thread.is_alive()


def handled_at(calls: list[float], job_id: int, within: float) -> float:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not calls:
        time.sleep(0.01)
    assert calls, f"job {job_id} not handled within {within} s"
    return calls[0]


def sleepy_long_worker(targets: Callable[..., Target]) -> tuple[WorkerProcess, list[float]]:
    """A long-lane worker whose idle sleep is 5 s, and when its target's handler ran."""
    calls: list[float] = []
    targets("t:long", lambda job: calls.append(time.monotonic()), lane="long")
    return WorkerProcess({"long"}, load_settings({"IDLE_POLL_S": [5], "POLL_S": 5},
                                                 environ={})), calls


def test_a_worker_asks_then_polls_once_more_before_it_sleeps(
        targets: Callable[..., Target], monkeypatch: pytest.MonkeyPatch) -> None:
    """A job committed after the worker's last poll but before its ask found no ask to
    answer: the poll after the ask finds it, long before the worker's 5 s sleep ends."""
    if not is_postgres():
        assert sleeps_without_listener(Wakeup(listen=True))
        return
    worker, calls = sleepy_long_worker(targets)
    real_ask = store.wakeups_wanted
    enqueued: list[tuple[int, float]] = []

    def enqueue_then_ask(lanes: set[str]) -> None:
        if not enqueued:  # from another connection, as a web process would, just before
            def web() -> None:
                enqueued.append((enqueue("t:long", 1).job_id, time.monotonic()))
                connection.close()
            thread = threading.Thread(target=web)
            thread.start()
            thread.join()
        real_ask(lanes)

    monkeypatch.setattr(store, "wakeups_wanted", enqueue_then_ask)
    with looping(worker):
        deadline = time.monotonic() + 5
        while not enqueued and time.monotonic() < deadline:
            time.sleep(0.01)
        [(job_id, committed)] = enqueued
        assert handled_at(calls, job_id, within=3) - committed < 1, "found at the sleep's end"


def test_a_worker_whose_wake_up_was_lost_asks_again_after_its_sleep(
        targets: Callable[..., Target]) -> None:
    """A waker that took the worker's ask but died before its NOTIFY's commit leaves the
    ask answered and the worker asleep: the worker asks again after that sleep, so the next
    enqueue wakes it instead of its next timed poll."""
    if not is_postgres():
        assert sleeps_without_listener(Wakeup(listen=True))
        return
    calls: list[float] = []
    targets("t:long", lambda job: calls.append(time.monotonic()), lane="long")
    worker = WorkerProcess({"long"}, load_settings({"IDLE_POLL_S": [2], "POLL_S": 1},
                                                   environ={}))
    with looping(worker):
        deadline = time.monotonic() + 5
        while sequence_value("jobs_engine_waits_long") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # asleep
        with pg_connect(autocommit=True) as waker:  # took the ask, sent nothing
            waker.execute("SELECT setval('jobs_engine_wakes_long', "
                          "pg_sequence_last_value('jobs_engine_waits_long'))")
        time.sleep(2.4)  # the sleep ended: asked again, asleep again until about 4 s
        assert (sequence_value("jobs_engine_waits_long")
                > sequence_value("jobs_engine_wakes_long")), "no new ask after the sleep"
        committed = time.monotonic()
        job_id = enqueue("t:long", 1).job_id
        assert handled_at(calls, job_id, within=3) - committed < 1, "not woken by the NOTIFY"


def test_a_worker_that_asks_while_an_enqueue_is_open_looks_again_soon(
        targets: Callable[..., Target], monkeypatch: pytest.MonkeyPatch) -> None:
    """An enqueue that looked at the wait numbers before the worker asked wakes nobody at
    its commit. It holds its lanes' lock until then, so the ask says it is open, and the
    worker looks again within milliseconds instead of sleeping its 5 s."""
    if not is_postgres():
        assert sleeps_without_listener(Wakeup(listen=True))
        return
    worker, calls = sleepy_long_worker(targets)
    real_ask = store.wakeups_wanted
    opened, release = threading.Event(), threading.Event()
    committed: list[tuple[int, float]] = []

    def web() -> None:  # a request's transaction, open across the worker's ask
        with connection.cursor() as cursor:  # earlier asks answered: nobody waits
            cursor.execute("SELECT setval('jobs_engine_wakes_long', "
                           "nextval('jobs_engine_waits_long'))")
        with transaction.atomic():
            job_id = enqueue("t:long", 1).job_id
            opened.set()
            release.wait(5)
        committed.append((job_id, time.monotonic()))
        connection.close()

    def ask_while_open(lanes: set[str]) -> bool:
        if not opened.is_set():
            threading.Thread(target=web, daemon=True).start()
            opened.wait(5)
            threading.Timer(0.3, release.set).start()  # it commits after the ask
        return real_ask(lanes)

    monkeypatch.setattr(store, "wakeups_wanted", ask_while_open)
    with looping(worker):
        deadline = time.monotonic() + 5
        while not committed and time.monotonic() < deadline:
            time.sleep(0.01)
        [(job_id, at)] = committed
        assert handled_at(calls, job_id, within=3) - at < 0.5, "found at the sleep's end"
