"""What a fault run enqueues, and the enqueuing process itself.

The jobs are enqueued by a separate process (``python -m tests.faults.workload``) with the
workers' settings and database: the pytest process is connected to the suite's main
cluster, and the soak has no Django at all. Every committed job is appended to the
*enqueued set* file, one line ``<id> <target> <key> <version> <mode> <lane>``, fsynced after
each commit, which is what the checker holds the deliveries and the tables against.

Fast-lane jobs go to ``keys`` keys (spread over the fast targets), versions ``1..versions``
each, committed version-major in ``transactions`` big transactions (so a poll's window
holds heads of many keys); long-lane jobs are spread over the same transactions, and so are
the ``limited`` ones (the limits scenario's: an account, a random sleep, a throttle).

A transaction that fails on a database fault (a restart while the enqueuer runs rounds) is
tried again; a try whose commit went through before the fault finds its dedupe keys taken,
and the ids that hold them are the jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LimitedJobs:
    """Long-lane jobs of one target of the limits scenario, spread over the transactions:
    payload ``account`` ``a0..a<accounts-1>`` round robin (none when 0), ``sleep`` a
    uniform random time in ``sleep_ms`` (seeded by the job's number), ``throttle`` on every
    ``throttle_every``-th job (0: none)."""

    target: str
    jobs: int
    accounts: int = 0
    sleep_ms: tuple[int, int] = (0, 0)
    throttle_every: int = 0

    def payload(self, prefix: str, n: int) -> dict[str, Any]:
        low, high = self.sleep_ms
        found: dict[str, Any] = {"sleep": round(
            random.Random(f"{prefix}:{self.target}:{n}").uniform(low, high) / 1000, 4)}
        if self.accounts:
            found["account"] = f"a{n % self.accounts}"
        if self.throttle_every and n % self.throttle_every == self.throttle_every - 1:
            found["throttle"] = True
        return found


@dataclass(frozen=True)
class Workload:
    """Sizes and targets of one run's jobs (JSON-able, handed to the enqueuing process)."""

    fast_targets: tuple[str, ...]
    keys: int
    versions: int
    long_targets: tuple[str, ...] = ()
    long_jobs: int = 0
    long_sleep_s: float = 0.05
    transactions: int = 5
    interval_s: float = 0.0  # pause between transactions (rounds); 0: back to back
    prefix: str = "k"
    limited: tuple[LimitedJobs, ...] = ()

    @property
    def fast_jobs(self) -> int:
        return self.keys * self.versions

    @property
    def total(self) -> int:
        return self.fast_jobs + self.long_jobs + sum(spec.jobs for spec in self.limited)

    @property
    def targets(self) -> list[str]:
        return [*self.fast_targets, *self.long_targets, *(spec.target for spec in self.limited)]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        raw = json.loads(text)
        raw["fast_targets"] = tuple(raw["fast_targets"])
        raw["long_targets"] = tuple(raw["long_targets"])
        raw["limited"] = tuple(LimitedJobs(**{**spec, "sleep_ms": tuple(spec["sleep_ms"])})
                               for spec in raw.get("limited", ()))
        return cls(**raw)


def key_name(workload: Workload, index: int) -> tuple[str, str]:
    """(target, key) of key number ``index``: keys alternate over the fast targets."""
    target = workload.fast_targets[index % len(workload.fast_targets)]
    return target, f"{workload.prefix}{index:06d}"


def _bounds(total: int, parts: int, part: int) -> tuple[int, int]:
    return total * part // parts, total * (part + 1) // parts


def transaction_items(workload: Workload, number: int) -> list[dict[str, Any]]:
    """The enqueue items of transaction ``number`` (0-based), in insert order."""
    items: list[dict[str, Any]] = []
    first, last = _bounds(workload.versions, workload.transactions, number)
    for version in range(first + 1, last + 1):
        for index in range(workload.keys):
            target, key = key_name(workload, index)
            items.append({"target": target, "key": key, "version": version,
                          "payload": {"key": key, "version": version},
                          "dedupe_key": f"{workload.prefix}:{target}:{key}:{version}"})
    if workload.long_targets:
        low, high = _bounds(workload.long_jobs, workload.transactions, number)
        for n in range(low, high):
            target = workload.long_targets[n % len(workload.long_targets)]
            key = f"{workload.prefix}long{n:06d}"
            items.append({"target": target, "key": key, "version": 0,
                          "payload": {"sleep": workload.long_sleep_s},
                          "dedupe_key": f"{workload.prefix}:{target}:{key}"})
    for index, spec in enumerate(workload.limited):
        low, high = _bounds(spec.jobs, workload.transactions, number)
        for n in range(low, high):
            key = f"{workload.prefix}lim{index}-{n:06d}"
            items.append({"target": spec.target, "key": key, "version": 0,
                          "payload": spec.payload(workload.prefix, n),
                          "dedupe_key": f"{workload.prefix}:{spec.target}:{key}"})
    return items


def enqueued_lines(items: list[dict[str, Any]], ids: list[int]) -> Iterator[str]:
    """The enqueued-set lines of committed items."""
    from jobs_engine.registry import get_target

    for item, job_id in zip(items, ids, strict=True):
        target = get_target(item["target"])
        yield (f"{job_id} {item['target']} {item['key'] or '-'} {item['version']} "
               f"{target.delivery_mode.value} {target.lane.value}\n")


def commit_items(items: list[dict[str, Any]], number: int, retry_s: float = 120) -> list[int]:
    """Enqueue ``items`` in one transaction, tried again while the database is down (up to
    ``retry_s``); returns their ids. Every item is inserted by the try that commits: a
    dedupe key already taken is one a try before committed (its commit's answer lost)."""
    from django.db import InterfaceError, OperationalError, connection, transaction

    from jobs_engine import enqueue_many

    deadline, tries = time.monotonic() + retry_s, 0
    while True:
        tries += 1
        try:
            with transaction.atomic():
                results = enqueue_many(items)
            break
        except (OperationalError, InterfaceError) as exc:
            if time.monotonic() > deadline:
                raise
            print(f"transaction {number + 1}: try {tries} failed on a database fault: "
                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}",
                  flush=True)
            connection.close()
            time.sleep(0.5)
    ids = [r.job_id for r in results]
    taken = sum(not r.inserted for r in results)
    if None in ids or (taken and (tries == 1 or taken != len(results))):
        raise RuntimeError(f"transaction {number + 1}: {taken} of {len(items)} items not "
                           f"inserted at try {tries}")
    if taken:
        print(f"transaction {number + 1}: committed by an earlier try (its answer was lost)",
              flush=True)
    return [int(i) for i in ids if i is not None]


def enqueue_all(workload: Workload, out: Path) -> int:
    """Commit the workload transaction by transaction; returns the jobs enqueued."""
    count = 0
    started = time.monotonic()
    for number in range(workload.transactions):
        time.sleep(max(0.0, started + number * workload.interval_s - time.monotonic()))
        items = transaction_items(workload, number)
        if not items:
            continue
        ids = commit_items(items, number)
        with open(out, "a") as fh:
            fh.writelines(enqueued_lines(items, ids))
            fh.flush()
            os.fsync(fh.fileno())
        count += len(items)
        print(f"committed transaction {number + 1}/{workload.transactions}: {len(items)} jobs",
              flush=True)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the Workload as JSON")
    parser.add_argument("--out", required=True, type=Path, help="the enqueued-set file")
    args = parser.parse_args(argv)
    import django

    django.setup()
    count = enqueue_all(Workload.from_json(args.spec), args.out)
    print(f"enqueued {count} jobs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
