"""Every database operation of the engine, one module per statement family:

- ``enqueue``: rows inserted in the caller's transaction, and the wake-ups after its commit;
- ``fast``: the fast lane's reads, marked in flight by the read;
- ``long``: the long lane's reserve, start, renewal and rescue;
- ``fair``: the long lane's reserve shared between tenants by weight;
- ``limits``: the admission of limited targets' rows, and their buckets;
- ``outcomes``: every outcome write of both lanes, under the holder's guard;
- ``flows``: the flows' bookkeeping;
- ``leases``: who may act (worker liveness, partition leases, in-flight marks, pauses);
- ``control``: what operators see and do (the admin, the API, ``/metrics``, retention);
- ``rows``: what the families share (tables, a lane's row, the state machine's edges);
- ``planning``: the planner policy of the worker's sessions (``planner``, its one owner);
- ``connection``: how statements run (cursors, prepared statements, parameters);
- ``dialect``: the fragments and values in which PostgreSQL and SQLite differ.

Callers write ``store.<function>``; the lanes, leases and outcome code never write SQL.
"""

from jobs_engine.store.connection import db_now, is_postgres, notifications_exist
from jobs_engine.store.control import *  # noqa: F403
from jobs_engine.store.control import __all__ as _control
from jobs_engine.store.dialect import read_dt, read_json, writable_ctes
from jobs_engine.store.enqueue import *  # noqa: F403
from jobs_engine.store.enqueue import __all__ as _enqueue
from jobs_engine.store.fair import *  # noqa: F403
from jobs_engine.store.fair import __all__ as _fair
from jobs_engine.store.fast import *  # noqa: F403
from jobs_engine.store.fast import __all__ as _fast
from jobs_engine.store.flows import *  # noqa: F403
from jobs_engine.store.flows import __all__ as _flows
from jobs_engine.store.leases import *  # noqa: F403
from jobs_engine.store.leases import __all__ as _leases
from jobs_engine.store.limits import *  # noqa: F403
from jobs_engine.store.limits import __all__ as _limits
from jobs_engine.store.long import *  # noqa: F403
from jobs_engine.store.long import __all__ as _long
from jobs_engine.store.outcomes import *  # noqa: F403
from jobs_engine.store.outcomes import __all__ as _outcomes
from jobs_engine.store.planning import *  # noqa: F403
from jobs_engine.store.planning import __all__ as _planning
from jobs_engine.store.rows import *  # noqa: F403
from jobs_engine.store.rows import __all__ as _rows

__all__ = ["db_now", "is_postgres", "notifications_exist", "read_dt", "read_json",
           "writable_ctes", *_rows, *_enqueue, *_fast, *_long, *_fair, *_limits, *_outcomes,
           *_flows,           *_planning, *_leases, *_control]
