"""Shared body of the worker commands."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs_engine.conf import jobs_settings
from jobs_engine.errors import DatabaseNotReady
from jobs_engine.lanes.worker import WorkerProcess


def run_lanes(command: BaseCommand, lanes: set[str]) -> None:
    if not jobs_settings().WORKERS:
        command.stdout.write("JOBS_WORKERS=off: this process only enqueues; no lane runs.")
        return
    worker = WorkerProcess(lanes)
    try:
        worker.start()
    except DatabaseNotReady as exc:  # one line and exit 1, not a traceback
        raise CommandError(f"worker {worker.worker_id} cannot start: {exc}") from None
    command.stdout.write(f"worker {worker.worker_id} running {', '.join(sorted(lanes))}")
    command.stdout.flush()
    worker.run()
