"""Statement counts of a worker process (the ``limits`` phase).

``BENCH_COUNT_SQL=<dir>`` in a worker's environment makes ``bench/apps.py`` count every
statement its Django connections run (every thread's: each connection gets the counting
wrapper when it is made), by kind (``kind_of``), with the time the process waited for each
(its round trip: the server's work, a lock waited for, the network), and write them to
``<dir>/<pid>.json`` every ``DUMP_S`` and at exit. The driver reads the files at the drain
clock's first progress and at its end (``read_counts``): the statements of the drain alone.
Transactions' ``BEGIN``/``COMMIT`` are not statements Django runs through a cursor and are
not counted.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

COUNT_ENV = "BENCH_COUNT_SQL"
DUMP_S = 0.05

# (kind, a piece of its text): the first that the statement holds names it.
KINDS = (
    ("limits: admit", "jobs_engine_limits_admit("),
    ("limits: due keys", "WITH RECURSIVE keys"),
    ("limits: due targets", "AS t(name) WHERE NOT EXISTS"),
    ("limits: read buckets", "LEFT JOIN jobs_engine_limit_bucket b"),
    ("limits: count held back", "throttled + v.held"),
    ("limits: lock buckets", "JOIN v ON v.target = b.target"),
    ("limits: new buckets", "INSERT INTO jobs_engine_limit_bucket"),
    ("limits: running", "GROUP BY j.target, j.limit_key"),
    ("limits: take", "WITH picked AS"),
    ("limits: write buckets", "UPDATE jobs_engine_limit_bucket SET tokens"),
    ("long: reserve", "locked_above AS"),
    ("long: next due", "MIN(j.next_run_at)"),
)
ADMISSION_PREFIX = "limits: "

_counts: Counter[str] = Counter()
_seconds: Counter[str] = Counter()
_lock = threading.Lock()
_kinds: dict[str, str] = {}


def kind_of(sql: str) -> str:
    """The kind of a statement: one of ``KINDS``, else its first 48 characters."""
    found = _kinds.get(sql)
    if found is None:
        found = next((kind for kind, piece in KINDS if piece in sql),
                     "other: " + re.sub(r"\s+", " ", sql).strip()[:48])
        if len(_kinds) < 10_000:
            _kinds[sql] = found
    return found


def _count(execute: Callable[..., Any], sql: str, params: Any, many: bool,
           context: Any) -> Any:
    kind = kind_of(sql)
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        elapsed = time.perf_counter() - started
        with _lock:
            _counts[kind] += 1
            _seconds[kind] += elapsed


def _dump(path: Path) -> None:
    with _lock:
        counts = {"counts": dict(_counts), "seconds": dict(_seconds)}
    part = path.with_suffix(".part")
    part.write_text(json.dumps(counts))
    os.replace(part, path)


def install(directory: str) -> None:
    """Count this process's statements into ``<directory>/<pid>.json``."""
    from django.db.backends.signals import connection_created

    path = Path(directory) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        if _count not in connection.execute_wrappers:  # a reconnect keeps its wrapper
            connection.execute_wrappers.append(_count)

    connection_created.connect(on_connection, weak=False)

    def dump_loop() -> None:
        while True:
            threading.Event().wait(DUMP_S)
            _dump(path)

    threading.Thread(target=dump_loop, name="bench-sqlcount", daemon=True).start()
    atexit.register(_dump, path)


def read_counts(directory: Path) -> tuple[Counter[str], Counter[str]]:
    """The counts and seconds by kind that every process writing into ``directory`` has
    written so far, summed."""
    counts: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for path in directory.glob("*.json"):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced: the next read has it
        counts.update(found["counts"])
        seconds.update(found["seconds"])
    return counts, seconds
