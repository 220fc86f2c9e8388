"""The planner policy."""

from __future__ import annotations

import time

from jobs_engine.store.dialect import (
    execute,
    is_postgres,
    planned_rows,
)
from jobs_engine.store.rows import JOBS

__all__ = [
    "jobs_analyze_when_behind",
]

# A pass of the worker that handed this many rows, more than the planner believes the
# jobs table holds, has the table analysed (``jobs_analyze_when_behind``), at most once
# an ``ANALYZE_EVERY_S`` per process.
BEHIND_FROM_ROWS = 100
ANALYZE_EVERY_S = 10.0
# The columns the lanes' reads filter and order by: the wide ones (payloads, results,
# tries) are most of a whole analyse's time.
ANALYZE_COLUMNS = ("status", "lane", "target", "partition", "key", "version", "next_run_at",
                   "priority", "running_code")
_monotonic = time.monotonic
_analyzed_at: float | None = None  # when this process last analysed the jobs table


def jobs_analyze_when_behind(rows: int) -> bool:
    """Analyse the jobs table when this process's worker just handed ``rows`` rows, at
    least ``BEHIND_FROM_ROWS`` and more than the planner believes the table holds; whether
    it did.

    The statistics then still describe the table before a burst (a drained queue,
    analysed empty), and every plan made from them reads the burst as if it were a
    handful of rows: wrong indexes, a walk of a key's versions for each row read. A
    drain that followed took seconds of polls of 20-180 ms instead of ~5 ms, until
    autovacuum's own analyse came (its naptime is a minute). Analysing makes every
    session's plans again, for the rows there are. Only the columns the lanes' reads
    filter and order by (``ANALYZE_COLUMNS``): a whole analyse, payloads and results
    included, took twice as long (131 ms at 50,000 rows against 64; 28 against 10 at
    10,000) and 5% from a 10,000-row drain of three workers; with only ``status``,
    ``target`` and ``key``, the reserve, short of ``next_run_at``'s statistics, read and
    sorted every due row. ``SKIP_LOCKED``: another worker's analyse, or autovacuum's, is
    as good and is not waited for; a role that does not own the table gets a warning
    from PostgreSQL and nothing changes.
    """
    global _analyzed_at
    if rows < BEHIND_FROM_ROWS or not is_postgres() or (planned_rows(JOBS) or 0) >= rows:
        return False
    now = _monotonic()
    if _analyzed_at is not None and 0 <= now - _analyzed_at < ANALYZE_EVERY_S:
        return False
    _analyzed_at = now
    # Another worker may have analysed it since this one last read its size.
    if (planned_rows(JOBS, fresh=True) or 0) >= rows:
        return False
    execute(f"ANALYZE (SKIP_LOCKED) {JOBS} ({', '.join(ANALYZE_COLUMNS)})")
    planned_rows(JOBS, fresh=True)
    return True


