"""Settings of the processes the fault suite starts (workers, the enqueuer, migrate): the
test settings plus the app whose ``ready()`` registers the fault targets."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.faults.targets.FaultTargetsConfig"]
