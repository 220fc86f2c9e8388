"""Settings of the worker processes started by ``tests/process``: the project's settings
plus the apps whose ``ready()`` register the recording targets and the test schedule."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.process.worker_targets.WorkerTargetsConfig",
                  "tests.process.schedule_app.ScheduleAppConfig"]
