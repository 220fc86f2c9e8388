"""The raw baselines the engine's rows are quoted against, measured in the same run on the
same machine: plain psycopg on a table of its own (the limit of E100, E1 and D1), and the
plain ``confluent_kafka.Producer`` sending the Kafka phase's records (the limit of the Kafka
rows). Import after ``django.setup()`` (the psycopg connection takes Django's parameters).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.db import connection

from bench.harness import payload

RAW_TABLE = "bench_raw_jobs"
RAW_INSERT = f"INSERT INTO {RAW_TABLE} (payload, status, created_at) VALUES (%s, 'todo', now())"


@contextlib.contextmanager
def raw_psycopg() -> Iterator[Any]:
    """A plain psycopg connection and table: the same-session limit docs/benchmarks.md
    calls "raw psycopg", so ratios are quoted against this run's machine."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    try:
        conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}; CREATE TABLE {RAW_TABLE} (id "
                     "bigserial PRIMARY KEY, payload jsonb, status text, "
                     "created_at timestamptz DEFAULT now())")
        yield conn
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        conn.close()


def raw_e100(n: int) -> float:
    from psycopg.types.json import Jsonb

    with raw_psycopg() as conn, conn.cursor() as cur:
        started = time.perf_counter()
        for b in range(n // 100):
            with conn.transaction():
                cur.executemany(RAW_INSERT, [(Jsonb(payload(b * 100 + j)),) for j in range(100)])
        return (n // 100 * 100) / (time.perf_counter() - started)


def raw_e1(n: int) -> float:
    from psycopg.types.json import Jsonb

    with raw_psycopg() as conn:
        started = time.perf_counter()
        for i in range(n):
            conn.execute(RAW_INSERT, (Jsonb(payload(i)),))
        return n / (time.perf_counter() - started)


def raw_drain(n: int, limit: int) -> float:
    """DELETE ... FOR UPDATE SKIP LOCKED LIMIT ``limit`` RETURNING, autocommit, one process."""
    from psycopg.types.json import Jsonb

    with raw_psycopg() as conn:
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(RAW_INSERT, [(Jsonb(payload(i)),) for i in range(n)])
        conn.execute(f"ANALYZE {RAW_TABLE}")
        query = (f"DELETE FROM {RAW_TABLE} WHERE id IN (SELECT id FROM {RAW_TABLE} ORDER BY id "
                 f"LIMIT {limit} FOR UPDATE SKIP LOCKED) RETURNING id, payload")
        done = 0
        started = time.perf_counter()
        while rows := conn.execute(query).fetchall():
            done += len(rows)
        return done / (time.perf_counter() - started)


def raw_kafka(bootstrap: str, topic: str, n: int, keys: int, per_flush: int | None) -> float:
    """The raw ``confluent_kafka.Producer`` with the target's configuration sending the same
    records (key, JSON value byte for byte as the target sends PostgreSQL's jsonb text,
    headers event_id/trace_id/traceparent): messages/s
    from the first ``produce`` to the last delivery report, after a warm-up message (the
    connection and the topic's metadata are start-up, as the workers' are).
    ``per_flush``: wait for every report each ``per_flush`` messages (the target's send
    protocol, without the database); None: produce everything, then flush once."""
    from confluent_kafka import Producer

    from jobs_engine.contrib.kafka.settings import parse_kafka_settings

    config = parse_kafka_settings({"BOOTSTRAP_SERVERS": bootstrap}, environ={}).producer_config()
    producer = Producer(config)
    errors: list[Any] = []
    delivered = [0]

    def report(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            errors.append(err)

    producer.produce(topic, b"{}", key=b"warm-up", on_delivery=report)
    producer.flush(30)
    delivered[0] = 0
    trace = uuid.uuid4().hex
    started = time.perf_counter()
    for i in range(n):
        value = json.dumps(payload(i), ensure_ascii=False, allow_nan=False).encode()
        headers = [("event_id", str(i).encode()), ("trace_id", trace.encode()),
                   ("traceparent", f"00-{trace}-{secrets.token_hex(8)}-01".encode())]
        while True:
            try:
                producer.produce(topic, value, key=f"k{i % keys}".encode(), headers=headers,
                                 on_delivery=report)
                break
            except BufferError:  # the client's queue is full: serve reports, then again
                producer.poll(0.01)
        if per_flush and (i + 1) % per_flush == 0:
            producer.flush(30)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    if errors or delivered[0] != n:
        raise RuntimeError(f"raw producer: {delivered[0]} of {n} delivered, errors {errors[:3]}")
    return n / elapsed


