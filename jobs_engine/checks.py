"""Django system checks: a misconfigured engine fails at start-up naming the setting, not
with a traceback at first use."""

from __future__ import annotations

from typing import Any

from django.core import checks

from jobs_engine.errors import InvalidSettings


@checks.register("jobs_engine")
def check_jobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from jobs_engine.conf import load_settings
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
    return found
