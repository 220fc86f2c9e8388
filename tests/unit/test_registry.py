"""register_target: bad input raises naming the field, and the registry stays as it was.

Targets are registered from apps' ``ready()``; a half-registered or silently replaced target
would send jobs to the wrong handler, so every check runs before the registry changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobs_engine import (
    DeliveryMode,
    DuplicateTarget,
    InvalidJob,
    JobPolicy,
    Lane,
    register_target,
)
from jobs_engine.errors import UnknownTarget
from jobs_engine.job import Job
from jobs_engine.registry import (
    Target,
    all_targets,
    get_target,
    lane_names,
    lane_targets,
    unregister_target,
)

NAME = "t:registry-test"


def noop(job: Job) -> None:
    """A handler that does nothing."""


@pytest.fixture(autouse=True)
def _unregister() -> Iterator[None]:
    yield
    unregister_target(NAME)


def snapshot() -> dict[str, Target]:
    return {t.name: t for t in all_targets()}


def test_valid_registration_is_stored() -> None:
    policy = JobPolicy(attempts=4, backoff_s=2.5, keep_completed=0)
    target = register_target(NAME, noop, lane=Lane.LONG,
                             delivery_mode=DeliveryMode.AT_LEAST_ONCE, exclusive=True,
                             policy=policy, batch_size=500)
    assert get_target(NAME) is target
    assert target.batch_size == 500
    assert (target.lane, target.delivery_mode, target.exclusive) == (
        Lane.LONG, DeliveryMode.AT_LEAST_ONCE, True)
    assert target.policy is policy


def test_lane_and_mode_accept_their_string_values() -> None:
    target = register_target(NAME, noop, lane="fast", delivery_mode="at_least_once")
    assert (target.lane, target.delivery_mode) == (Lane.FAST, DeliveryMode.AT_LEAST_ONCE)
    assert target.delivery_mode is DeliveryMode("at_least_once")


def test_default_delivery_mode_is_at_most_once() -> None:
    assert register_target(NAME, noop, lane=Lane.FAST).delivery_mode is DeliveryMode.AT_MOST_ONCE


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("handler-none", {"handler": None}, "handler"),
    ("handler-string", {"handler": "examples.targets.log_event"}, "handler"),
    ("lane-unknown", {"lane": "medium"}, "lane"),
    ("lane-none", {"lane": None}, "lane"),
    ("mode-unknown", {"delivery_mode": "exactly_once"}, "delivery_mode"),
    ("batch-handler-not-callable", {"batch_handler": 42}, "batch_handler"),
    ("batch-size-zero", {"batch_size": 0}, "batch_size"),
    ("batch-size-text", {"batch_size": "500"}, "batch_size"),
    ("batch-size-bool", {"batch_size": True}, "batch_size"),
    ("lossy-text", {"lossy": "no"}, "lossy"),
    ("lossy-int", {"lossy": 1}, "lossy"),
    ("exclusive-text", {"exclusive": "false"}, "exclusive"),
    ("exclusive-none", {"exclusive": None}, "exclusive"),
]


@pytest.mark.parametrize(("bad", "field"), [(b, f) for _, b, f in BAD],
                         ids=[name for name, _, _ in BAD])
def test_bad_registration_raises_before_the_registry_changes(bad: dict[str, Any], field: str
                                                             ) -> None:
    before = snapshot()
    kwargs: dict[str, Any] = {"handler": noop, "lane": Lane.FAST, **bad}
    handler = kwargs.pop("handler")
    with pytest.raises(InvalidJob) as info:
        register_target(NAME, handler, **kwargs)
    assert info.value.field == field
    assert field in str(info.value)
    assert snapshot() == before
    with pytest.raises(UnknownTarget):
        get_target(NAME)


@pytest.mark.parametrize("name", ["", "   ", None, 7, "x" * 201])
def test_bad_name_raises_before_the_registry_changes(name: Any) -> None:
    before = snapshot()
    with pytest.raises(InvalidJob) as info:
        register_target(name, noop, lane=Lane.FAST)
    assert info.value.field == "name"
    assert snapshot() == before


def test_duplicate_name_keeps_the_first_handler() -> None:
    def second(job: Job) -> None:
        raise AssertionError("the second registration must not replace the first")

    first = register_target(NAME, noop, lane=Lane.FAST)
    before = snapshot()
    with pytest.raises(DuplicateTarget) as info:
        register_target(NAME, second, lane=Lane.LONG, lossy=True)
    assert info.value.name == NAME
    assert NAME in str(info.value)
    assert snapshot() == before
    kept = get_target(NAME)
    assert kept is first
    assert (kept.handler, kept.lane, kept.lossy) == (noop, Lane.FAST, False)


def test_unregister_then_register_again() -> None:
    """Re-declaration (tests, reloads) goes through unregister; then the name is free."""
    register_target(NAME, noop, lane=Lane.FAST)
    unregister_target(NAME)
    with pytest.raises(UnknownTarget):
        get_target(NAME)
    replacement: Callable[[Job], None] = print
    assert register_target(NAME, replacement, lane=Lane.LONG).handler is replacement


def test_unknown_target_names_it() -> None:
    with pytest.raises(UnknownTarget) as info:
        get_target("t:never-registered")
    assert info.value.name == "t:never-registered"
    assert "t:never-registered" in str(info.value)


def test_a_job_decodes_its_payload_when_read_and_keeps_the_stored_text() -> None:
    """The store reads a row straight into ``Job``: ``payload`` is decoded from
    ``payload_json`` at each access; a handler that forwards the text reads ``payload_json``."""
    from jobs_engine.lanes.handlers import call_handler

    job = Job(1, "t", "c", "k", 2, '{"p": 1}', {"h": "v"}, 3, "tr", "dk", {"a": 1}, None, 5,
              "at_most_once")
    assert job.payload == {"p": 1} and job.payload_json == '{"p": 1}'
    assert job._replace(payload_json=None).payload is None
    seen: list[object] = []
    decoded = Target(name="t:decoded", handler=lambda j: seen.append(j.payload), lane=Lane.FAST)
    raw = Target(name="t:raw", handler=lambda j: seen.append(j.payload_json), lane=Lane.FAST)
    assert call_handler(decoded, job).error is None and call_handler(raw, job).error is None
    assert seen == [{"p": 1}, '{"p": 1}']


@pytest.mark.parametrize("removed", [{"max_attempts": 3}, {"retry_delays": [60]},
                                     {"payload_json": True}], ids=lambda kw: next(iter(kw)))
def test_keywords_before_the_first_release_are_refused_by_python(removed: dict[str, Any]
                                                                 ) -> None:
    """``max_attempts``/``retry_delays`` (a ``JobPolicy`` says it) and ``payload_json``
    (every job carries ``job.payload_json``) never shipped: Python's own TypeError names the
    keyword, and nothing is registered."""
    before = snapshot()
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(removed))}'"):
        register_target(NAME, noop, lane=Lane.FAST, **removed)
    assert snapshot() == before




def test_lane_targets_follow_registration_and_removal(targets: Any) -> None:
    """A worker asks for its lane's targets at every poll and gets the list made once;
    registering or dropping a target makes it again."""
    before = lane_targets(Lane.FAST)
    assert lane_targets(Lane.FAST) is before
    targets("reg.lane-b")
    targets("reg.lane-a")
    targets("reg.lossy", lossy=True)
    targets("reg.long", lane="long")
    names = [t.name for t in lane_targets(Lane.FAST)]
    assert {"reg.lane-a", "reg.lane-b"} <= set(names) and names == sorted(names)
    assert "reg.lossy" not in names and "reg.long" not in names
    assert "reg.long" in [t.name for t in lane_targets(Lane.LONG)]
    unregister_target("reg.lane-a")
    assert "reg.lane-a" not in [t.name for t in lane_targets(Lane.FAST)]


def test_lane_names_are_made_with_the_lane_targets_and_kept_until_they_change(
        targets: Any) -> None:
    """A long-lane poll passes its targets' names and the exclusive ones' to the reserve:
    made once with the targets, not at each poll."""
    targets("reg.names-b", lane="long", exclusive=True)
    targets("reg.names-a", lane="long")
    made = lane_names(Lane.LONG)
    assert lane_names(Lane.LONG) is made
    assert made.targets is lane_targets(Lane.LONG)
    assert made.names == tuple(t.name for t in made.targets)
    assert {"reg.names-a", "reg.names-b"} <= set(made.names)
    assert "reg.names-b" in made.exclusive_names and "reg.names-a" not in made.exclusive_names
    unregister_target("reg.names-b")
    again = lane_names(Lane.LONG)
    assert again is not made and "reg.names-b" not in again.names + again.exclusive_names
