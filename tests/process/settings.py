"""Settings of the worker processes started by ``tests/process``: the project's settings
plus the app whose ``ready()`` registers the recording targets."""

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.process.worker_targets.WorkerTargetsConfig"]
