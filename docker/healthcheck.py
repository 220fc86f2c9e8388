"""The container's health: the web role answers HTTP; a worker role's heartbeat row in
the database is fresh (a worker beats every PARTITION_HEARTBEAT_S). Exit 0 when healthy, and
for a worker also when the database cannot be reached.

Docker runs this beside the container's process, not under it: the role is read from
that process's command line (PID 1, which docker/entrypoint.sh replaced with the role's)."""

import http.client
import sys

with open("/proc/1/cmdline", "rb") as cmdline:
    command = cmdline.read().split(b"\0")
role = "web" if any(part.endswith(b"gunicorn") for part in command) else "worker"
if role == "web":
    # The login page answers 200, or a redirect to HTTPS (TLS ends at the proxy).
    web = http.client.HTTPConnection("127.0.0.1", 8000, timeout=4)
    try:
        web.request("GET", "/admin/login/", headers={"Host": "localhost"})
        sys.exit(0 if web.getresponse().status in (200, 301) else 1)
    except OSError:
        sys.exit(1)
import socket  # noqa: E402
from datetime import timedelta  # noqa: E402

import django  # noqa: E402

django.setup()
from jobs_engine.conf import jobs_settings  # noqa: E402
from jobs_engine.lanes.outage import is_database_fault  # noqa: E402
from jobs_engine.models import Worker  # noqa: E402
from jobs_engine.store import db_now  # noqa: E402

try:
    fresh_since = db_now() - timedelta(seconds=jobs_settings().PARTITION_LEASE_S)
    alive = Worker.objects.filter(hostname=socket.gethostname(), heartbeat_at__gte=fresh_since)
    sys.exit(0 if alive.exists() else 1)
except Exception as exc:
    # A database outage is not this worker's fault: it rides it out and beats again after,
    # so restarting it (and its running handlers) would only lose work.
    if not is_database_fault(exc):
        raise
    print(f"database unreachable, worker not judged: {exc}".splitlines()[0])
    sys.exit(0)
