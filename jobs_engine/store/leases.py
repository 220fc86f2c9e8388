"""Who may act: worker liveness, partition leases, in-flight marks and their takeover, and
the pause state of targets shared by every worker.

Ownership is decided by conditional statements on the database's clock: of two workers
racing for a partition or a probe, one statement matches and the other matches nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from jobs_engine.states import DeliveryMode
from jobs_engine.store.connection import (
    execute,
    fetch,
    named,
)
from jobs_engine.store.dialect import (
    dt,
    for_share,
    in_,
    json_param,
    jsonb,
    read_dt,
    read_json,
    table,
    values_,
)
from jobs_engine.store.rows import (
    CLOSED_COLUMNS,
    INFLIGHT,
    JOBS,
    PARTITIONS,
    PAUSES,
    PENDING_VALUE,
    TAKEOVER_PRESUMED_DEAD,
    TAKEOVER_REASON,
    WORKERS,
    ClosedJob,
    attempts_as_read,
    closed_jobs,
    cut_error,
    lazy_flush_item,
)

# -- workers and partition leases --------------------------------------------------------


__all__ = [
    "HAND_PAUSE_UNTIL",
    "OutageRecord",
    "PauseRow",
    "TakenPartition",
    "inflight_clear",
    "inflight_close_after_takeover",
    "inflight_mark_if_leased",
    "jobs_still_pending",
    "partition_owner_counts",
    "partition_take_free",
    "partitions_release",
    "partitions_release_owned",
    "partitions_renew_if_owner",
    "partitions_seed",
    "pause_claim_probe",
    "pause_clear",
    "pause_set",
    "pauses_all",
    "worker_beat",
    "worker_delete",
    "workers_live",
]


def partitions_seed(count: int) -> int:
    """Create partition rows 0..count-1 that are missing; safe for many workers at once.

    Index: the primary key."""
    rows, params = named(values_([(number,) for number in range(count)]), "partition")
    return execute(f"INSERT INTO {PARTITIONS} (partition) {rows} "
                   "ON CONFLICT (partition) DO NOTHING", params)


@dataclass(frozen=True)
class OutageRecord:
    """What the worker row shows: how many outages this process lived through, when the
    last one started, how long it lasted and what the database said."""

    count: int = 0
    last_at: datetime | None = None
    last_s: float = 0.0
    last_error: str = ""


def worker_beat(worker_id: str, now: datetime, *, hostname: str, pid: int, lanes: str,
                outages: OutageRecord | None = None) -> None:
    """Insert or refresh this worker's liveness row, with the database outages it lived
    through.

    Index: the primary key."""
    outages = outages or OutageRecord()
    execute(
        f"INSERT INTO {WORKERS} (worker_id, heartbeat_at, started_at, hostname, pid, lanes, "
        "db_outages, last_db_outage_at, last_db_outage_s, last_db_error) "
        "VALUES (%(worker)s, %(now)s, %(now)s, %(hostname)s, %(pid)s, %(lanes)s, %(outages)s, "
        "%(last_at)s, %(last_s)s, %(last_error)s) ON CONFLICT (worker_id) "
        "DO UPDATE SET heartbeat_at = excluded.heartbeat_at, db_outages = excluded.db_outages, "
        "last_db_outage_at = excluded.last_db_outage_at, "
        "last_db_outage_s = excluded.last_db_outage_s, last_db_error = excluded.last_db_error",
        {"worker": worker_id, "now": dt(now), "hostname": hostname, "pid": pid, "lanes": lanes,
         "outages": outages.count, "last_at": dt(outages.last_at), "last_s": outages.last_s,
         "last_error": cut_error(outages.last_error)},
    )


def worker_delete(worker_id: str) -> None:
    """Remove this worker's liveness row (it stops).

    Index: the primary key."""
    execute(f"DELETE FROM {WORKERS} WHERE worker_id = %(worker)s", {"worker": worker_id})


def workers_live(now: datetime, within_s: float, lane: str | None = None) -> list[str]:
    """Worker ids whose heartbeat is newer than ``within_s`` seconds; with ``lane``, only
    those that run it (``lanes`` is a comma list, e.g. ``fast,long,schedules``).

    Index: none, a row per worker process."""
    lane_clause = "" if lane is None else "AND ',' || lanes || ',' LIKE %(lane)s"
    rows = fetch(f"SELECT worker_id FROM {WORKERS} WHERE heartbeat_at > %(since)s "
                 f"{lane_clause} ORDER BY worker_id",
                 {"since": dt(now - timedelta(seconds=within_s)), "lane": f"%,{lane},%"})
    return [row[0] for row in rows]


def partitions_renew_if_owner(owner: str, now: datetime, lease_s: float) -> list[int]:
    """Extend every lease ``owner`` still holds; the partitions still held.

    Index: none, a row per partition. A lease already expired is not renewed (another
    worker may have taken it)."""
    rows = fetch(
        f"UPDATE {PARTITIONS} SET lease_until = %(lease_until)s WHERE owner = %(owner)s "
        "AND lease_until > %(now)s RETURNING partition",
        {"lease_until": dt(now + timedelta(seconds=lease_s)), "owner": owner, "now": dt(now)},
    )
    return sorted(row[0] for row in rows)


def partition_owner_counts(now: datetime) -> dict[str, int]:
    """How many live leases each owner holds (the fair share's input).

    Index: none, a row per partition."""
    rows = fetch(
        f"SELECT owner, COUNT(*) FROM {PARTITIONS} WHERE owner IS NOT NULL "
        "AND lease_until > %(now)s GROUP BY owner", {"now": dt(now)},
    )
    return {owner: count for owner, count in rows}


@dataclass(frozen=True)
class TakenPartition:
    partition: int


def partition_take_free(owner: str, now: datetime, lease_s: float) -> TakenPartition | None:
    """Take one partition that has no owner or an expired lease.

    Index: the primary key, for the take. One conditional UPDATE per take: the guard
    repeats the "free" test, so two workers racing for a partition cannot both win. The
    new owner then judges the in-flight marks its previous owners left
    (``inflight_close_after_takeover``).
    """
    free = fetch(
        f"SELECT partition FROM {PARTITIONS} WHERE owner IS NULL OR lease_until IS NULL "
        "OR lease_until <= %(now)s ORDER BY partition LIMIT 8", {"now": dt(now)},
    )
    for (number,) in free:
        rows = fetch(
            f"UPDATE {PARTITIONS} SET owner = %(owner)s, lease_until = %(lease_until)s "
            "WHERE partition = %(partition)s "
            "AND (owner IS NULL OR lease_until IS NULL OR lease_until <= %(now)s) "
            "RETURNING partition",
            {"owner": owner, "lease_until": dt(now + timedelta(seconds=lease_s)),
             "partition": number, "now": dt(now)},
        )
        if rows:
            return TakenPartition(rows[0][0])
    return None


def partitions_release(owner: str, partitions: Sequence[int]) -> int:
    """Give partitions back (only while ``owner`` still holds them).

    Index: the primary key."""
    clause, params = named(in_("partition", partitions), "partitions")
    return execute(
        f"UPDATE {PARTITIONS} SET owner = NULL, lease_until = NULL "
        f"WHERE owner = %(owner)s AND {clause}", {"owner": owner, **params},
    )


def partitions_release_owned(owner: str) -> int:
    """Give back every partition ``owner`` holds (it stops).

    Index: none, a row per partition."""
    return execute(f"UPDATE {PARTITIONS} SET owner = NULL, lease_until = NULL "
                   "WHERE owner = %(owner)s", {"owner": owner})


# -- takeover of a partition's in-flight mark -----------------------------------------------


def inflight_close_after_takeover(taken: TakenPartition, now: datetime,
                                  own_tokens: Collection[str] = ()) -> list[ClosedJob]:
    """Judge the rows the previous owners left in flight in the partition just taken.

    Index: ``jobs_inflight_by_partition``, then the primary key for the marked rows.
    The marks are removed here.

    A row whose outcome was written under its mark's token is left alone. At-most-once
    rows go DEAD (the send may have landed); at-least-once rows stay PENDING to be sent
    again. The DEAD rows keep their holder's token (``Guard``): if that worker is alive
    after all (a database outage, a stall), its outcome write still lands. Marks under
    ``own_tokens`` are this worker's own, whose outcomes it has still to write: kept.
    """
    own, own_params = named(in_("token", list(own_tokens)), "own")
    marks: list[tuple[str, list[int]]] = [
        (token, [int(i) for i in read_json(ids) or []]) for token, ids in fetch(
            f"DELETE FROM {INFLIGHT} WHERE partition = %(partition)s AND NOT ({own}) "
            "RETURNING token, ids", {"partition": taken.partition, **own_params})]
    closed: list[ClosedJob] = []
    for token, ids in marks:
        if not ids:
            continue
        clause, params = named(in_("id", ids), "ids")
        closed += closed_jobs(fetch(
            f"UPDATE {JOBS} SET status = %(dead)s, closed_at = %(now)s, last_error = %(reason)s, "
            f"updated_at = %(now)s, claim_token = %(token)s WHERE {clause} "
            "AND partition = %(partition)s AND status = %(pending)s "
            "AND delivery_mode = %(at_most_once)s "
            "AND (outcome_token IS NULL OR outcome_token <> %(token)s) "
            f"RETURNING {CLOSED_COLUMNS}",
            {"dead": TAKEOVER_PRESUMED_DEAD.target, "now": dt(now), "reason": TAKEOVER_REASON,
             "token": token, "partition": taken.partition,
             "pending": TAKEOVER_PRESUMED_DEAD.source_value,
             "at_most_once": DeliveryMode.AT_MOST_ONCE.value, **params},
        ), TAKEOVER_REASON)
    return closed


# -- shared pause state -------------------------------------------------------------------

# The ``paused_until`` of a pause an operator made by hand (``store.pause_by_hand``): far
# past any probe, so no worker ever claims a probe of it, and what tells it from the
# breaker's pause. The breaker's statements below never touch one; only an operator's
# resume (``store.pause_resume``) ends it. Year 9999, not its end: a page that shows it in
# a time zone east of UTC must not pass the last year a datetime holds.
HAND_PAUSE_UNTIL = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class PauseRow:
    target: str
    paused_until: datetime
    reason: str

    @property
    def by_hand(self) -> bool:
        """Whether an operator paused the target (no probe; only a resume ends it)."""
        return self.paused_until >= HAND_PAUSE_UNTIL


def pauses_all() -> list[PauseRow]:
    """Every target's pause (the workers' shared view of them).

    Index: none, a row per paused target."""
    return [PauseRow(t, read_dt(u), r) for t, u, r in  # type: ignore[arg-type]  # paused_until is NOT NULL
            fetch(f"SELECT target, paused_until, reason FROM {PAUSES}")]


def pause_set(target: str, now: datetime, probe_s: float, reason: str) -> None:
    """Pause ``target`` until ``now + probe_s`` (insert or extend); a pause by hand stays
    as the operator made it.

    Index: the primary key."""
    execute(
        f"INSERT INTO {PAUSES} AS p (target, paused_until, reason, paused_at, probe_by) "
        "VALUES (%(target)s, %(until)s, %(reason)s, %(now)s, NULL) ON CONFLICT (target) "
        "DO UPDATE SET paused_until = excluded.paused_until, reason = excluded.reason, "
        "probe_by = NULL WHERE p.paused_until < %(hand)s",
        {"target": target, "until": dt(now + timedelta(seconds=probe_s)),
         "reason": cut_error(reason), "now": dt(now), "hand": dt(HAND_PAUSE_UNTIL)},
    )


def pause_claim_probe(target: str, owner: str, now: datetime, probe_s: float) -> bool:
    """Win the right to send one probe row of a paused target whose pause ran out.

    Index: the primary key. The guard on the old ``paused_until`` makes the probe
    cluster-wide: one worker wins per ``PROBE_S``, the rest keep skipping the target. A
    pause by hand never runs out, so it is never probed.
    """
    return execute(
        f"UPDATE {PAUSES} SET paused_until = %(until)s, probe_by = %(owner)s "
        "WHERE target = %(target)s AND paused_until <= %(now)s",
        {"until": dt(now + timedelta(seconds=probe_s)), "owner": owner, "target": target,
         "now": dt(now)},
    ) == 1


def pause_clear(target: str) -> int:
    """Resume ``target`` after its probe was delivered. A pause an operator made by hand
    meanwhile (over the breaker's, while its probe was out) stays: only an operator's
    resume (``store.pause_resume``) ends it.

    Index: the primary key."""
    return execute(f"DELETE FROM {PAUSES} WHERE target = %(target)s "
                   "AND paused_until < %(hand)s",
                   {"target": target, "hand": dt(HAND_PAUSE_UNTIL)})


# -- in-flight marks ----------------------------------------------------------------------


def leased_partitions_sql(partitions: str = "mark") -> str:
    """The partitions of ``partitions`` whose live lease ``%(owner)s`` holds at
    ``%(now)s``, locked until the statement's commit: a takeover's update of the partition
    waits for a mark, and a mark made after a takeover finds the partition another's (a
    mark is never left unjudged)."""
    return (f"SELECT partition FROM {PARTITIONS} WHERE owner = %(owner)s "
            f"AND lease_until > %(now)s AND partition IN (SELECT partition FROM {partitions})"
            f"{for_share()}")


def _id_attempts_in(rows: Sequence[tuple[int, int]]) -> tuple[str, dict[str, Any]]:
    """``(id, attempts)`` is one of ``rows``: read by the primary key, so even a large queue
    costs a probe per row; one text for any number of rows on PostgreSQL."""
    ids, id_params = named(in_("id", [job_id for job_id, _ in rows], arrays_from=1), "ids")
    read, read_params = named(attempts_as_read(rows), "attempts")
    return f"({ids} AND {read})", {**id_params, **read_params}


def inflight_mark_if_leased(owner: str, now: datetime, token: str,
                            sending: Sequence[tuple[int, int, int]], *,
                            flush_lazily: bool = False) -> set[int]:
    """Record rows about to be handed to a target as in flight, if ``owner`` leases them.

    Index: the primary key for the rows, ``jobs_inflight_by_token`` for the marks. A mark
    (``InflightMark``) is a row per partition, under the poll's token, made in one
    statement for every partition of the send.

    ``sending`` is the rows as (partition, id, attempts). A partition's rows are marked
    only while ``owner`` holds a live lease on it and every row of it in ``sending`` is
    still PENDING as read (a takeover or an admin may have closed one). Returns the
    partitions marked; for the others send nothing, and ``jobs_still_pending`` tells a
    lost lease from a closed row. ``flush_lazily`` (the rows are at least once): the
    commit does not wait for its flush (``lazy_flush_item``).
    """
    ids_of: dict[int, list[int]] = {}
    for partition, job_id, _ in sending:
        ids_of.setdefault(partition, []).append(job_id)
    marks, mark_params = named(table([(p, json_param(ids), len(ids)) for p, ids in ids_of.items()],
                                     ("int", "jsonb", "int"), arrays_from=1, as_json=True),
                               "marks")
    sent, sent_params = _id_attempts_in([(job_id, attempts) for _, job_id, attempts in sending])
    # One text for any send (arrays), prepared: an at-most-once per-row target runs it once
    # a row, and the server planned it at each call.
    rows = fetch(
        f"WITH mark(partition, ids, n) AS ({marks}), "
        f"live(partition, n) AS (SELECT partition, COUNT(*) FROM {JOBS} "
        f"WHERE status = %(pending)s AND {sent} GROUP BY partition), "
        f"leased AS ({leased_partitions_sql()}) "
        f"INSERT INTO {INFLIGHT} (token, partition, owner, ids, marked_at) "
        f"SELECT %(token)s, mark.partition, %(owner)s, {jsonb('mark.ids')}, %(now)s FROM mark "
        "JOIN live ON live.partition = mark.partition AND live.n = mark.n "
        "WHERE mark.partition IN (SELECT partition FROM leased) RETURNING partition"
        + lazy_flush_item(flush_lazily),
        {**mark_params, **sent_params, "pending": PENDING_VALUE, "owner": owner,
         "now": dt(now), "token": token},
        prepare=True,
    )
    return {row[0] for row in rows}


def jobs_still_pending(rows: Sequence[tuple[int, int]]) -> set[int]:
    """Ids of the (id, attempts) rows that are still PENDING as read.

    Index: the primary key."""
    pending, params = _id_attempts_in(rows)
    return {row[0] for row in fetch(f"SELECT id FROM {JOBS} WHERE status = %(pending)s "
                                    f"AND {pending}", {**params, "pending": PENDING_VALUE})}


def clear_inflight_sql(token: str) -> tuple[str, dict[str, Any]]:
    """The statement that removes a poll's in-flight marks, its parameter named ``token``
    (an outcome write that ends the poll joins it under its guard's token, the same).

    Index: ``jobs_inflight_by_token``."""
    return f"DELETE FROM {INFLIGHT} WHERE token = %(token)s", {"token": token}


def inflight_clear(token: str) -> None:
    """Remove the in-flight marks a poll made (its outcomes are written).

    Index: ``jobs_inflight_by_token``."""
    execute(*clear_inflight_sql(token))


