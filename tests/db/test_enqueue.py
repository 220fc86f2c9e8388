"""Enqueue (docs/design.md#enqueue), row by row, on PostgreSQL and SQLite.

Rows join the caller's transaction: a rolled-back business change has no jobs and starts
no lossy send, a duplicate never aborts the caller's transaction, bad input writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import ProgrammingError, connection, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobs_engine import (
    EnqueueResult,
    InvalidJob,
    UnknownTarget,
    enqueue,
    enqueue_many,
    enqueueing,
    next_version,
    store,
    text,
)
from jobs_engine.conf import JobsSettings
from jobs_engine.conf import jobs_settings as current_settings
from jobs_engine.context import RequestContextMiddleware, job_context
from jobs_engine.enqueueing import partition_for
from jobs_engine.job import Job as HandlerJob
from jobs_engine.lanes import lossy as lossy_lane
from jobs_engine.models import Job, VersionCounter, Worker
from jobs_engine.registry import Target
from jobs_engine.store import enqueue as store_enqueue
from tests.conftest import is_postgres
from tests.helpers import fast_poller

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
HEX32 = re.compile(r"^[0-9a-f]{32}$")
TRANSACTIONAL = pytest.mark.django_db(transaction=True)

Targets = Callable[..., Target]


class Boom(Exception):
    """Raised by a test to roll back its business transaction."""


def drain_lossy_pool() -> None:
    """Wait for every lossy send handed to the pool so far.

    Shutting the pool down (and letting the next hand-off make a new one) waits for every
    submitted send, whichever of the pool's threads runs it; no blind sleep.
    """
    pool = lossy_lane._pool
    if pool is not None:
        pool.shutdown(wait=True)
        lossy_lane._pool = None


@pytest.fixture(autouse=True)
def _no_lossy_leftovers() -> Iterator[None]:
    """Sends of one test must never be counted in the next."""
    drain_lossy_pool()
    yield
    drain_lossy_pool()


def pg_connect(**kwargs: Any) -> psycopg.Connection:
    """A second, independent psycopg connection to the test database."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, **kwargs)


def count_jobs() -> int:
    return Job.objects.count()


@pytest.fixture
def fast(targets: Targets) -> Target:
    return targets("t:fast")


@pytest.fixture
def lossy(targets: Targets) -> Target:
    return targets("t:lossy", lossy=True)


# -- transaction: rollback and commit ------------------------------------------------------


@TRANSACTIONAL
def test_rollback_leaves_no_rows_and_no_lossy_send(fast: Target, lossy: Target) -> None:
    """A rolled-back business transaction has no jobs and starts no lossy send."""
    with pytest.raises(Boom), transaction.atomic():
        enqueue("t:fast", {"n": 1}, dedupe_key="rb:1")
        enqueue_many([{"target": "t:fast", "payload": 2, "dedupe_key": "rb:2"},
                      {"target": "t:lossy", "payload": 3, "dedupe_key": "rb:3"}])
        enqueue("t:lossy", {"n": 4}, dedupe_key="rb:4")
        assert Job.objects.count() == 2  # really written inside the block
        raise Boom
    drain_lossy_pool()
    assert count_jobs() == 0
    assert lossy.extra["calls"] == []


@TRANSACTIONAL
def test_commit_keeps_rows_and_sends_lossy_once_after_commit(fast: Target, lossy: Target
                                                             ) -> None:
    """Lossy hand-off waits for the commit: nothing is sent while the block is open."""
    with transaction.atomic():
        durable = enqueue("t:fast", {"n": 1}, dedupe_key="ok:1")
        handed = enqueue("t:lossy", {"n": 2}, key="k", dedupe_key="ok:2")
        drain_lossy_pool()
        assert lossy.extra["calls"] == [], "lossy send started before commit"
    drain_lossy_pool()
    assert durable == EnqueueResult(inserted=True, job_id=durable.job_id, lossy=False)
    assert handed == EnqueueResult(inserted=False, job_id=None, lossy=True)
    assert list(Job.objects.values_list("dedupe_key", flat=True)) == ["ok:1"]
    calls: list[HandlerJob] = lossy.extra["calls"]
    assert len(calls) == 1
    assert (calls[0].payload, calls[0].key, calls[0].dedupe_key) == ({"n": 2}, "k", "ok:2")


@TRANSACTIONAL
def test_lossy_send_failure_is_dropped_after_one_try(targets: Targets) -> None:
    """One try, dropped on failure: the failing handler runs once and nothing is stored."""
    tries: list[HandlerJob] = []

    def failing(job: HandlerJob) -> None:
        tries.append(job)
        raise RuntimeError("down")

    targets("t:lossy-fail", failing, lossy=True)
    with transaction.atomic():
        enqueue("t:lossy-fail", {"n": 1})
    drain_lossy_pool()
    assert len(tries) == 1
    assert count_jobs() == 0


@TRANSACTIONAL
def test_a_lossy_send_writes_its_run_line_and_a_failed_one_its_drop_line(
        targets: Targets, caplog: pytest.LogCaptureFixture) -> None:
    """The hand-off's log: a send that returned writes the run line every run writes
    (``result=ok lossy=1``), one that raised the drop line naming its error."""

    def failing(job: HandlerJob) -> None:
        raise RuntimeError("down")

    targets("t:lossy-ok", lambda job: None, lossy=True)
    targets("t:lossy-down", failing, lossy=True)
    with caplog.at_level(logging.INFO, logger="jobs_engine"):
        enqueue("t:lossy-ok", {"n": 1}, dedupe_key="lossy-line:ok")
        enqueue("t:lossy-down", {"n": 2}, dedupe_key="lossy-line:down")
        drain_lossy_pool()
    lines = [r.getMessage() for r in caplog.records]
    ran = [line for line in lines if "lossy-line:ok" in line]
    dropped = [line for line in lines if "lossy-line:down" in line]
    assert len(ran) == 1 and ran[0].startswith("job run ") and "result=ok lossy=1" in ran[0]
    assert len(dropped) == 1 and dropped[0].startswith("lossy job dropped ")
    assert "RuntimeError('down')" in dropped[0]


@TRANSACTIONAL
def test_outside_a_transaction_rows_commit_at_once(fast: Target) -> None:
    """Autocommit: another connection sees the row as soon as enqueue returns."""
    assert connection.get_autocommit() and not connection.in_atomic_block
    result = enqueue("t:fast", {"n": 1}, dedupe_key="auto:1")
    if is_postgres():
        with pg_connect() as other:
            rows = other.execute(f"SELECT id FROM {store.JOBS} WHERE dedupe_key = %s",
                                 ["auto:1"]).fetchall()
        assert rows == [(result.job_id,)]
    else:
        seen: list[int] = []

        def read() -> None:
            try:
                seen.extend(Job.objects.filter(dedupe_key="auto:1").values_list("id", flat=True))
            finally:
                connections.close_all()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(10)
        assert seen == [result.job_id]
    assert Job.objects.get(dedupe_key="auto:1").id == result.job_id


# -- dedupe -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_same_dedupe_key_in_one_call_first_wins(fast: Target) -> None:
    results = enqueue_many([
        {"target": "t:fast", "payload": "first", "dedupe_key": "d:1"},
        {"target": "t:fast", "payload": "second", "dedupe_key": "d:1"},
    ])
    assert [r.inserted for r in results] == [True, False]
    assert results[0].job_id == results[1].job_id is not None
    assert list(Job.objects.values_list("payload", flat=True)) == ["first"]


@TRANSACTIONAL
def test_same_dedupe_key_in_one_transaction(fast: Target) -> None:
    with transaction.atomic():
        first = enqueue("t:fast", "first", dedupe_key="d:2")
        again = enqueue("t:fast", "second", dedupe_key="d:2")
    assert (first.inserted, again.inserted) == (True, False)
    assert again.job_id == first.job_id
    assert list(Job.objects.values_list("payload", flat=True)) == ["first"]


@TRANSACTIONAL
def test_same_dedupe_key_in_a_later_transaction(fast: Target) -> None:
    with transaction.atomic():
        first = enqueue("t:fast", "first", dedupe_key="d:3")
    with transaction.atomic():
        again = enqueue("t:fast", "second", dedupe_key="d:3")
        more = enqueue("t:fast", "other", dedupe_key="d:4")
    assert (first.inserted, again.inserted, more.inserted) == (True, False, True)
    assert again.job_id == first.job_id
    assert dict(Job.objects.values_list("dedupe_key", "payload")) == {"d:3": "first",
                                                                     "d:4": "other"}


@TRANSACTIONAL
def test_duplicate_never_aborts_the_callers_transaction(fast: Target) -> None:
    """After a duplicate, the same transaction keeps working and commits every other write.

    On PostgreSQL a unique violation would abort the transaction ("current transaction is
    aborted"); ON CONFLICT DO NOTHING must not.
    """
    with transaction.atomic():
        enqueue("t:fast", "x", dedupe_key="dup:x")
        duplicate = enqueue("t:fast", "x again", dedupe_key="dup:x")
        enqueue("t:fast", "y", dedupe_key="dup:y")
        VersionCounter.objects.create(key="written-after-duplicate", value=7)
        many = enqueue_many([{"target": "t:fast", "payload": "x", "dedupe_key": "dup:x"},
                             {"target": "t:fast", "payload": "z", "dedupe_key": "dup:z"}])
    assert duplicate.inserted is False
    assert [r.inserted for r in many] == [False, True]
    assert dict(Job.objects.values_list("dedupe_key", "payload")) == {
        "dup:x": "x", "dup:y": "y", "dup:z": "z"}
    assert VersionCounter.objects.get(key="written-after-duplicate").value == 7


@pytest.mark.django_db
def test_omitted_dedupe_key_is_random(fast: Target) -> None:
    first = enqueue("t:fast", {"same": 1})
    second = enqueue("t:fast", {"same": 1})
    assert first.inserted and second.inserted and first.job_id != second.job_id
    keys = list(Job.objects.values_list("dedupe_key", flat=True))
    assert len(keys) == 2 and len(set(keys)) == 2
    assert all(HEX32.match(k) for k in keys), keys


@pytest.mark.django_db
def test_job_id_is_the_row_id_and_the_existing_id_for_a_duplicate(fast: Target) -> None:
    first = enqueue("t:fast", 1, dedupe_key="id:1")
    row = Job.objects.get(dedupe_key="id:1")
    assert first.job_id == row.id
    assert enqueue("t:fast", 2, dedupe_key="id:1").job_id == row.id


# -- rejected input writes nothing ------------------------------------------------------------


@pytest.mark.django_db
def test_unknown_target_raises_before_any_write(fast: Target) -> None:
    with pytest.raises(UnknownTarget) as info:
        enqueue("t:nope", {})
    assert info.value.name == "t:nope"
    with pytest.raises(UnknownTarget):
        enqueue_many([{"target": "t:fast", "payload": 1, "dedupe_key": "u:1"},
                      {"target": "t:fast", "payload": 2, "dedupe_key": "u:2"},
                      {"target": "t:nope", "payload": 3}])
    assert count_jobs() == 0


class NotJson:
    pass


BAD_ITEMS: list[tuple[str, dict[str, Any], str]] = [
    ("payload-set", {"payload": {1, 2}}, "payload"),
    ("payload-object", {"payload": {"o": NotJson()}}, "payload"),
    ("payload-nan", {"payload": {"v": float("nan")}}, "payload"),
    ("payload-too-big", {"payload": "x" * 200}, "payload"),
    ("key-too-long", {"key": "k" * 256}, "key"),
    ("code-too-long", {"code": "c" * 201}, "code"),
    ("version-negative", {"version": -1}, "version"),
    ("version-str", {"version": "3"}, "version"),
    ("version-float", {"version": 1.5}, "version"),
    ("version-bool", {"version": True}, "version"),
    ("run-at-naive", {"run_at": datetime(2030, 1, 1, 12, 0)}, "run_at"),
    ("run-at-not-a-date", {"run_at": "2030-01-01T00:00:00Z"}, "run_at"),
    ("headers-list", {"headers": ["a", "b"]}, "headers"),
    ("headers-str", {"headers": "event_id=1"}, "headers"),
    ("headers-int-keys", {"headers": {1: "x"}}, "headers"),
    ("headers-nan", {"headers": {"h": float("nan")}}, "headers"),  # jsonb has no NaN
]


@pytest.fixture
def small_payloads(jobs_settings: Callable[..., JobsSettings]) -> JobsSettings:
    """MAX_PAYLOAD_BYTES=100 so "payload-too-big" is over it and the others are not."""
    return jobs_settings(MAX_PAYLOAD_BYTES=100)


@pytest.mark.django_db
@pytest.mark.parametrize(("bad", "field"), [(b, f) for _, b, f in BAD_ITEMS],
                         ids=[name for name, _, _ in BAD_ITEMS])
def test_invalid_job_names_the_field_and_writes_nothing(
        fast: Target, small_payloads: JobsSettings, bad: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJob) as alone:
        enqueue_many([{"target": "t:fast", "payload": {"ok": 1}, **bad}])
    assert alone.value.field == field
    assert field in str(alone.value)
    # The bad item second: the first, valid one must not be written either.
    with pytest.raises(InvalidJob) as second:
        enqueue_many([{"target": "t:fast", "payload": {"ok": 1}, "dedupe_key": "good:1"},
                      {"target": "t:fast", "payload": {"ok": 2}, **bad}])
    assert second.value.field == field
    assert count_jobs() == 0


@pytest.mark.django_db
def test_payload_limit_is_the_setting(fast: Target, small_payloads: JobsSettings) -> None:
    """At the limit passes, one byte over fails: the setting, not a constant, decides."""
    at_limit = "x" * (small_payloads.MAX_PAYLOAD_BYTES - 2)  # + 2 quotes in JSON
    assert enqueue("t:fast", at_limit).inserted
    with pytest.raises(InvalidJob) as info:
        enqueue("t:fast", at_limit + "x")
    assert info.value.field == "payload"
    # Bytes of UTF-8, not characters: 50 two-byte letters are 102 bytes in 52 characters.
    two_byte = "ä" * ((small_payloads.MAX_PAYLOAD_BYTES - 2) // 2)
    assert enqueue("t:fast", two_byte).inserted
    with pytest.raises(InvalidJob, match="102 bytes"):
        enqueue("t:fast", two_byte + "ä")
    assert count_jobs() == 2


@pytest.mark.django_db
def test_key_and_code_at_their_length_are_accepted(fast: Target) -> None:
    enqueue("t:fast", 1, key="k" * 255, code="c" * 200, version=0)
    row = Job.objects.get()
    assert (len(row.key), len(row.code), row.version) == (255, 200, 0)


# -- partition ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_partition_comes_from_key_or_dedupe_key(
        fast: Target, jobs_settings: Callable[..., JobsSettings]) -> None:
    jobs_settings(PARTITIONS=8)
    for i in range(40):
        enqueue("t:fast", i, dedupe_key=f"p:{i}")
    for i in range(5):
        enqueue("t:fast", i, key="order-42", dedupe_key=f"keyed:{i}")
    rows = list(Job.objects.values_list("key", "dedupe_key", "partition"))
    for key, dedupe_key, partition in rows:
        assert partition == partition_for(key, dedupe_key, 8)
        assert 0 <= partition < 8
    unkeyed = {p for key, _, p in rows if key is None}
    assert len(unkeyed) > 1, "dedupe keys should spread over partitions"
    assert {p for key, _, p in rows if key == "order-42"} == {partition_for("order-42", "", 8)}


def test_partition_is_stable_across_processes() -> None:
    """Two interpreters with different hash seeds agree with this one on every partition."""
    keys = [f"order-{i}" for i in range(50)] + ["", "ü-ñ", "x" * 255]
    script = (
        "import json, os, sys, django\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings')\n"
        "django.setup()\n"
        "from jobs_engine.enqueueing import partition_for\n"
        "keys = json.loads(sys.stdin.read())\n"
        "print(json.dumps({'hash': hash('order-1'),\n"
        "                  'parts': [partition_for(k or None, 'dk:' + k, 64) for k in keys]}))\n"
    )
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([PYTHON, "-c", script], input=json.dumps(keys), cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outputs[0]["hash"] != outputs[1]["hash"], "the seeds must really differ"
    here = [partition_for(k or None, "dk:" + k, 64) for k in keys]
    assert outputs[0]["parts"] == outputs[1]["parts"] == here
    assert all(0 <= p < 64 for p in here)


# -- one statement --------------------------------------------------------------------------------


def inserts_jobs(sql: str) -> bool:
    """The statement inserts job rows: itself (SQLite) or through a function (PostgreSQL)."""
    return any(text in sql for text in (f"INSERT INTO {Job._meta.db_table}",
                                        store.INSERT_ROWS_FUNCTION,
                                        store.INSERT_PAYLOADS_FUNCTION))


@pytest.mark.django_db
def test_enqueue_many_is_one_insert(fast: Target) -> None:
    items = [{"target": "t:fast", "payload": i, "key": f"k{i % 3}", "version": i}
             for i in range(50)]
    with CaptureQueriesContext(connection) as captured:
        results = enqueue_many(items)
    inserts = [q["sql"] for q in captured.captured_queries if inserts_jobs(q["sql"])]
    assert len(inserts) == 1, inserts
    assert all(r.inserted for r in results)
    assert count_jobs() == 50


# -- how the insert reaches PostgreSQL -------------------------------------------------------------


def _prepared_inserts() -> list[str]:
    """The job inserts prepared on the test's connection (none on SQLite)."""
    if not is_postgres():
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s "
                       "OR statement LIKE %s OR statement LIKE %s",
                       [f"%INSERT INTO {Job._meta.db_table}%", f"%{store.INSERT_ROWS_FUNCTION}(%",
                        f"%{store.INSERT_PAYLOADS_FUNCTION}(%"])
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def prepared_statements_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A session of the test's own, on which the project turned Django's prepared
    statements on (``OPTIONS["prepare_threshold"]``); closed again after the test."""
    connection.close()
    options = dict(connection.settings_dict["OPTIONS"], prepare_threshold=5)
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    yield
    connection.close()


@TRANSACTIONAL
def test_every_insert_is_a_prepared_call_of_a_function(
        fast: Target, prepared_statements_on: None) -> None:
    """PostgreSQL, where the project allows prepared statements: a one-row enqueue and a
    batch of payloads, both a call of the payloads' insert function, and batches with and
    without keys, calls of the rows' one, are prepared on the caller's connection. No
    statement looks up a key's head itself: the function does, with a plan it may keep
    (``test_the_head_lookup_takes_the_key_order_index_at_any_size``)."""
    enqueue("t:fast", 1)
    enqueue_many([{"target": "t:fast", "payload": i} for i in range(20)])
    enqueue_many([{"target": "t:fast", "payload": i, "version": 1} for i in range(20)])
    enqueue_many([{"target": "t:fast", "payload": i, "key": f"k{i}"} for i in range(20)])
    assert count_jobs() == 61
    assert sorted(Job.objects.filter(key__isnull=False).values_list("key", flat=True)) \
        == sorted(f"k{i}" for i in range(20))
    prepared = _prepared_inserts()
    if is_postgres():  # one statement per function
        assert len(prepared) == 2, prepared
        assert {store.INSERT_PAYLOADS_FUNCTION in prepared[0],
                store.INSERT_PAYLOADS_FUNCTION in prepared[1]} == {True, False}, prepared
        assert any(store.INSERT_ROWS_FUNCTION in text for text in prepared), prepared
        assert not any("h.next_run_at" in text for text in prepared), "the head's lookup"


@pytest.mark.django_db
@pytest.mark.parametrize("dedupe_key", ["given", None], ids=["given-key", "made-key"])
def test_the_head_lookup_takes_the_key_order_index_at_any_size(
        fast: Target, now: datetime, dedupe_key: str | None) -> None:
    """A new row of a key whose head waits is born at the head's run time, in a batch too.
    On PostgreSQL the insert function looks the head up with a plan made once per session,
    perhaps while the table is empty: then the cheapest way to a head took another index,
    filtered and sorted, and kept doing so once the table had grown (docs/design.md#enqueue).
    Under the function's own settings the lookup, as a generic plan on the table analysed
    empty, takes the key-order index and sorts nothing."""
    later = now + timedelta(hours=1)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {store.JOBS}")  # empty, and known to be
    head = enqueue("t:fast", 0, key="k", version=1, run_at=later).job_id
    behind = enqueue_many([{"target": "t:fast", "payload": i, "key": key, "version": 2,
                            "dedupe_key": dedupe_key and f"{dedupe_key}:{key}"}
                           for i, key in enumerate(["k", "other"])])
    runs = dict(Job.objects.values_list("id", "next_run_at"))
    assert runs[behind[0].job_id] == runs[head] == later
    assert runs[behind[1].job_id] < later
    if not is_postgres():  # no plans kept: nothing more to see
        return
    with connection.cursor() as cursor:  # the rows' function's settings, the lookup's text
        cursor.execute("SELECT proconfig FROM pg_proc WHERE proname = %s",
                       [store.INSERT_ROWS_FUNCTION])
        ((config,),) = cursor.fetchall()
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'jobs_engine_new_rows'")
        ((source,),) = cursor.fetchall()
    lookup = re.search(r"\(SELECT h\.next_run_at .*?LIMIT 1\)", source, re.DOTALL)
    assert lookup is not None, source
    lookup_sql = (lookup.group(0)[1:-1].replace("r.partition", "$1")
                  .replace("r.target", "$2").replace("r.key", "$3"))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {store.JOBS}")
        cursor.execute(f"ANALYZE {store.JOBS}")
        for setting in config or []:
            name, value = setting.split("=", 1)
            cursor.execute(f"SET LOCAL {name} = {value}")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE head_lookup(smallint, text, text) AS {lookup_sql}")
        try:
            cursor.execute("EXPLAIN EXECUTE head_lookup(1, 't:fast', 'k')")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE head_lookup")
    assert "jobs_pending_key_order" in plan and "Sort" not in plan, plan


@pytest.mark.django_db
def test_without_the_insert_function_a_keyed_enqueue_fails_and_writes_nothing(
        fast: Target) -> None:
    """A database without the insert function (not migrated) makes the enqueue fail
    loudly, naming the missing function, and write nothing: no other way of inserting the
    rows is tried. On SQLite there is no function; the keyed enqueue is the statement
    itself."""
    assert enqueue("t:fast", 1, key="k").inserted
    if not is_postgres():
        assert count_jobs() == 1
        return
    with pytest.raises(ProgrammingError, match=store.INSERT_ROWS_FUNCTION), \
            transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION {store.INSERT_ROWS_FUNCTION}(jsonb, boolean)")
        enqueue_many([{"target": "t:fast", "payload": i, "key": "k"} for i in range(3)])
    assert count_jobs() == 1  # the drop rolled back with the failed enqueue
    assert enqueue("t:fast", 2, key="k").inserted


@TRANSACTIONAL
@pytest.mark.parametrize("pooler_declared", [False, True],
                         ids=["django-default", "disable-server-side-cursors"])
def test_no_insert_is_prepared_where_a_transaction_pooler_may_be(
        fast: Target, pooler_declared: bool, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's default (no ``prepare_threshold``) keeps transaction poolers working: a
    pooler may give the next transaction another server session, where a statement
    prepared in this one does not exist. ``DISABLE_SERVER_SIDE_CURSORS``, Django's
    setting for such a pooler, keeps the insert unprepared even where prepared
    statements are on. Either way the insert is still bound on the server."""
    connection.close()
    if pooler_declared:
        request.getfixturevalue("prepared_statements_on")
        monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    for n in range(3):
        enqueue("t:fast", n)
        enqueue_many([{"target": "t:fast", "payload": i} for i in range(20)])
        enqueue_many([{"target": "t:fast", "payload": i, "version": 1} for i in range(20)])
    assert count_jobs() == 123
    assert _prepared_inserts() == []


@TRANSACTIONAL
def test_an_insert_prepared_in_a_rolled_back_transaction_still_serves(
        fast: Target, prepared_statements_on: None) -> None:
    """A statement prepared inside a transaction outlives its rollback: the next enqueue,
    in another transaction, runs it and stores its row; the rolled-back one stored none."""
    with pytest.raises(Boom), transaction.atomic():
        enqueue("t:fast", 1, dedupe_key="rolled-back")
        raise Boom
    assert count_jobs() == 0
    with transaction.atomic():
        enqueue("t:fast", 2, dedupe_key="kept")
    assert list(Job.objects.values_list("dedupe_key", "payload")) == [("kept", 2)]
    assert len(_prepared_inserts()) == (1 if is_postgres() else 0)


@TRANSACTIONAL
@pytest.mark.parametrize("key", ['k"\\😀', None], ids=["keyed", "without-keys"])
def test_a_batch_stores_every_value_as_given(targets: Targets, now: datetime,
                                             key: str | None) -> None:
    """A batch travels as one JSON text on PostgreSQL (as VALUES on SQLite): every column
    comes back as given, the unusual text, a run time in another zone (the same instant),
    a version past 32 bits, an actor and a priority included. On PostgreSQL the rows go
    through the insert function."""
    targets("t:fast")
    targets("t:long", lane="long")
    zone = timezone(timedelta(hours=5, minutes=30))
    items = [
        {"target": "t:fast", "payload": GOOD_PAYLOAD, "key": key, "version": 2**40,
         "code": "c\\u0000'\"", "dedupe_key": "d:1", "headers": {"h": ["v", 1, None]},
         "run_at": (now + timedelta(minutes=5)).astimezone(zone)},
        {"target": "t:long", "payload": None, "dedupe_key": "d:2", "priority": -7},
        {"target": "t:fast", "payload": [1.5, "x"], "dedupe_key": "d:3"},
    ]
    with job_context("trace-1", {"user": "ä"}), CaptureQueriesContext(connection) as captured:
        results = enqueue_many(items)
    assert [r.inserted for r in results] == [True, True, True]
    by_function = [store.INSERT_ROWS_FUNCTION in q["sql"] for q in captured.captured_queries
                   if store.WAKE_FUNCTION not in q["sql"]]  # the wake-up after the commit
    assert by_function == [is_postgres()]
    rows = {row.dedupe_key: row for row in Job.objects.all()}
    first, second, third = rows["d:1"], rows["d:2"], rows["d:3"]
    assert (first.payload, first.key, first.version, first.code, first.headers) == (
        GOOD_PAYLOAD, key, 2**40, "c\\u0000'\"", {"h": ["v", 1, None]})
    assert first.next_run_at == now + timedelta(minutes=5)
    assert (first.lane, first.trace_id, first.actor) == ("fast", "trace-1", {"user": "ä"})
    assert (second.payload, second.lane, second.priority, second.key) == (None, "long", -7, None)
    assert (third.payload, third.headers, third.version) == ([1.5, "x"], {}, 0)


def _inserted_by_payloads_function(captured: CaptureQueriesContext) -> bool:
    return any(store.INSERT_PAYLOADS_FUNCTION in q["sql"] for q in captured.captured_queries)


@TRANSACTIONAL
@pytest.mark.parametrize("lane", ["fast", "long"])
@pytest.mark.parametrize("in_request", [True, False], ids=["in-a-request", "outside"])
def test_a_batch_of_payloads_makes_the_rows_the_item_by_item_path_makes(
        targets: Targets, lane: str, in_request: bool) -> None:
    """A batch of one target's payloads and nothing else is one call of the payloads'
    insert function on PostgreSQL, where the server makes what the items leave out (on
    SQLite the store makes them the same way). Its
    rows are the rows the item-by-item path makes of the same payloads (an empty
    ``headers`` sends them there), column by column but for the random ones: the
    target's code, lane and delivery mode, version 0, no headers, due now, the request's
    trace id and actor or a trace id of each row's own, a dedupe key of the engine's, and
    partitions taken in turn from a random one (``partition_for`` item by item). Results
    come back in the items' order."""
    targets("t:batch", lane=lane)
    payloads = [{"i": i, "s": 'q"\\😀'} for i in range(30)] + [None, [1.5], "x"]
    context = job_context("trace-3", {"user": "ä"}) if in_request else contextlib.nullcontext()
    with context, CaptureQueriesContext(connection) as fast_captured:
        fast = enqueue_many([{"target": "t:batch", "payload": p} for p in payloads])
    with context, CaptureQueriesContext(connection) as item_captured:
        item_by_item = enqueue_many([{"target": "t:batch", "payload": p, "headers": {}}
                                     for p in payloads])
    assert _inserted_by_payloads_function(fast_captured) == is_postgres()
    assert not _inserted_by_payloads_function(item_captured)
    assert all(r.inserted for r in fast + item_by_item)
    random_or_timed = {"id", "dedupe_key", "trace_id", "partition", "payload", "next_run_at",
                       "created_at", "updated_at"}
    fields = [f.attname for f in Job._meta.concrete_fields if f.attname not in random_or_timed]
    assert {"code", "lane", "version", "headers", "delivery_mode", "actor"} <= set(fields)
    rows = {row.id: row for row in Job.objects.all()}
    for number, (mine, theirs) in enumerate(zip(fast, item_by_item, strict=True)):
        row, other = rows[mine.job_id], rows[theirs.job_id]
        assert row.payload == payloads[number]
        assert [getattr(row, f) for f in fields] == [getattr(other, f) for f in fields]
        assert row.next_run_at == row.created_at == row.updated_at
        assert re.fullmatch("[0-9a-f]{32}", row.dedupe_key), row.dedupe_key
        if in_request:
            assert row.trace_id == other.trace_id == "trace-3"
        else:
            assert re.fullmatch("[0-9a-f]{32}", row.trace_id), row.trace_id
    made = [rows[r.job_id] for r in fast]
    assert len({row.dedupe_key for row in made}) == len(payloads)
    partitions = current_settings().PARTITIONS  # round the partitions from a random one
    assert [row.partition for row in made] == [
        (made[0].partition + n) % partitions for n in range(len(made))]
    if not in_request:
        assert len({row.trace_id for row in made}) == len(payloads)


@TRANSACTIONAL
@pytest.mark.parametrize("item_by_item", [False, True], ids=["payloads", "item-by-item"])
def test_the_dedupe_keys_of_a_batch_are_neighbours_and_the_next_batchs_are_not(
        targets: Targets, item_by_item: bool) -> None:
    """The dedupe keys the engine makes for a batch share 24 random hex digits and count up
    in the last 8, so they sit side by side in the unique index (random keys each dirtied a
    page of their own); the next batch draws other digits. Made by the server for a batch
    of payloads, by Python item by item."""
    targets("t:fast")
    extra = {"headers": {}} if item_by_item else {}
    batches = [enqueue_many([{"target": "t:fast", "payload": i, **extra} for i in range(20)])
               for _ in range(2)]
    keys = [[Job.objects.get(id=r.job_id).dedupe_key for r in batch] for batch in batches]
    for batch_keys in keys:
        assert all(HEX32.match(k) for k in batch_keys), batch_keys
        assert {k[:24] for k in batch_keys} == {batch_keys[0][:24]}, batch_keys
        numbers = [int(k[24:], 16) for k in batch_keys]
        assert numbers == sorted(set(numbers)) and len(numbers) == 20, numbers
    assert keys[0][0][:24] != keys[1][0][:24]


@TRANSACTIONAL
@pytest.mark.parametrize(("items", "by_function"), [
    ([{"target": "t:fast", "payload": 1}, {"target": "t:fast"}], True),
    ([{"target": "t:fast", "payload": 1, "code": None, "key": None, "version": None,
       "dedupe_key": None, "headers": None, "run_at": None, "priority": 0}], True),
    ([{"target": "t:fast", "payload": 1}, {"target": "t:long", "payload": 2}], False),
    ([{"target": "t:fast", "payload": 1}, {"target": "t:fast", "payload": 2, "key": "k"}],
     False),
    ([{"target": "t:fast", "payload": 1, "priority": False}], False),
    ([{"target": "t:fast", "payload": 1, "version": 0}], False),
], ids=["payloads", "arguments-at-defaults", "two-targets", "a-key", "priority-false",
        "version-given"])
def test_only_a_batch_of_one_targets_payloads_takes_the_payloads_function(
        targets: Targets, items: list[dict[str, Any]], by_function: bool) -> None:
    """Any argument besides the payload, even one that changes nothing, sends the batch
    item by item, where it is checked as before; the rows are stored either way."""
    targets("t:fast")
    targets("t:long", lane="long")
    with CaptureQueriesContext(connection) as captured:
        results = enqueue_many(items)
    assert _inserted_by_payloads_function(captured) == (by_function and is_postgres())
    assert all(r.inserted for r in results) and count_jobs() == len(items)


@pytest.mark.django_db
def test_a_batch_of_payloads_is_still_checked_and_writes_nothing_when_one_is_bad(
        fast: Target, lossy: Target) -> None:
    """The item-by-item path's errors, on the payloads' path too: an unknown argument left
    at None, an unknown target, a bad payload in the middle; and a lossy target's batch
    is still handed off after the commit, never inserted."""
    with pytest.raises(InvalidJob) as info:
        enqueue_many([{"target": "t:fast", "payload": 1}, {"target": "t:fast", "paylaod": None}])
    assert info.value.field == "paylaod"
    with pytest.raises(UnknownTarget):
        enqueue_many([{"target": "t:nope", "payload": 1}])
    with pytest.raises(InvalidJob) as info:
        enqueue_many([{"target": "t:fast", "payload": 1}, {"target": "t:fast", "payload": {1, 2}},
                      {"target": "t:fast", "payload": 3}])
    assert info.value.field == "payload"
    assert count_jobs() == 0
    results = enqueue_many([{"target": "t:lossy", "payload": 1}])
    assert results[0].lossy and count_jobs() == 0


@TRANSACTIONAL
@pytest.mark.parametrize("key", ["k1", None], ids=["keyed", "without-keys"])
def test_a_batch_of_dedupe_keys_enqueue_made_inserts_without_an_arbiter(
        targets: Targets, key: str | None) -> None:
    """A dedupe key that enqueue makes is 128 random bits and can match no stored row, so a
    batch of only such keys inserts without ``ON CONFLICT`` (on PostgreSQL the insert
    function is told so). One key given by the caller brings the arbiter back for its
    batch: a duplicate still inserts nothing."""
    targets("t:fast")
    targets("t:long", lane="long")
    items = [{"target": "t:fast", "payload": {"i": 1}, "key": key, "version": 3,
              "headers": {"h": [1]}},
             {"target": "t:long", "payload": None, "priority": 5}]
    spy = mock.patch.object(store_enqueue, "fetch_insert", wraps=store_enqueue.fetch_insert)
    with job_context("trace-2", {"user": "u"}), CaptureQueriesContext(connection) as made, \
            spy as made_call:
        results = enqueue_many(items)
    with CaptureQueriesContext(connection) as given, spy as given_call:
        again = enqueue_many([{"target": "t:fast", "payload": 2, "key": key, "dedupe_key": "d"},
                              {"target": "t:fast", "payload": 3, "key": key}])
    duplicate = enqueue_many([{"target": "t:fast", "payload": 4, "key": key, "dedupe_key": "d"}])

    def insert_of(captured: CaptureQueriesContext) -> str:
        texts = [q["sql"] for q in captured.captured_queries if inserts_jobs(q["sql"])]
        assert len(texts) == 1, texts
        return texts[0]

    made_sql, given_sql = insert_of(made), insert_of(given)
    if is_postgres():
        assert store.INSERT_ROWS_FUNCTION in made_sql and store.INSERT_ROWS_FUNCTION in given_sql
        arbiter = [call.call_args.args[1]["arbiter"] for call in (made_call, given_call)]
        assert arbiter == [False, True], (made_sql, given_sql)
    else:
        assert "ON CONFLICT" not in made_sql.upper(), made_sql
        assert "ON CONFLICT" in given_sql.upper(), given_sql
    assert [r.inserted for r in results] == [True, True]
    assert [r.inserted for r in again] == [True, True]
    assert (duplicate[0].inserted, duplicate[0].job_id) == (False, again[0].job_id)
    fast_row, long_row = (Job.objects.get(id=r.job_id) for r in results)
    assert (fast_row.payload, fast_row.key, fast_row.version, fast_row.headers) == (
        {"i": 1}, key, 3, {"h": [1]})
    assert (fast_row.trace_id, fast_row.actor, fast_row.lane) == ("trace-2", {"user": "u"}, "fast")
    assert (long_row.payload, long_row.lane, long_row.priority) == (None, "long", 5)
    assert re.fullmatch("[0-9a-f]{32}", fast_row.dedupe_key), fast_row.dedupe_key
    assert Job.objects.filter(dedupe_key="d").count() == 1 and count_jobs() == 4


# -- next_version ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_next_version_counts_per_key() -> None:
    assert [next_version("a") for _ in range(3)] == [1, 2, 3]
    assert next_version("b") == 1
    assert next_version("a") == 4


@TRANSACTIONAL
def test_next_version_rolls_back_with_the_caller() -> None:
    assert next_version("order-1") == 1
    with pytest.raises(Boom), transaction.atomic():
        assert next_version("order-1") == 2
        assert next_version("fresh") == 1
        raise Boom
    assert next_version("order-1") == 2
    assert not VersionCounter.objects.filter(key="fresh").exists()


@TRANSACTIONAL
def test_next_version_is_distinct_under_concurrency() -> None:
    """Threads with their own connections, each a transaction that holds its counter row
    for a moment: every value is handed out once."""
    threads_n, per_thread = 6, 5
    start = threading.Barrier(threads_n)
    got: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    # SQLite's in-memory test database cannot queue writers (its shared cache fails at
    # once instead of waiting); serialise them as SQLite's single writer lock would.
    writer = threading.Lock() if not is_postgres() else None

    def work() -> None:
        try:
            start.wait(10)
            for _ in range(per_thread):
                if writer:
                    writer.acquire()
                try:
                    with transaction.atomic():
                        value = next_version("shared")
                        Worker.objects.filter(worker_id="-").exists()  # keep the tx open
                finally:
                    if writer:
                        writer.release()
                with lock:
                    got.append(value)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=work) for _ in range(threads_n)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    assert errors == []
    assert sorted(got) == list(range(1, threads_n * per_thread + 1))
    assert VersionCounter.objects.get(key="shared").value == threads_n * per_thread


@TRANSACTIONAL
def test_next_version_second_transaction_waits_for_the_first() -> None:
    """PostgreSQL: a transaction that has taken a value holds the row; a concurrent one
    waits and gets the next value, never the same. SQLite: the second writer cannot start
    while the first is open, so it also sees the committed value."""
    taken = threading.Event()
    release = threading.Event()
    values: dict[str, int] = {}
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                values["first"] = next_version("held")
                taken.set()
                release.wait(10)
        except BaseException as exc:
            errors.append(exc)
            taken.set()
        finally:
            connections.close_all()

    def second() -> None:
        try:
            with transaction.atomic():
                values["second"] = next_version("held")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    one = threading.Thread(target=first)
    one.start()
    assert taken.wait(10)
    if is_postgres():
        two = threading.Thread(target=second)
        two.start()
        two.join(0.5)
        assert two.is_alive(), "the second transaction must wait for the row lock"
        assert "second" not in values
        release.set()
        one.join(10)
        two.join(10)
    else:
        release.set()
        one.join(10)
        two = threading.Thread(target=second)
        two.start()
        two.join(10)
    assert errors == []
    assert (values["first"], values["second"]) == (1, 2)


# -- trace id and actor ------------------------------------------------------------------------


@pytest.mark.django_db
def test_outside_a_request_each_call_gets_a_new_trace_id(fast: Target) -> None:
    enqueue("t:fast", 1)
    enqueue("t:fast", 2)
    rows = list(Job.objects.values_list("trace_id", "actor"))
    traces = [trace for trace, _ in rows]
    assert all(HEX32.match(t) for t in traces) and len(set(traces)) == 2
    assert [actor for _, actor in rows] == [None, None]


@pytest.mark.django_db
def test_one_call_outside_a_request_gives_each_job_its_own_random_keys(fast: Target) -> None:
    """The keys of one call come from one read of the random source: each job still has a
    dedupe key and a trace id of its own, 128 bits each, none shared with another."""
    enqueue_many([{"target": "t:fast", "payload": i} for i in range(50)])
    rows = list(Job.objects.values_list("dedupe_key", "trace_id"))
    keys = [key for row in rows for key in row]
    assert len(rows) == 50 and all(HEX32.fullmatch(key) for key in keys)
    assert len(set(keys)) == 100


@pytest.mark.django_db
def test_job_context_sets_trace_id_and_actor(fast: Target) -> None:
    with job_context("abc", {"type": "user", "id": 7}):
        enqueue_many([{"target": "t:fast", "payload": 1}, {"target": "t:fast", "payload": 2}])
    enqueue("t:fast", 3)
    rows = dict(Job.objects.values_list("payload", "trace_id"))
    assert rows[1] == rows[2] == "abc"
    assert rows[3] != "abc"
    assert list(Job.objects.filter(trace_id="abc").values_list("actor", flat=True)) == [
        {"type": "user", "id": 7}] * 2


@pytest.mark.django_db
def test_middleware_stamps_trace_id_from_traceparent_and_user(fast: Target) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    user = get_user_model().objects.create_user("alice", password="pw-not-used")

    def view(request: HttpRequest) -> HttpResponse:
        enqueue("t:fast", {"from": "view"}, dedupe_key="mw:1")
        return HttpResponse("ok")

    request = RequestFactory().post("/orders", HTTP_TRACEPARENT=f"00-{trace}-00f067aa0ba902b7-01")
    request.user = user
    response = RequestContextMiddleware(view)(request)
    assert response.status_code == 200
    row = Job.objects.get(dedupe_key="mw:1")
    assert row.trace_id == trace
    assert row.actor == {"type": "user", "id": user.pk, "username": "alice"}
    # The context ends with the request.
    enqueue("t:fast", 2, dedupe_key="mw:2")
    assert Job.objects.get(dedupe_key="mw:2").trace_id != trace


# -- stored fields ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_run_at_and_headers_are_stored(fast: Target) -> None:
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=3)
    enqueue("t:fast", {"a": 1}, code="order.updated", key="o-1", version=4, dedupe_key="f:1",
            headers={"event_id": "e-1", "x": "y"}, run_at=later)
    before = datetime.now(UTC)
    enqueue("t:fast", None, dedupe_key="f:2")
    after = datetime.now(UTC)
    row = Job.objects.get(dedupe_key="f:1")
    assert row.next_run_at == later
    assert row.headers == {"event_id": "e-1", "x": "y"}
    assert (row.payload, row.code, row.key, row.version) == ({"a": 1}, "order.updated", "o-1", 4)
    assert (row.status, row.attempts, row.lane, row.target) == ("PENDING", 0, "fast", "t:fast")
    now_row = Job.objects.get(dedupe_key="f:2")
    assert (now_row.code, now_row.headers, now_row.version) == ("t:fast", {}, 0)
    slack = timedelta(seconds=5)  # PostgreSQL stamps with its own clock
    assert before - slack <= now_row.next_run_at <= after + slack


# -- NOTIFY: tests/db/test_wake_after_commit.py -------------------------------------------


# -- bad text never reaches the database ------------------------------------------------------
#
# PostgreSQL refuses NUL in text and jsonb and text that UTF-8 cannot encode (a lone
# surrogate); its error aborts the caller's transaction. SQLite would store them. Both must
# refuse them the same way, with InvalidJob, before any write.

BAD_TEXT = {
    "nul": "\x00",
    "backslash-nul": "\\\x00",  # JSON "\\\u0000": an escaped backslash, then a real NUL
    "high-surrogate": "\ud800",
    "low-surrogate": "\udfff",
}

# Where the bad text goes: (name, item fields made from it, the field InvalidJob names).
BAD_PLACES: list[tuple[str, Callable[[str], dict[str, Any]], str]] = [
    ("payload-value", lambda bad: {"payload": {"a": f"x{bad}y"}}, "payload"),
    ("payload-key", lambda bad: {"payload": {f"k{bad}": 1}}, "payload"),
    ("payload-nested", lambda bad: {"payload": {"a": [1, {"b": [2, f"{bad}z"]}]}}, "payload"),
    ("payload-nested-key", lambda bad: {"payload": [{"a": {f"{bad}": None}}]}, "payload"),
    ("payload-scalar", lambda bad: {"payload": bad}, "payload"),
    ("key", lambda bad: {"key": f"order-{bad}"}, "key"),
    ("code", lambda bad: {"code": f"code-{bad}"}, "code"),
    ("dedupe_key", lambda bad: {"dedupe_key": f"dk-{bad}"}, "dedupe_key"),
    ("header-name", lambda bad: {"headers": {f"h{bad}": "v"}}, "headers"),
    ("header-value", lambda bad: {"headers": {"h": f"v{bad}"}}, "headers"),
    ("header-nested", lambda bad: {"headers": {"h": {"n": [f"{bad}"]}}}, "headers"),
]


def nested(depth: int, inner: Any = 1) -> Any:
    """``inner`` inside ``depth`` containers, lists and objects in turn (built without
    recursion: the deepest case is far past Python's recursion limit)."""
    value = inner
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value


DEEP_ITEMS: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("payload-one-too-deep", lambda: {"payload": nested(text.MAX_PAYLOAD_DEPTH + 1)},
     "payload"),
    ("payload-100000-deep", lambda: {"payload": nested(100_000)}, "payload"),
    ("headers-too-deep", lambda: {"headers": {"h": nested(text.MAX_PAYLOAD_DEPTH)}},
     "headers"),
]

REFUSALS: list[Any] = [
    pytest.param(lambda p=place, b=bad: p(b), field, id=f"{name}-{kind}")
    for name, place, field in BAD_PLACES for kind, bad in BAD_TEXT.items()
] + [pytest.param(make, field, id=name) for name, make, field in DEEP_ITEMS]


@TRANSACTIONAL
@pytest.mark.parametrize(("make_bad", "field"), REFUSALS)
def test_bad_text_and_deep_nesting_are_refused_before_any_write(
        fast: Target, make_bad: Callable[[], dict[str, Any]], field: str) -> None:
    """NUL, a lone surrogate or nesting past MAX_PAYLOAD_DEPTH: InvalidJob naming the field,
    nothing written, and the caller's transaction goes on (a PostgreSQL error would have
    aborted it: "current transaction is aborted")."""
    bad = make_bad()
    with pytest.raises(InvalidJob) as many:
        enqueue_many([{"target": "t:fast", "payload": {"ok": 1}, "dedupe_key": "before-bad"},
                      {"target": "t:fast", "payload": {"ok": 2}, **bad}])
    assert many.value.field == field
    assert count_jobs() == 0
    with transaction.atomic():
        VersionCounter.objects.create(key="business-write", value=1)
        with pytest.raises(InvalidJob) as one:
            enqueue("t:fast", **{"payload": {"ok": 3}, **bad})
        assert one.value.field == field
        assert count_jobs() == 0  # a query in the same block still runs
        enqueue("t:fast", {"ok": 4}, dedupe_key="after-refusal")
    assert list(Job.objects.values_list("dedupe_key", "payload")) == [
        ("after-refusal", {"ok": 4})]
    assert VersionCounter.objects.get(key="business-write").value == 1


@TRANSACTIONAL
@pytest.mark.parametrize("bad", list(BAD_TEXT.values()), ids=list(BAD_TEXT))
def test_next_version_refuses_bad_text_and_the_transaction_goes_on(bad: str) -> None:
    with transaction.atomic():
        with pytest.raises(InvalidJob) as info:
            next_version(f"order-{bad}")
        assert info.value.field == "key"
        assert next_version("order-ok") == 1
    assert list(VersionCounter.objects.values_list("key", "value")) == [("order-ok", 1)]


# Strings made of what the text checks must tell apart: quotes, backslashes, brackets, "u0000"
# written out, a real NUL, a lone surrogate, an astral character.
TRICKY_TEXT = st.text(st.sampled_from(['"', "\\", "[", "]", "{", "}", "u", "0", "a", "\x00",
                                       "\ud800", "😀"]), max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=40)


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, object keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@given(JSON_VALUES)
@hypothesis_settings(max_examples=500, deadline=None)
def test_text_checks_agree_with_the_value(value: Any) -> None:
    """The checks read the JSON text (fast); they must say what the value itself says, for
    strings full of escapes and brackets. A limit of 3 makes too-deep values common."""
    texts = list(_strings(value))
    with mock.patch.object(text, "MAX_PAYLOAD_DEPTH", 3):
        if any("\ud800" in t for t in texts):
            expected: str | None = text.SURROGATE_PROBLEM
        elif any("\x00" in t for t in texts):
            expected = text.NUL_PROBLEM
        elif _depth(value) > 3:
            expected = "is nested more than MAX_PAYLOAD_DEPTH (3) deep"
        else:
            expected = None
        if expected is None:
            written = enqueueing._json_text("payload", value)
            assert json.loads(written) == value
            assert written == text._ENCODER.encode(value)  # the C encoder, called directly
        else:
            with pytest.raises(InvalidJob) as info:
                enqueueing._json_text("payload", value)
            assert (info.value.field, info.value.problem) == ("payload", expected)


def test_a_payload_that_failed_to_encode_leaves_no_trace_on_the_next() -> None:
    """The encoder kept between calls remembers the containers it is inside, to refuse a
    circular payload; one that raised midway must not make the next call of the thread see
    a circle that is not there."""
    items: list[Any] = [1, NotJson()]
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        text.json_text(items)
    items[1] = 2
    assert text.json_text(items) == "[1,2]"
    items[1] = items
    with pytest.raises(ValueError, match="Circular reference"):
        text.json_text(items)
    items[1] = {"x": [3]}
    assert text.json_text(items) == '[1,{"x":[3]}]'


class ItemsWaitInAThread(dict):
    """A mapping whose ``items`` (the encoder calls it for a dict subclass) holds the
    encode of any thread but the main one until ``release`` is set."""

    inside = threading.Event()
    release = threading.Event()

    def items(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            self.inside.set()
            self.release.wait(10)
        return super().items()


def test_two_threads_encoding_the_same_payload_at_once_both_succeed() -> None:
    """A payload shared by concurrent requests (a module's constant, say) is encoded by
    each thread's own encoder: a shared one would take the other thread's visit, still in
    progress, for a circle."""
    shared = ItemsWaitInAThread(order=[1, 2])
    other: list[str | BaseException] = []

    def encode() -> None:
        try:
            other.append(text.json_text(shared))
        except BaseException as exc:  # reported by the main thread
            other.append(exc)

    thread = threading.Thread(target=encode)
    thread.start()
    try:
        assert shared.inside.wait(10)  # the thread is inside the encode of ``shared``
        assert text.json_text(shared) == '{"order":[1,2]}'
    finally:
        shared.release.set()
        thread.join()
    assert other == ['{"order":[1,2]}']


# Text that is valid and must come back unchanged: astral characters, a literal backslash
# followed by "u0000" (not a NUL), control characters other than NUL, brackets and escaped
# quotes in strings (ahead of the deepest value: miscounted, they would push it over the
# limit), more than MAX_PAYLOAD_DEPTH brackets in all, and the deepest nesting allowed.
GOOD_PAYLOAD: dict[str, Any] = {
    'quote"[[': 'q\\"{{[\\',
    "brackets": "[{" * 300,
    "emoji 😀": "😀 snow ☃ é",
    "escaped": "\\u0000",
    "escaped twice": "\\\\u0000",
    "controls": "\x01\x1f\x7f\u2028",
    "wide": [{"i": i, "l": [i]} for i in range(200)],
    "deepest": nested(text.MAX_PAYLOAD_DEPTH - 1),
}


@TRANSACTIONAL
def test_valid_unusual_text_round_trips(targets: Targets, now: datetime) -> None:
    """Stored as given (read through the ORM), handed to a handler as given, and the
    job's ``payload_json`` (what a forwarding handler sends) decodes to it and carries the
    characters unescaped, as PostgreSQL's jsonb gives them back, on both databases."""
    decoded = targets("t:decoded")
    forwarded = targets("t:forwarded")
    text = {"key": "order-😀", "code": "code-😀", "headers": {"h-😀": "v\\u0000😀"}}
    for name in ("t:decoded", "t:forwarded"):
        assert enqueue(name, GOOD_PAYLOAD, dedupe_key=f"{name}:😀", run_at=now, version=1,
                       **text).inserted
    row = Job.objects.get(target="t:decoded")
    assert row.payload == GOOD_PAYLOAD
    assert (row.key, row.code, row.dedupe_key, row.headers) == (
        text["key"], text["code"], "t:decoded:😀", text["headers"])
    assert fast_poller()(now) == 2
    [got] = decoded.extra["calls"]
    assert (got.payload, got.key, got.headers) == (GOOD_PAYLOAD, text["key"], text["headers"])
    [sent] = forwarded.extra["calls"]
    assert isinstance(sent.payload_json, str) and json.loads(sent.payload_json) == GOOD_PAYLOAD
    assert "😀 snow ☃ é" in sent.payload_json
