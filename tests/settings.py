"""Settings of the test suite: the demo project's with DEBUG off, as in production, with a
secret key of its own (the demo refuses to start with DEBUG off and no key) and no redirect
to HTTPS (the test client and the browser tests speak plain HTTP)."""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-secret-key-" + "x" * 40)
os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")

from config.settings import *  # noqa: F403

# A test database of this run's own: runs side by side on one PostgreSQL server (a developer's
# and CI's, or several checkouts) must not drop each other's test database.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405
    # SQLite beside PostgreSQL, for the tests that store the same rows in both and compare
    # them (tests/db/test_one_insert.py); its test database, in memory, is made only for a
    # run that collects such a test (``django_db(databases=[..., "sqlite"])``). Django's
    # SQLite backend, but for a check that would open a connection (tests/sqlite_beside).
    DATABASES["sqlite"] = {"ENGINE": "tests.sqlite_beside", "NAME": ":memory:"}  # noqa: F405

# Django's Tasks API on the engine (tests/db/test_tasks*.py, tests/process/test_tasks_processes.py):
# "once" runs at most once, "retried" tries three times, "kept" keeps only 2 results.
TASKS = {
    "default": {
        "BACKEND": "jobs_engine.tasks.JobsEngineBackend",
        "QUEUES": ["default", "emails", "once", "retried", "kept"],
        "OPTIONS": {
            "QUEUE_OPTIONS": {
                "once": {"DELIVERY_MODE": "at_most_once"},
                "retried": {"POLICY": "tests.task_functions.THREE_TRIES"},
                "kept": {"POLICY": "tests.task_functions.KEEP_TWO"},
            },
        },
    },
}
