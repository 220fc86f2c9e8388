"""Target pause state, shared by every worker through the ``TargetPause`` table.

A paused target is skipped until its pause runs out; then exactly one worker in the
cluster wins the probe (one row sent). A probe that reaches the target clears the pause;
one that does not extends it by another ``PROBE_S``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.job import Job


class PauseGate:
    """The probe of a paused target whose pause ran out. The lanes' reads skip paused
    targets themselves and tell which rows they read are of a target whose pause ran
    out (``store.jobs_fast_poll``, ``store.jobs_long_reserve``)."""

    def __init__(self, worker_id: str, settings: JobsSettings) -> None:
        self.worker_id = worker_id
        self.settings = settings

    def claim_probe(self, target: str, now: datetime) -> bool:
        """Called only by a worker that holds a due row of ``target``, so the winner
        really sends the probe."""
        return store.pause_claim_probe(target, self.worker_id, now, self.settings.PROBE_S)

    def probe_rows(self, rows: list[Job], expired: Collection[str], now: datetime
                   ) -> tuple[list[Job], list[Job], frozenset[str]]:
        """Split ``rows`` into (to run, to give back, targets probed by this worker).

        A paused target whose pause ran out gets one row through, on the one worker that
        wins the probe; its other rows are given back untouched.
        """
        keep: list[Job] = []
        give_back: list[Job] = []
        probing: set[str] = set()
        decided: dict[str, bool] = {}
        for row in rows:
            if row.target not in expired:
                keep.append(row)
                continue
            if row.target not in decided:
                decided[row.target] = self.claim_probe(row.target, now)
                if decided[row.target]:
                    probing.add(row.target)
                    keep.append(row)
                    continue
            give_back.append(row)
        return keep, give_back, frozenset(probing)

    @staticmethod
    def probe_answered(target: str) -> None:
        """The probe reached the target (any result but unreachable): resume it."""
        store.pause_clear(target)
