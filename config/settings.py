"""Settings of the jobs-engine project.

``DATABASE_URL`` picks the database (``postgres://user:pass@host:port/name`` or
``sqlite:///path``); without it the embedded default is a SQLite file under ``var/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-not-secret-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")


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
    raise ValueError(f"DATABASE_URL: unsupported scheme {parsed.scheme!r}")


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
    "schedules",
    "kafka_target",
    "examples",
]

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
        "DIRS": [BASE_DIR / "templates"],
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

# The demo's order events (examples.orders) go to kafka:<DEMO_ORDERS_TOPIC>.
DEMO_ORDERS_TOPIC = os.environ.get("DEMO_ORDERS_TOPIC", "demo.orders")

# Every tuning number of the engine; each may be overridden by env JOBS_<NAME>.
JOBS: dict = {
    # Kafka targets (kafka_target): one kafka:<topic> fast-lane target per EXTRA_TOPICS entry.
    # With no broker running, the targets pause (TargetUnreachable) and their rows wait.
    # JOBS_KAFKA_BOOTSTRAP_SERVERS / _ENABLED / _EXTRA_TOPICS override these per process.
    "KAFKA": {
        "BOOTSTRAP_SERVERS": os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        "ENABLED": os.environ.get("KAFKA_ENABLED", "on"),
        "EXTRA_TOPICS": [f"{DEMO_ORDERS_TOPIC}:at_least_once"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "jobs_engine": {"handlers": ["console"], "level": os.environ.get("JOBS_LOG_LEVEL", "INFO")},
        # kafka_target.librdkafka: the Kafka client's own log lines (repeats rate-limited).
        "kafka_target": {"handlers": ["console"],
                         "level": os.environ.get("JOBS_LOG_LEVEL", "INFO")},
        "examples": {"handlers": ["console"], "level": "INFO"},
    },
}
