"""Settings of the worker processes started by ``tests/process``: the project's settings
plus the apps whose ``ready()`` register the recording targets and the test schedule."""

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.process.worker_targets.WorkerTargetsConfig",
                  "tests.process.schedule_app.ScheduleAppConfig"]
