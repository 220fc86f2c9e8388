"""A schedule for the real-process tests: declared only in processes started with
``JOBS_TEST_SCHEDULE_CRON`` set, so other process tests never tick it.

Its handler appends ``<slot ISO> <job id> <attempts> <unix time>`` to ``<pid>.slots`` in
``$JOBS_TEST_OUT_DIR`` (written, flushed and fsynced per line).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from jobs_engine.job import Job

CODE = "proc_tick"
CRON_ENV = "JOBS_TEST_SCHEDULE_CRON"
OUT_DIR_ENV = "JOBS_TEST_OUT_DIR"


@dataclass(frozen=True)
class SlotRecord:
    pid: int
    slot: str
    job_id: int
    attempts: int
    at: float


def record_slot(slot: datetime, job: Job) -> None:
    from jobs_engine.contrib.schedules.declarations import slot_iso

    line = f"{slot_iso(slot)} {job.id} {job.attempts} {time.time():.6f}\n"
    with open(Path(os.environ[OUT_DIR_ENV]) / f"{os.getpid()}.slots", "a") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_slot_records(out_dir: Path) -> list[SlotRecord]:
    records = []
    for path in sorted(out_dir.glob("*.slots")):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                slot, job_id, attempts, at = line.split()
                records.append(SlotRecord(int(path.stem), slot, int(job_id), int(attempts),
                                          float(at)))
    return sorted(records, key=lambda r: r.at)


class ScheduleAppConfig(AppConfig):
    """Installed only by ``tests.process.settings``."""

    name = "tests.process.schedule_app"
    label = "process_schedule_app"
    verbose_name = "Process-test schedule"

    def ready(self) -> None:
        cron = os.environ.get(CRON_ENV)
        if cron:
            from jobs_engine.contrib.schedules import declare

            declare(CODE, cron, record_slot)
