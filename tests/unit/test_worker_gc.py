"""Worker processes tune the cycle collector for polls that build many short-lived
objects (see ``jobs_engine.lanes.worker.tune_garbage_collector``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from jobs_engine.lanes.worker import GC_GEN0_THRESHOLD, tune_garbage_collector


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tuning_raises_gen0_threshold_and_freezes_startup_objects(restored_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    tune_garbage_collector()
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0


def test_a_higher_threshold_already_set_is_kept(restored_gc: None) -> None:
    gc.set_threshold(GC_GEN0_THRESHOLD * 3, 10, 10)
    tune_garbage_collector()
    assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD * 3
