"""The demo project is safe by default (docs/operations.md#deploying-the-demo-safely).

Each test starts a real process with the demo's settings (``config.settings``) and only the
environment a deployment would set, so what is checked is what an operator gets.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SECRET_KEY = "prod-" + secrets.token_urlsafe(48)
METRICS_TOKEN = "metrics-" + secrets.token_urlsafe(16)
DB_PASSWORD = "db-" + secrets.token_urlsafe(12)
# What docs/settings.md's "Deploying the demo" tells an operator to set.
PRODUCTION = {
    "DJANGO_SECRET_KEY": SECRET_KEY,
    "DJANGO_ALLOWED_HOSTS": "jobs.example.com",
    "DJANGO_HSTS_SECONDS": "31536000",
    "DJANGO_HSTS_INCLUDE_SUBDOMAINS": "1",
    "DJANGO_HSTS_PRELOAD": "1",
    "JOBS_METRICS_TOKEN": METRICS_TOKEN,
}
SECRETS = (SECRET_KEY, METRICS_TOKEN, DB_PASSWORD)


def demo_env(**extra: str) -> dict[str, str]:
    """The caller's environment without any Django, database or engine variable."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "JOBS_", "DATABASE_URL"))}
    return {**keep, "DJANGO_SETTINGS_MODULE": "config.settings", **extra}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("key", [None, "dev-only-not-secret-change-me"],
                         ids=["no-key", "development-key"])
def test_debug_off_without_a_real_secret_key_refuses_to_start(key: str | None) -> None:
    env = demo_env(**({"DJANGO_SECRET_KEY": key} if key else {}))

    done = manage("check", env=env)

    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_debug_is_off_unless_asked() -> None:
    script = "from django.conf import settings; print(settings.DEBUG)"
    asked = manage("shell", "-c", script, env=demo_env(DJANGO_DEBUG="1"))
    default = manage("shell", "-c", script, env=demo_env(DJANGO_SECRET_KEY=SECRET_KEY))
    assert asked.stdout.split()[-1:] == ["True"], asked.stderr
    assert default.stdout.split()[-1:] == ["False"], default.stderr


def test_check_deploy_reports_nothing_with_the_production_variables() -> None:
    done = manage("check", "--deploy", "--fail-level", "WARNING", env=demo_env(**PRODUCTION))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


# -- every route, with the database down ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SERVE = """
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

from config.wsgi import application

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

server = make_server("127.0.0.1", int(sys.argv[1]), application, handler_class=Quiet)
print("serving", flush=True)
server.serve_forever()
"""


@pytest.fixture
def server_without_database(tmp_path: Path) -> Iterator[str]:
    """The demo's WSGI application with production settings behind a TLS proxy, its
    database a PostgreSQL URL (with a password) where nothing listens."""
    port = free_port()
    env = demo_env(**PRODUCTION, DJANGO_TLS_PROXY="1",
                   DATABASE_URL=f"postgres://jobs:{DB_PASSWORD}@127.0.0.1:{free_port()}/jobs")
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while b"serving" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every admin page of every registered model, every API operation
    (from its OpenAPI schema) and the other URLs of the demo, with sample ids."""
    from django.contrib import admin

    from jobs_engine.operators.api import api

    routes = [("GET", "/admin/"), ("GET", "/admin/login/"), ("POST", "/admin/login/"),
              ("GET", "/jobs/metrics"), ("GET", "/nothing-here"), ("GET", "/jobs/api/v1/x")]
    for model in admin.site._registry:
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        routes += [("GET", f"/admin/{model._meta.app_label}/"), ("GET", base),
                   ("GET", f"{base}add/"), ("GET", f"{base}1/change/"),
                   ("GET", f"{base}1/history/"), ("GET", f"{base}1/delete/"),
                   ("POST", base)]
    routes += [("POST", "/admin/jobs_engine/job/1/retry/")]
    for path, operations in api.get_openapi_schema()["paths"].items():
        concrete = path.replace("{job_id}", "1").replace("{code}", "nightly")
        routes += [(method.upper(), concrete) for method in operations]
    routes += [("GET", "/jobs/api/v1/docs"), ("GET", "/jobs/api/v1/openapi.json")]
    return routes


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the redirect itself is the answer under test


_opener = urllib.request.build_opener(NoRedirect)


def fetch(url: str, method: str, headers: dict[str, str]) -> tuple[int, str]:
    data = b"{}" if method in {"POST", "PUT"} else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Host": "jobs.example.com", "X-Forwarded-Proto": "https",
        "Content-Type": "application/json", **headers})
    try:
        with _opener.open(request, timeout=30) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_no_route_shows_a_setting_when_the_database_is_down(server_without_database: str
                                                             ) -> None:
    """Anonymous callers, with and without a session cookie (loading a session needs the
    database), and a scraper with the metrics token: whatever fails, no answer shows a
    secret, a traceback or Django's debug page."""
    callers = {"anonymous": {}, "with a session cookie": {"Cookie": "sessionid=" + "a" * 32},
               "metrics scraper": {"Authorization": f"Bearer {METRICS_TOKEN}"}}
    seen: dict[int, int] = {}
    leaks = []
    for method, path in every_route():
        for who, headers in callers.items():
            status, body = fetch(server_without_database + path, method, headers)
            seen[status] = seen.get(status, 0) + 1
            for marker in (*SECRETS, "DATABASE_URL", "Traceback", "DEBUG = True",
                           "OperationalError", "127.0.0.1:"):
                if marker in body:
                    leaks.append(f"{method} {path} ({who}) -> {status} shows {marker[:12]!r}")
    assert not leaks, "\n".join(leaks)
    assert seen.get(500, 0) > 10, f"the database failure was not reached: {seen}"
    assert set(seen) <= {200, 301, 302, 400, 401, 403, 404, 405, 500}, seen
