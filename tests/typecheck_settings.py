"""Settings for mypy's django-stubs plugin only (``[tool.django-stubs]`` in pyproject.toml).

The plugin imports a settings module and sets Django up to learn the models, managers and
settings it types. This one holds only what that needs: the engine's apps (and the Django
apps they build on) and an in-memory database. It reads no environment variable and loads
neither the demo project nor ``tests.settings`` (which need a secret key and a database URL),
and it defines none of the engine's own settings (``JOBS``, ``TASKS``): a host project may
not set them, so the engine must read them with ``getattr``, and a direct
``settings.JOBS`` is reported.
"""

SECRET_KEY = "typecheck-only"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "jobs_engine",
    "jobs_engine.contrib.schedules",
    "jobs_engine.contrib.kafka",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
