"""Every database operation of the engine, in three modules:

- ``queue``: the statements a job meets (enqueue, both lanes, outcomes);
- ``leases``: who may act (worker liveness, partition leases, in-flight marks, pauses);
- ``operators``: those of the admin, the API, ``/metrics`` and retention;
- ``dialect``: the few pieces in which PostgreSQL and SQLite differ.

Callers write ``store.<function>``; the lanes, leases and outcome code never write SQL.
"""

from jobs_engine.store.dialect import (
    WOKEN_POLL_ROWS,
    db_now,
    is_postgres,
    poll_woken,
    queue_busy,
    table_row_estimate,
    writable_ctes,
)
from jobs_engine.store.leases import *  # noqa: F403
from jobs_engine.store.leases import __all__ as _leases
from jobs_engine.store.operators import *  # noqa: F403
from jobs_engine.store.operators import __all__ as _operators
from jobs_engine.store.queue import *  # noqa: F403
from jobs_engine.store.queue import __all__ as _queue

__all__ = ["WOKEN_POLL_ROWS", "db_now", "is_postgres", "poll_woken", "queue_busy",
           "table_row_estimate", "writable_ctes", *_queue, *_leases, *_operators]
