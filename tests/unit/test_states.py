"""The state machine is read from one place (``jobs_engine.states``): the store takes every
status change of its statements from it, each allowed edge has a statement, and an edge
outside it cannot be made (docs/design.md#jobs-and-their-states)."""

from __future__ import annotations

import pytest

from jobs_engine import states, store
from jobs_engine.states import ALLOWED, DEAD, DELETED, PENDING, RUNNING, transition


def test_every_allowed_transition_has_a_statement_and_no_statement_another() -> None:
    assert states.used == set(ALLOWED)


@pytest.mark.parametrize(("source", "target"), [
    (DEAD, RUNNING),  # a DEAD row is retried to PENDING first, never run directly
    (RUNNING, RUNNING),
    (DELETED, DEAD),
    (DELETED, RUNNING),
])
def test_a_transition_outside_the_machine_is_refused(source: states.JobStatus | None,
                                                     target: states.JobStatus | None) -> None:
    with pytest.raises(ValueError, match="no transition"):
        transition(source, to=target)


def test_statements_take_their_statuses_from_their_transition() -> None:
    assert (store.RESERVE.sources, store.RESERVE.target) == ((PENDING,), RUNNING)
    assert store.RETRY.source_values == ["DEAD"] and store.RETRY.target is PENDING
    assert store.CANCEL.target is DELETED
