"""Target pause state, shared by every worker through the ``TargetPause`` table.

A paused target is skipped until its pause runs out; then exactly one worker in the
cluster wins the probe (one row sent). A probe that reaches the target clears the pause;
one that does not extends it by another ``PROBE_S``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.errors import UnknownTarget
from jobs_engine.registry import get_target
from jobs_engine.states import Lane


@dataclass(frozen=True)
class Gate:
    skip: frozenset[str]  # paused targets: read nothing of them
    probes: frozenset[str]  # paused targets this worker may send one row of now


class PauseGate:
    def __init__(self, worker_id: str, settings: JobsSettings) -> None:
        self.worker_id = worker_id
        self.settings = settings

    def check(self, now: datetime, lane: Lane) -> Gate:
        skip: set[str] = set()
        probes: set[str] = set()
        for pause in store.pauses_all():
            try:
                if get_target(pause.target).lane is not lane:
                    continue
            except UnknownTarget:
                continue
            if pause.paused_until <= now and store.pause_claim_probe(
                pause.target, self.worker_id, now, self.settings.PROBE_S
            ):
                probes.add(pause.target)
            else:
                skip.add(pause.target)
        return Gate(frozenset(skip), frozenset(probes))

    @staticmethod
    def probe_answered(target: str) -> None:
        """The probe reached the target (any result but unreachable): resume it."""
        store.pause_clear(target)
