"""Partition leases against a real database (docs/design.md#leases-and-fencing).

Heartbeats get explicit decision times; the monotonic clock is a fake so lease trust is
decided by the test. Races run in real threads on PostgreSQL; on SQLite (one worker
process is the supported mode) the same steps run one after the other.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from jobs_engine import store
from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.lanes.partitions import PartitionLeases, fair_share, new_worker_id
from jobs_engine.models import Partition, Worker
from tests.helpers import FakeMonotonic, race

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
SETTINGS = load_settings({}, environ={})


def worker(name: str, settings: JobsSettings = SETTINGS) -> PartitionLeases:
    return PartitionLeases(f"{name}-{uuid.uuid4().hex[:6]}", settings, monotonic=FakeMonotonic())


def owners() -> dict[str, set[int]]:
    """Partitions by owner, as the database sees them."""
    found: dict[str, set[int]] = {}
    for number, owner in Partition.objects.exclude(owner=None).values_list("partition", "owner"):
        found.setdefault(owner, set()).add(number)
    return found



@pytest.fixture
def t0(now: datetime) -> datetime:
    store.partitions_seed(SETTINGS.PARTITIONS)
    return now


# -- seeding -----------------------------------------------------------------------------------


def test_seed_creates_64_rows_once_however_often_it_runs() -> None:
    assert store.partitions_seed(64) == 64
    assert [store.partitions_seed(64) for _ in range(5)] == [0] * 5
    assert sorted(Partition.objects.values_list("partition", flat=True)) == list(range(64))


@pytest.mark.django_db(transaction=True)
def test_concurrent_seeding_creates_64_rows_once() -> None:
    """Several workers booting on an empty database at once."""
    created = race(*[lambda: store.partitions_seed(64) for _ in range(4)])
    assert sum(created) == 64
    assert sorted(Partition.objects.values_list("partition", flat=True)) == list(range(64))


# -- fair share --------------------------------------------------------------------------------


def beat_rounds(workers: list[PartitionLeases], start: datetime, rounds: int) -> None:
    for number in range(rounds):
        for leases in workers:
            leases.heartbeat(start + number * SECOND)


def test_two_workers_split_32_32(t0: datetime) -> None:
    a, b = worker("A"), worker("B")
    beat_rounds([a, b], t0, 3)
    held = owners()
    assert {len(held[a.worker_id]), len(held[b.worker_id])} == {32}
    assert set(a.held()) == held[a.worker_id] and set(b.held()) == held[b.worker_id]


def test_three_workers_split_22_21_21_with_one_owner_each(t0: datetime) -> None:
    workers = [worker("A"), worker("B"), worker("C")]
    beat_rounds(workers, t0, 4)
    held = owners()
    assert sorted(len(held[w.worker_id]) for w in workers) == [21, 21, 22]
    in_memory = [set(w.held()) for w in workers]
    assert set().union(*in_memory) == set(range(64))
    assert sum(len(parts) for parts in in_memory) == 64  # no partition trusted by two
    assert [set(w.held()) for w in workers] == [held[w.worker_id] for w in workers]


def test_workers_of_other_lanes_take_no_share_of_the_partitions(t0: datetime) -> None:
    """One pod per lane: a long-lane and a schedules worker beat beside two fast ones; the
    fast ones still split all 64 (with all four counted, each took 16 and 32 stayed
    unowned)."""
    store.worker_beat("long-only", t0, hostname="h", pid=1, lanes="long")
    store.worker_beat("ticker", t0, hostname="h", pid=2, lanes="schedules")
    a, b = worker("A"), worker("B")
    beat_rounds([a, b], t0, 3)
    held = owners()
    assert {len(held[a.worker_id]), len(held[b.worker_id])} == {32}
    assert set(held) == {a.worker_id, b.worker_id}


def test_fair_share_numbers() -> None:
    assert fair_share(64, "a", ["a", "b"], {"a": 64, "b": 32}) == 32
    assert fair_share(64, "a", ["a", "b", "c"], {"b": 21, "c": 22}) == 22
    assert fair_share(64, "a", ["a", "b", "c"], {"b": 0, "c": 22}) == 21
    assert fair_share(64, "a", [], {}) == 64


def test_dead_workers_partitions_are_taken_after_its_lease_expires(t0: datetime) -> None:
    dead, alive = worker("dead"), worker("alive")
    assert len(dead.heartbeat(t0).taken) == 64
    assert alive.heartbeat(t0 + 10 * SECOND).taken == []  # still live and leased
    assert alive.heartbeat(t0 + 29 * SECOND).taken == []
    taken = alive.heartbeat(t0 + 31 * SECOND).taken
    assert taken == list(range(64))
    assert owners() == {alive.worker_id: set(range(64))}


def test_busy_partitions_are_never_released(t0: datetime) -> None:
    a, b = worker("A"), worker("B")
    a.heartbeat(t0)
    b.heartbeat(t0)
    a.busy.update({63, 62, 40, 1})  # being sent right now
    released = a.heartbeat(t0 + SECOND).released
    assert len(released) == 32
    assert not set(released) & a.busy
    assert a.busy <= owners()[a.worker_id]
    assert a.busy <= set(a.held())


def test_all_partitions_busy_means_none_released(t0: datetime) -> None:
    a, b = worker("A"), worker("B")
    a.heartbeat(t0)
    b.heartbeat(t0)
    a.busy.update(range(64))
    assert a.heartbeat(t0 + SECOND).released == []
    assert len(owners()[a.worker_id]) == 64


def test_heartbeat_again_is_a_no_op(t0: datetime) -> None:
    a = worker("A")
    a.heartbeat(t0)
    for at in (t0, t0 + 5 * SECOND):
        again = a.heartbeat(at)
        assert (again.taken, again.released, again.lost, again.held) == ([], [], [], 64)
    assert owners() == {a.worker_id: set(range(64))}
    assert Partition.objects.get(partition=0).lease_until == t0 + 35 * SECOND


def test_release_all_frees_partitions_and_deletes_worker_row(t0: datetime) -> None:
    a, b = worker("A"), worker("B")
    a.heartbeat(t0)
    assert Worker.objects.filter(worker_id=a.worker_id).exists()
    a.release_all()
    assert a.held() == []
    assert owners() == {}
    assert not Worker.objects.filter(worker_id=a.worker_id).exists()
    assert len(b.heartbeat(t0).taken) == 64  # at once, no wait for lease expiry


def test_worker_ids_are_unique_per_process_lifetime() -> None:
    ids = {new_worker_id() for _ in range(20)}
    assert len(ids) == 20


def test_lease_trust_ends_on_the_workers_own_clock(t0: datetime) -> None:
    """Self-fencing: without a successful renewal, the worker stops trusting its lease
    before the database lease runs out (lease minus a margin)."""
    clock = FakeMonotonic()
    a = PartitionLeases("fencing", SETTINGS, monotonic=clock)
    a.heartbeat(t0)
    clock.value += 28.9
    assert len(a.held()) == 64
    clock.value += 0.2
    assert a.held() == []


@pytest.mark.django_db(transaction=True)
def test_racing_takes_never_give_one_partition_to_two_workers(now: datetime) -> None:
    store.partitions_seed(64)

    def take_all(owner: str) -> Callable[[], list[int]]:
        def run() -> list[int]:
            taken: list[int] = []
            while (got := store.partition_take_free(owner, now, 30)) is not None:
                taken.append(got.partition)
            return taken

        return run

    first, second, third = race(take_all("A"), take_all("B"), take_all("C"))
    assert not set(first) & set(second) and not set(first) & set(third)
    assert not set(second) & set(third)
    assert sorted(first + second + third) == list(range(64))
    assert {o: len(p) for o, p in owners().items()} == {
        o: n for o, n in (("A", len(first)), ("B", len(second)), ("C", len(third))) if n}
