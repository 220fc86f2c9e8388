"""The long lane's handler threads: calls run in order of arrival on at most ``count``
threads, a call that raises leaves its thread serving, and shutdown waits for every call
handed before it."""

from __future__ import annotations

import threading
import time

from jobs_engine.lanes.long import HandlerThreads


def test_at_most_count_calls_run_at_once_and_the_others_wait() -> None:
    pool = HandlerThreads(3, "t")
    started: list[int] = []
    names: set[str] = set()
    gate = threading.Event()

    def call(i: int) -> None:
        started.append(i)
        names.add(threading.current_thread().name)
        gate.wait(5)

    for i in range(9):
        pool.submit(call, i)
    deadline = time.monotonic() + 5
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    assert sorted(started) == [0, 1, 2]  # three threads busy: the fourth call waits
    gate.set()
    pool.shutdown(wait=True)
    assert sorted(started) == list(range(9))
    assert names == {"t_0", "t_1", "t_2"}


def test_one_thread_runs_the_calls_in_order_of_arrival() -> None:
    pool = HandlerThreads(1, "t")
    done: list[int] = []
    for i in range(50):
        pool.submit(done.append, i)
    pool.shutdown(wait=True)
    assert done == list(range(50))


def test_a_call_that_raises_leaves_its_thread_serving() -> None:
    pool = HandlerThreads(1, "t")
    done: list[str] = []

    def fails() -> None:
        raise SystemExit("not even this stops the thread")

    pool.submit(fails)
    pool.submit(done.append, "after")
    pool.shutdown(wait=True)
    assert done == ["after"]


def test_shutdown_waits_for_every_call_handed_before_it() -> None:
    pool = HandlerThreads(2, "t")
    done: list[int] = []

    def slow(i: int) -> None:
        time.sleep(0.02)
        done.append(i)

    for i in range(6):
        pool.submit(slow, i)
    pool.shutdown(wait=True)
    assert sorted(done) == list(range(6))
