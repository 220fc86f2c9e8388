"""Settings of the demo project, safe by default.

Read from the environment:

- ``DJANGO_DEBUG`` — off unless set to ``1`` (``scripts/run.sh`` sets it for a local run);
- ``DJANGO_SECRET_KEY`` — required with ``DEBUG`` off: the process refuses to start without
  one, or with the published development key;
- ``DJANGO_ALLOWED_HOSTS`` — comma-separated (default ``127.0.0.1,localhost``);
- ``DATABASE_URL`` — ``postgres://user:pass@host:port/name`` or ``sqlite:///path``; without
  it the embedded default is a SQLite file under ``var/``;
- with ``DEBUG`` off, HTTPS settings: ``DJANGO_SECURE_SSL_REDIRECT`` (default on),
  ``DJANGO_HSTS_SECONDS`` (default 0), ``DJANGO_HSTS_INCLUDE_SUBDOMAINS`` and
  ``DJANGO_HSTS_PRELOAD`` (default off), ``DJANGO_TLS_PROXY`` (trust
  ``X-Forwarded-Proto: https`` from a TLS-terminating proxy; default off).

``docs/operations.md#deploying-the-demo-safely`` lists the values with which
``manage.py check --deploy`` reports nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

from jobs_engine import DEFAULT_POLICY

BASE_DIR = Path(__file__).resolve().parent.parent

# Published in this repository: fine for a laptop, refused with DEBUG off.
DEVELOPMENT_SECRET_KEY = "dev-only-not-secret-change-me"


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() in {"1", "true", "on", "yes"}:
        return True
    if raw.strip().lower() in {"0", "false", "off", "no"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected 1 or 0")


DEBUG = env_flag("DJANGO_DEBUG", False)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "") or (DEVELOPMENT_SECRET_KEY if DEBUG else "")
if not DEBUG and SECRET_KEY in {"", DEVELOPMENT_SECRET_KEY}:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set (or is the published development key) and DEBUG is "
        "off: set DJANGO_SECRET_KEY to a long random value, or set DJANGO_DEBUG=1 for a "
        "local run (scripts/run.sh does)")
ALLOWED_HOSTS = [host.strip() for host in
                 os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")
                 if host.strip()]

if not DEBUG:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_flag("DJANGO_SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS") or 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_flag("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = env_flag("DJANGO_HSTS_PRELOAD", False)
    if env_flag("DJANGO_TLS_PROXY", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Error reports (the debug page, mails to ADMINS) hide settings and environment values
# whose names say they hold a secret; DATABASE_URL carries the database password.
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.reporting.SecretsHiddenFilter"


def database_from_url(url: str | None) -> dict:
    if not url:
        path = BASE_DIR / "var" / "jobs_engine.sqlite3"
        path.parent.mkdir(exist_ok=True)
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path),
                "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20,
                            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}}
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parsed.path or ":memory:",
                "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}
    if parsed.scheme in {"postgres", "postgresql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parsed.path.lstrip("/"),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            # Workers keep their connection: reconnecting per poll is the slow path.
            "CONN_MAX_AGE": None,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(f"DATABASE_URL: unsupported scheme {parsed.scheme!r}")


DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # serves the API docs' assets locally (no CDN)
    "jobs_engine",
    "jobs_engine.contrib.schedules",
    "jobs_engine.contrib.kafka",
    "examples",
]

# Django's Tasks API, delivered by the engine: every queue runs on the long lane
# (run_workers, run_long_lane). See docs/tasks.md.
TASKS = {
    "default": {
        "BACKEND": "jobs_engine.tasks.JobsEngineBackend",
        "QUEUES": ["default"],
    },
}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "jobs_engine.context.RequestContextMiddleware",
]

ROOT_URLCONF = "config.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "config.wsgi.application"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT") or BASE_DIR / "var" / "static"

# The demo's order events (examples.orders) go to kafka:<DEMO_ORDERS_TOPIC>.
DEMO_ORDERS_TOPIC = os.environ.get("DEMO_ORDERS_TOPIC", "demo.orders")

# Every tuning number of the engine; each may be overridden by env JOBS_<NAME>.
JOBS: dict = {
    # Kafka targets (the jobs_engine.contrib.kafka app): one kafka:<topic> fast-lane target
    # per EXTRA_TOPICS entry.
    # With no broker running, the targets pause (TargetUnreachable) and their rows wait.
    # JOBS_KAFKA_BOOTSTRAP_SERVERS / _ENABLED / _EXTRA_TOPICS override these per process.
    "KAFKA": {
        "BOOTSTRAP_SERVERS": os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        "ENABLED": os.environ.get("KAFKA_ENABLED", "on"),
        "EXTRA_TOPICS": [f"{DEMO_ORDERS_TOPIC}:at_least_once"],
        # Order events: a send that failed is retried (1 s, then 2 s), the last 100 sent
        # are kept for the admin. A topic whose events are not worth keeping once sent
        # would set JobPolicy(keep_completed=0).
        "POLICIES": {DEMO_ORDERS_TOPIC: DEFAULT_POLICY},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        # Also jobs_engine.schedules and jobs_engine.kafka, with jobs_engine.kafka.librdkafka:
        # the Kafka client's own log lines (repeats rate-limited).
        "jobs_engine": {"handlers": ["console"], "level": os.environ.get("JOBS_LOG_LEVEL", "INFO")},
        "examples": {"handlers": ["console"], "level": "INFO"},
    },
}
