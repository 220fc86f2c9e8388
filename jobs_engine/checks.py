"""Django system checks: a misconfigured engine fails at start-up naming the setting, not
with a traceback at first use."""

from __future__ import annotations

import os
from typing import Any

from django.core import checks

from jobs_engine.errors import InvalidSettings


@checks.register("jobs_engine")
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    from jobs_engine.conf import RETIRED, load_settings
    from jobs_engine.tenancy import check_resolver

    try:
        current = load_settings()
    except (InvalidSettings, TypeError) as exc:
        return [checks.Error(str(exc), id="jobs_engine.E001", obj="JOBS")]
    found: list[checks.CheckMessage] = [
        checks.Error(f"JOBS[{name!r}] {problem}", id="jobs_engine.E002", obj="JOBS")
        for name, problem in current.problems()
    ]
    if not found:
        # Imported here, once, so a resolver that cannot be used stops the process at
        # start-up instead of failing every request.
        unusable = check_resolver()
        if unusable is not None:
            found.append(checks.Error(unusable, id="jobs_engine.E003", obj="JOBS",
                                      hint="give the dotted path of a function of the request"))
    given = getattr(settings, "JOBS", {})
    found += [
        checks.Warning(f"JOBS[{name!r}] no longer applies: {why}", id="jobs_engine.W001",
                       obj="JOBS", hint="remove it; give register_target(policy=...) instead")
        for name, why in RETIRED.items() if name in given or f"JOBS_{name}" in os.environ]
    return found
