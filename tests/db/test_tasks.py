"""Django's Tasks API on the engine (docs/design.md#djangos-tasks-api), on PostgreSQL and
SQLite: enqueue in the caller's transaction, every status and field of a ``TaskResult``,
priority and ``run_after``, the queue's policy, and every bad input refused with nothing
written. Workers are the real long lane, run in this process (``threads=False``)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import mail
from django.db import transaction
from django.utils import timezone

from jobs_engine.conf import load_settings
from jobs_engine.enqueueing import enqueue
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.lanes.retention import RetentionService
from jobs_engine.models import CompletedJob
from jobs_engine.models import Job as JobRow
from jobs_engine.operators.actions import cancel_job, retry_job
from jobs_engine.tasks import JobsEngineBackend
from jobs_engine.tasks.compat import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests import task_functions as tasks
from tests.helpers import FakeMonotonic

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = load_settings({}, environ={})
READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
FAILED, SUCCESSFUL = TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL


def task_jobs() -> int:
    return JobRow.objects.filter(target__startswith="tasks:").count() \
        + CompletedJob.objects.filter(target__startswith="tasks:").count()


class Worker:
    """One long-lane worker in this process: ``poll(at)`` reserves and runs what is due."""

    def __init__(self, batch: int | None = None) -> None:
        self.id = f"w-{uuid.uuid4().hex[:6]}"
        settings = SETTINGS if batch is None else load_settings(  # ``batch`` rows a poll
            {"LONG_BATCH": batch, "LONG_PREFETCH": 1}, environ={})
        self.lane = LongLane(self.id, settings, PauseGate(self.id, settings), threads=False,
                             monotonic=FakeMonotonic())

    def drain(self, at: datetime | None = None, rounds: int = 10) -> None:
        at = at or timezone.now()
        for _ in range(rounds):
            if not self.lane.run_once(at):
                return
            at += timedelta(seconds=1)


# -- enqueue joins the caller's transaction ----------------------------------------------------


def test_a_committed_enqueue_has_exactly_one_task_and_a_rolled_back_one_none() -> None:
    sent: list[Any] = []
    task_enqueued.connect(lambda sender, task_result, **_: sent.append(task_result.id),
                          weak=False, dispatch_uid="t-enq")
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(1, 2)
            raise RuntimeError("the business change failed")
        assert task_jobs() == 0 and sent == []
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            assert sent == []  # announced when it exists for others: at commit
        assert task_jobs() == 1 and sent == [result.id]
    finally:
        task_enqueued.disconnect(dispatch_uid="t-enq")
    row = JobRow.objects.get(id=int(result.id))
    assert (row.target, row.code, row.lane) == ("tasks:default:default",
                                                "tests.task_functions.add", "long")


def test_enqueue_returns_a_ready_result_and_get_result_reads_it_back() -> None:
    result = tasks.add.enqueue(2, b=3)
    assert (result.status, result.args, result.kwargs, result.backend) == (READY, [2], {"b": 3},
                                                                           "default")
    assert result.worker_ids == [] and result.errors == [] and result.attempts == 0
    again = tasks.add.get_result(result.id)
    assert (again.id, again.status, again.args, again.kwargs) == (result.id, READY, [2], {"b": 3})
    assert again.task.func is tasks.add.func and again.enqueued_at is not None
    assert (again.started_at, again.finished_at, again.last_attempted_at) == (None, None, None)
    with pytest.raises(ValueError, match="not finished"):
        _ = again.return_value


# -- results --------------------------------------------------------------------------------------


def test_a_task_that_returns_is_successful_with_its_value_times_and_worker() -> None:
    result = tasks.add.enqueue(20, 22)
    worker = Worker()
    worker.drain()
    assert result.status == READY  # a result is as it was read ...
    result.refresh()  # ... until refreshed
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 42, 1)
    assert result.worker_ids == [worker.id] and result.errors == []
    assert result.enqueued_at <= result.started_at == result.last_attempted_at \
        <= result.finished_at
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_a_task_that_raises_is_failed_with_its_exception_and_traceback() -> None:
    result = tasks.fail.enqueue("the disk is full")
    Worker().drain()
    result.refresh()
    assert result.status == FAILED and result.attempts == 1 and result.finished_at is not None
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "Traceback (most recent call last)" in error.traceback
    assert "ValueError: the disk is full" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_the_task_context_has_the_attempt_the_result_id_and_the_worker() -> None:
    result = tasks.who_am_i.enqueue()
    worker = Worker()
    worker.drain()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "status": "RUNNING",
                                   "worker_ids": [worker.id]}


def test_a_coroutine_task_runs_in_the_worker() -> None:
    result = tasks.async_add.enqueue(1, 2)
    Worker().drain()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 3)


def test_a_queue_policy_retries_and_every_try_is_an_attempt_with_its_error() -> None:
    result = tasks.fail_twice.enqueue()
    worker = Worker()
    at = timezone.now()
    worker.lane.run_once(at)
    result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (READY, 1, 1)
    assert "try 1 fails" in result.errors[0].traceback
    worker.drain(at + timedelta(seconds=1))
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 3, 3)
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert result.started_at < result.last_attempted_at


def test_started_and_finished_signals_carry_the_result_as_it_stands() -> None:
    seen: list[tuple[str, Any, int]] = []

    def started(sender: Any, task_result: Any, **_: Any) -> None:
        seen.append(("started", task_result.status, task_result.attempts))

    def finished(sender: Any, task_result: Any, **_: Any) -> None:
        seen.append(("finished", task_result.status, task_result.attempts))

    task_started.connect(started, dispatch_uid="t-start")
    task_finished.connect(finished, dispatch_uid="t-finish")
    try:
        tasks.add.enqueue(1, 1)
        tasks.fail.enqueue("no")
        Worker(batch=1).drain()
    finally:
        task_started.disconnect(dispatch_uid="t-start")
        task_finished.disconnect(dispatch_uid="t-finish")
    assert seen == [("started", RUNNING, 1), ("finished", SUCCESSFUL, 1),
                    ("started", RUNNING, 1), ("finished", FAILED, 1)]


# -- priority and run_after --------------------------------------------------------------------


def test_a_higher_priority_due_task_runs_before_a_lower_one() -> None:
    low = tasks.add.using(priority=-5).enqueue(0, 1)
    middle = tasks.add.enqueue(0, 2)
    high = tasks.add.using(priority=100).enqueue(0, 3)
    worker = Worker(batch=1)
    order = []
    for _ in range(3):
        worker.lane.run_once(timezone.now())
        order.append([r.id for r in (low, middle, high)
                      if tasks.add.get_result(r.id).status == SUCCESSFUL])
    assert order == [[high.id], [middle.id, high.id], [low.id, middle.id, high.id]]


def test_run_after_is_when_the_task_comes_due_and_the_idle_lane_wakes_for_it() -> None:
    run_after = timezone.now() + timedelta(seconds=30)
    result = tasks.add.using(run_after=run_after).enqueue(1, 1)
    assert JobRow.objects.get(id=int(result.id)).next_run_at == run_after
    worker = Worker()
    now = run_after - timedelta(seconds=10)
    assert worker.lane.run_once(now) == 0
    assert worker.lane.due_in_s() == pytest.approx(10, abs=0.01)  # not the idle poll's 5 s
    assert worker.lane.run_once(run_after) == 1
    assert worker.lane.due_in_s() is None
    assert tasks.add.get_result(result.id).task.run_after == run_after


# -- Django's documented examples, unchanged ------------------------------------------------


def test_the_documented_email_example_sends_the_mail_in_the_worker() -> None:
    result = tasks.email_users.enqueue(
        emails=["user@example.com"],
        subject="You have a message",
        message="Hello there!",
    )
    assert mail.outbox == []
    Worker().drain()
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 1)
    assert [(m.subject, m.to) for m in mail.outbox] == [("You have a message",
                                                         ["user@example.com"])]


def test_the_documented_decorator_arguments_and_context_examples() -> None:
    on_queue = tasks.email_users_on_queue.enqueue(["a@example.com"], "s", "m")
    assert (on_queue.task.priority, on_queue.task.queue_name) == (2, "emails")
    assert JobRow.objects.get(id=int(on_queue.id)).target == "tasks:default:emails"
    assert tasks.email_users.priority == 0
    assert tasks.email_users.using(priority=10).priority == 10
    with_context = tasks.email_users_with_context.enqueue(["b@example.com"], "s", "m")
    Worker().drain()
    for result in (on_queue, with_context):
        result.refresh()
        assert (result.status, result.return_value) == (SUCCESSFUL, 1)


def test_the_documented_round_trip_examples() -> None:
    with pytest.raises(TypeError, match="Object of type datetime is not JSON serializable"):
        tasks.process_data.enqueue(datetime.now())
    assert task_jobs() == 0
    result = tasks.double_dictionary.enqueue((1, 2, 3))
    Worker().drain()
    result.refresh()
    assert result.status == FAILED
    assert "TypeError: unhashable type: 'list'" in result.errors[0].traceback


def test_the_documented_on_commit_example_enqueues_after_the_commit() -> None:
    from functools import partial

    with transaction.atomic():
        transaction.on_commit(partial(tasks.add.enqueue, a=1, b=2))
        assert task_jobs() == 0
    assert task_jobs() == 1


def test_get_result_on_the_backend_and_the_mismatch_on_another_task() -> None:
    result = tasks.add.enqueue(1, 2)
    assert task_backends["default"].get_result(result.id).task.func is tasks.add.func
    with pytest.raises(TaskResultMismatch):
        tasks.fail.get_result(result.id)


# -- operators and retention -------------------------------------------------------------------


def test_an_operator_retries_a_failed_task_and_cancels_a_waiting_one() -> None:
    failed = tasks.fail_twice.using(queue_name="default").enqueue()
    worker = Worker()
    worker.drain()
    failed.refresh()
    assert failed.status == FAILED and failed.attempts == 1
    retry_job(failed.id, None)
    failed.refresh()
    assert failed.status == READY and failed.attempts == 1  # the failed try is still there
    worker.drain()
    failed.refresh()
    assert (failed.status, failed.attempts, len(failed.errors)) == (FAILED, 2, 2)
    waiting = tasks.add.enqueue(1, 1)
    cancel_job(waiting.id, None)
    with pytest.raises(TaskResultDoesNotExist):
        waiting.refresh()


def test_results_are_kept_by_the_queues_policy() -> None:
    keep_two = tasks.add.using(queue_name="kept")
    results = []
    at = timezone.now()
    for n in range(3):
        results.append(keep_two.enqueue(n, 0))
        Worker().drain(at + timedelta(seconds=n))
    RetentionService(SETTINGS).run_once(timezone.now())
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(results[0].id)
    assert [tasks.add.get_result(r.id).return_value for r in results[1:]] == [1, 2]


# -- the admin ------------------------------------------------------------------------------------


def test_the_admin_shows_a_task_path_arguments_tries_and_return_value() -> None:
    from django.test import Client
    from django.urls import reverse

    from tests.db.operator_helpers import manager_client
    from tests.db.test_access import viewer

    done = tasks.add.enqueue(20, b=22)
    failed = tasks.fail.enqueue("the <disk> is full")
    Worker().drain()
    manager = manager_client()
    page = manager.get(reverse("admin:jobs_engine_completedjob_change", args=[done.id]))
    text = page.content.decode()
    assert page.status_code == 200 and "Task (Django&#x27;s Tasks API)" in text
    assert "tests.task_functions.add" in text and "&quot;b&quot;: 22" in text
    assert "<pre>42</pre>" in text or ">42<" in text  # the return value
    page = manager.get(reverse("admin:jobs_engine_job_change", args=[failed.id]))
    text = page.content.decode()
    assert "1. " in text and "raised builtins.ValueError: ValueError: the &lt;disk&gt; is full" \
        in text
    other = Client()
    other.force_login(viewer())
    page = other.get(reverse("admin:jobs_engine_job_change", args=[failed.id]))
    text = page.content.decode()
    assert page.status_code == 200 and "tests.task_functions.fail" in text
    assert "disk" not in text  # arguments and tries are private


# -- bad input: Django's documented exceptions, nothing written ---------------------------


@pytest.mark.parametrize("change", [
    {"queue_name": "nope"},
    {"priority": 101},
    {"priority": -101},
    {"run_after": datetime(2030, 1, 1, 12, 0)},  # no time zone
])
def test_a_bad_task_is_refused_with_invalid_task(change: dict[str, Any]) -> None:
    with pytest.raises(InvalidTask):
        tasks.add.using(**change).enqueue(1, 2)
    assert task_jobs() == 0


@pytest.mark.parametrize("args", [({1, 2},), (object(),), (b"bytes",)])
def test_arguments_json_cannot_hold_are_a_type_error(args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        tasks.process_data.enqueue(*args)
    assert task_jobs() == 0


def test_arguments_the_database_cannot_hold_are_invalid_task_naming_them() -> None:
    with pytest.raises(InvalidTask, match="arguments"):
        tasks.process_data.enqueue("a\x00b")
    assert task_jobs() == 0


@pytest.mark.parametrize("result_id", ["", "abc", "0", "-1", "1.5", " 1",
                                       "\u0661",  # ARABIC-INDIC DIGIT ONE: a digit, not 0-9
                                       "99999999999999999999", "12345678", 7])
def test_get_result_of_an_unknown_or_malformed_id_does_not_exist(result_id: Any) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_get_result_of_a_job_that_is_not_a_task_does_not_exist(targets: Any) -> None:
    targets("plain:long", handler=lambda job: None, lane="long")
    job = enqueue("plain:long", {"task": "tests.task_functions.add"})
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(job.job_id))


@pytest.mark.parametrize("payload", [{"task": "tests.task_functions.add"}, None, [1], "x",
                                     {"task": 5, "args": [], "kwargs": {}, "backend": "default",
                                      "queue": "default", "priority": 0}])
def test_get_result_of_a_task_queues_job_that_no_task_enqueued_does_not_exist(
        payload: Any) -> None:
    """A job of a queue's target enqueued around the Tasks API (by ``enqueue``, a data
    migration) names no task: no result, rather than a KeyError from its payload."""
    job = enqueue("tasks:default:default", payload)
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(job.job_id))


def test_arguments_nested_past_the_payload_depth_are_invalid_task() -> None:
    """Deep nesting would fail the JSON encoder with a RecursionError (past ~1,000) or
    the worker's decoder (past MAX_PAYLOAD_DEPTH): refused, named, nothing written."""
    deep: Any = []
    for _ in range(5_000):
        deep = [deep]
    with pytest.raises(InvalidTask, match=r"arguments .*nested"):
        tasks.process_data.enqueue(deep)
    shallow_but_too_deep: Any = "x"
    for _ in range(101):
        shallow_but_too_deep = {"k": shallow_but_too_deep}
    with pytest.raises(InvalidTask, match="MAX_PAYLOAD_DEPTH"):
        tasks.process_data.enqueue(value=shallow_but_too_deep)
    assert task_jobs() == 0


def test_arguments_read_back_exactly_as_the_worker_gets_them() -> None:
    """JSON has string keys only and no tuples: the result ``enqueue`` returns, the one
    ``get_result`` reads and the task's own call all see the stored arguments."""
    result = tasks.process_data.enqueue({1: 2, "t": (1, 2)})
    stored = {"1": 2, "t": [1, 2]}
    assert result.args == [stored]
    assert task_backends["default"].get_result(result.id).args == [stored]
    Worker().drain()
    assert tasks.process_data.get_result(result.id).return_value == stored


@pytest.mark.parametrize(("params", "names"), [
    ({"QUEUES": []}, "QUEUES"),
    ({"OPTIONS": {"RETRIES": 3}}, "RETRIES"),
    ({"OPTIONS": "fast"}, "OPTIONS"),
    ({"OPTIONS": {"DELIVERY_MODE": "exactly_once"}}, "DELIVERY_MODE"),
    ({"OPTIONS": {"POLICY": "tests.task_functions.nope"}}, "POLICY"),
    ({"OPTIONS": {"POLICY": 3}}, "POLICY"),
    ({"OPTIONS": {"QUEUE_OPTIONS": {"other": {}}}}, "other"),
    ({"OPTIONS": {"QUEUE_OPTIONS": {"default": {"KEEP": 1}}}}, "KEEP"),
])
def test_bad_backend_options_are_refused_naming_them(params: dict[str, Any], names: str
                                                     ) -> None:
    from jobs_engine import registry

    before = {t.name for t in registry.all_targets()}
    with pytest.raises(InvalidTaskBackend, match=names):
        JobsEngineBackend("bad", {"BACKEND": "jobs_engine.tasks.JobsEngineBackend", **params})
    assert {t.name for t in registry.all_targets()} == before
