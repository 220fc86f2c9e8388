"""A new user's path, end to end: a fresh Django project gets the engine from its wheel.

Builds the wheel and sdist and checks what they hold; installs the wheel into a fresh
virtualenv; starts a project with ``django-admin startproject`` and adds the engine as the
README's "Add it to your Django project" says (its settings and URL code blocks are read from
README.md, and the Tasks API's settings from docs/tasks.md, so the docs and this test cannot
drift); then, first without extras and then with the README's extras: system checks,
migrations, every engine admin page, the API docs, the metrics, and a job enqueued in a
transaction delivered by a real ``run_workers``. Nothing may write into site-packages. The
wheel installs no top-level package but ``jobs_engine``, and the host has an app of its own
named ``schedules`` (a common name, so the engine's schedules app may not take it as its
package, label, table, templates or admin URL names). The host project runs on SQLite
(startproject's default); pip fetches Django, croniter and the extras from PyPI (its cache
makes a rerun quick).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from jobs_engine.testing import ProcessGroup, WaitTimeout, wait_until

REPO = Path(__file__).resolve().parents[2]
# The engine's apps: their folders in the repository and their labels.
APP_DIRS = ("jobs_engine", "jobs_engine/contrib/schedules", "jobs_engine/contrib/kafka")
APP_LABELS = ("jobs_engine", "jobs_engine_schedules", "jobs_engine_kafka")
TOP_LEVEL = {"jobs_engine"}  # every module of the wheel is below it
DATA_DIRS = ("templates", "static", "migrations")  # shipped as files next to the modules
NOT_IN_SDIST = ("config", "examples", "bench", "tests", "scripts")
# Not copied to the build tree (besides hidden folders such as .git and .venv, and any
# virtualenv): local state, and what an earlier build left behind.
BUILD_SKIP = {"var", "build", "dist", "test-artifacts"}
SECTION = "## Add it to your Django project"  # of README.md
TASKS_PAGE = "docs/tasks.md"  # Django's Tasks API: its TASKS setting
PASSWORD = "host-test-password"
METRICS_TOKEN = "host-test-metrics-token"
DELIVERED = {"order": 1, "status": "paid"}

# The host's own app named ``schedules`` (made by ``startapp``, these files written over its
# own): a model ``Schedule``, so its label, table, admin URL names and admin template folder are
# the ones the engine's schedules app would take under that name. It is first in
# INSTALLED_APPS, so its template would stand in for the engine's set-override form if the two
# shared a name.
HOST_MARK = "the host's own schedules template"
HOST_ROW = "host-schedule-row"
HOST_SCHEDULES_APP = {
    "schedules/models.py": """\
from django.db import models


class Schedule(models.Model):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name
""",
    "schedules/admin.py": """\
from django.contrib import admin

from schedules.models import Schedule

admin.site.register(Schedule)
""",
    "schedules/templates/admin/schedules/schedule/set_override.html": HOST_MARK + "\n",
}

# The host's business app: a fast-lane target that appends each payload to outbox.jsonl,
# and one schedule (so the engine's schedules admin has a row).
SHOP_APP = {
    "shop/__init__.py": "",
    "shop/apps.py": """\
from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"

    def ready(self) -> None:
        from shop import jobs

        jobs.register()
""",
    "shop/jobs.py": """\
import json
from pathlib import Path

from jobs_engine import Job, Lane, register_target
from jobs_engine.contrib.schedules import declare

MAIL_SEND = "shop:mail-send"
OUTBOX = Path(__file__).resolve().parent.parent / "outbox.jsonl"


def send_mail(job: Job) -> None:
    with OUTBOX.open("a") as out:
        out.write(json.dumps(job.payload) + "\\n")


def nightly_report(slot, job: Job) -> None:
    pass


def register() -> None:
    register_target(MAIL_SEND, send_mail, lane=Lane.FAST)
    declare("shop_nightly_report", "0 3 * * *", nightly_report)
""",
    # A task of Django's Tasks API, on a queue of the TASKS block of docs/tasks.md.
    "shop/tasks.py": """\
import json

from django.tasks import task

from shop.jobs import OUTBOX


@task(queue_name="emails", priority=10)
def send_welcome(user_id: int) -> str:
    with OUTBOX.open("a") as out:
        out.write(json.dumps({"welcome": user_id}) + "\\n")
    return "sent"
""",
}

# Run inside the host project: ``probe.py bare`` (no extras) or ``probe.py full``. Prints
# every failing URL or check, then exits 1 if there was one.
PROBE = f"""\
APP_LABELS = {APP_LABELS!r}
HOST_MARK = {HOST_MARK!r}
HOST_ROW = {HOST_ROW!r}
""" + """\
import os
import sys
import sysconfig
from pathlib import Path

import django

django.setup()

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.test.utils import setup_test_environment
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

import jobs_engine
import schedules

failures = []


def expect(client, url, status, text="", **headers):
    response = client.get(url, headers=headers)
    error = response.exc_info[1] if response.exc_info else None
    if response.status_code == status and text in response.content.decode(errors="replace"):
        print(f"ok   GET {url} {status}")
        return
    failures.append(f"FAIL GET {url}: {response.status_code}, expected {status}"
                    + (f" with {text!r}" if text else "")
                    + (f" ({type(error).__name__}: {error})" if error else ""))


def seed(user):
    # One row of each engine model, made by the engine's own functions.
    from jobs_engine import enqueue, flows, store
    from jobs_engine.conf import jobs_settings
    from jobs_engine.contrib.schedules.sync import sync_declared
    from jobs_engine.operators.actions import audit
    from schedules.models import Schedule as HostSchedule
    from shop.jobs import MAIL_SEND

    now = timezone.now()
    with transaction.atomic():
        job = enqueue(MAIL_SEND, {"seeded": "by the probe"}, dedupe_key="probe-seed")
    store.partitions_seed(jobs_settings().PARTITIONS)
    store.worker_beat("probe-worker", now, hostname="probe", pid=os.getpid(), lanes="fast")
    store.pause_set("probe:paused", now, 60, "paused by the probe")
    store.job_stats_add({store.StatBucket(now.replace(minute=0, second=0, microsecond=0),
                                          MAIL_SEND, "ok", ""): 3})
    store.job_stats_fold_shards()  # as a retention pass does
    audit(user, "probe", "job", job.job_id, ok=True, message="by the probe")
    sync_declared()
    HostSchedule.objects.get_or_create(name=HOST_ROW)
    with transaction.atomic():
        flows.chain("probe-flow", [flows.Step("probe.step", {"seeded": True})])


def admin_pages(client):
    for model in admin.site._registry:
        meta = model._meta
        if meta.app_label not in APP_LABELS:
            continue
        name = f"admin:{meta.app_label}_{meta.model_name}"
        expect(client, reverse(f"{name}_changelist"), 200)
        try:
            reverse(f"{name}_change", args=["1"])
        except NoReverseMatch:  # one page (the targets' registry, the runs' sums): no row
            continue
        row = model._default_manager.first()
        if row is None:
            failures.append(f"FAIL {name}: no row to open its change page")
        else:
            expect(client, reverse(f"{name}_change", args=[quote(row.pk)]), 200)


# The host's schedules app and the engine's side by side: each its own admin pages, and the
# engine's set-override form its own template.
def beside_the_hosts_schedules(client):
    from jobs_engine.contrib.schedules.models import Schedule

    expect(client, reverse("admin:schedules_schedule_changelist"), 200, HOST_ROW)
    changelist = reverse("admin:jobs_engine_schedules_schedule_changelist")
    expect(client, changelist, 200, "shop_nightly_report")
    row = Schedule.objects.get(code="shop_nightly_report")
    response = client.post(changelist, {"action": "set_override", "_selected_action": [row.pk]})
    page = response.content.decode(errors="replace")
    if response.status_code != 200 or 'id="set-override-form"' not in page or HOST_MARK in page:
        failures.append(f"FAIL POST {changelist} set_override: {response.status_code}, "
                        f"not the engine's form: {page[:200]!r}")


# The host's table and the engine's, each under its own app's label.
def tables():
    found = set(connection.introspection.table_names())
    for table in ("schedules_schedule", "jobs_engine_schedules_schedule"):
        if table not in found:
            failures.append(f"FAIL no table {table}")


setup_test_environment()  # allows the test client's host, "testserver"
if not jobs_engine.__file__.startswith(sysconfig.get_path("purelib")):
    failures.append(f"FAIL jobs_engine imported from {jobs_engine.__file__}, not the venv")
if not Path(schedules.__file__).resolve().is_relative_to(Path.cwd().resolve()):
    failures.append(f"FAIL schedules imported from {schedules.__file__}, not the host's app")
tables()
anonymous = Client(raise_request_exception=False)
if sys.argv[1] == "bare":
    expect(anonymous, "/jobs/api/v1/docs", 501, "pip install 'jobs-engine[api]'")
else:
    user = get_user_model().objects.get(username="admin")
    from shop.tasks import send_welcome

    with open("task-id.txt") as task_id:
        welcome = send_welcome.get_result(task_id.read())
    if (welcome.status, welcome.return_value, welcome.attempts) != ("SUCCESSFUL", "sent", 1):
        failures.append(f"FAIL the task's result: {welcome.status} {welcome.worker_ids}")
    seed(user)
    client = Client(raise_request_exception=False)
    if not client.login(username="admin", password=os.environ["DJANGO_SUPERUSER_PASSWORD"]):
        failures.append("FAIL the superuser cannot log in")
    admin_pages(client)
    beside_the_hosts_schedules(client)
    # Seeded 3, and the job and the task the worker delivered before this probe.
    expect(client, reverse("admin:jobs_engine_jobstat_changelist"), 200, 'data-total="5"')
    expect(client, "/jobs/api/v1/docs", 200)
    expect(client, "/jobs/api/v1/jobs", 200, '"total"')
    expect(anonymous, "/jobs/metrics", 401)
    expect(anonymous, "/jobs/metrics", 200, "jobs_backlog",
           Authorization=f"Bearer {os.environ['METRICS_TOKEN']}")
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""

# Through ``manage.py shell -c``: one job committed with its transaction, one rolled back,
# and a task of Django's Tasks API whose result id goes to task-id.txt.
ENQUEUE = f"""\
from pathlib import Path
from django.db import transaction
from jobs_engine import enqueue
from jobs_engine.models import Job
from shop.jobs import MAIL_SEND
from shop.tasks import send_welcome

with transaction.atomic():
    enqueue(MAIL_SEND, {DELIVERED!r}, key="1", dedupe_key="order-paid:1")
    Path("task-id.txt").write_text(send_welcome.enqueue(7).id)
try:
    with transaction.atomic():
        enqueue(MAIL_SEND, {{"order": 2}}, key="2", dedupe_key="order-paid:2")
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
assert not Job.objects.filter(dedupe_key="order-paid:2").exists(), "rolled back, yet enqueued"
"""


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> str:
    """Run ``cmd``; fail with its whole output unless it exits 0. Returns its stdout."""
    shown = " ".join(str(part) for part in cmd)
    try:
        done = subprocess.run([str(part) for part in cmd], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{shown}: no exit after {timeout} s\n{exc.stdout}\n{exc.stderr}"
                             ) from None
    if done.returncode != 0:
        raise AssertionError(f"{shown}: exit {done.returncode}\n--- stdout\n{done.stdout}"
                             f"\n--- stderr\n{done.stderr}")
    return done.stdout


def readme_section(title: str = SECTION) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n{title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def page(path: str) -> str:
    """A page of the documentation, e.g. ``docs/tasks.md``."""
    return (REPO / path).read_text()


def code_block(section: str, first_line: str) -> str:
    """The section's (or page's) one fenced block that starts with ``first_line``."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", section, re.M | re.S)
    found = [block for block in blocks if block.startswith(first_line + "\n")]
    title = next(line for line in section.splitlines() if line.strip())
    assert len(found) == 1, f"{title!r}: want one block starting {first_line!r}"
    return found[0]


def readme_extras(section: str) -> str:
    found = re.search(r'pip install "jobs-engine\[([\w,]+)\]"', section)
    assert found, f"README {SECTION!r}: no pip install \"jobs-engine[...]\" line"
    return found.group(1)


def build(out: Path) -> tuple[Path, Path]:
    """Wheel and sdist, built from a copy of the working tree: a build in place would leave
    build/ and an egg-info in the repository, and a stale build/lib leaks into the wheel."""
    source = out / "source"

    def skip(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        if Path(directory) == REPO:
            skipped |= {n for n in names if n in BUILD_SKIP or n.startswith(".")
                        or (REPO / n / "pyvenv.cfg").exists()}
        return skipped

    shutil.copytree(REPO, source, ignore=skip)
    run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir",
         out / "dist", source], cwd=out, timeout=300)
    (wheel,) = (out / "dist").glob("*.whl")
    (sdist,) = (out / "dist").glob("*.tar.gz")
    return wheel, sdist


def data_files() -> set[str]:
    """Every file under the apps' templates, static and migrations folders, the PEP 561
    marker, and the SQL file of PostgreSQL's functions."""
    found = {"jobs_engine/py.typed", "jobs_engine/store/sql/enqueue.sql",
             "jobs_engine/templates/admin/jobs_engine/input_filter.html",
             "jobs_engine/contrib/schedules/migrations/0001_initial.py",
             "jobs_engine/contrib/schedules/templates/admin/jobs_engine_schedules/schedule/"
             "set_override.html"}
    for app in APP_DIRS:
        for folder in DATA_DIRS:
            found |= {path.relative_to(REPO).as_posix()
                      for path in (REPO / app / folder).rglob("*")
                      if path.is_file() and "__pycache__" not in path.parts}
    return found


def check_wheel(wheel: Path) -> None:
    """The wheel's file list: one top-level package, ``jobs_engine`` (and so says its
    top_level.txt), with every data file of its apps."""
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert len(dist_info) == 1 and tops - dist_info == TOP_LEVEL, \
        f"{wheel.name}: top-level entries {sorted(tops)}"
    (info,) = dist_info
    if f"{info}/top_level.txt" in names:
        declared = set(archive.read(f"{info}/top_level.txt").decode().split())
        assert declared == TOP_LEVEL, f"{wheel.name}: top_level.txt names {sorted(declared)}"
    missing = data_files() - set(names)
    assert not missing, f"{wheel.name} lacks {sorted(missing)}"


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    extra = sorted(name for name in names if name.split("/")[0] in NOT_IN_SDIST)
    assert not extra, f"{sdist.name} holds {extra[:20]}"
    missing = data_files() - names
    assert not missing, f"{sdist.name} lacks {sorted(missing)}"


def make_venv(path: Path) -> tuple[Path, Path]:
    """A fresh virtualenv: its python and its site-packages."""
    run([sys.executable, "-m", "venv", path], cwd=path.parent)
    python = path / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
               cwd=path.parent).strip()
    return python, Path(site)


def pip_install(python: Path, requirement: str, cwd: Path) -> None:
    run([python, "-m", "pip", "install", "--disable-pip-version-check", requirement], cwd=cwd,
        timeout=600)


def snapshot(site: Path) -> dict[str, tuple[int, int]]:
    """Every file of site-packages with its mtime and size."""
    return {str(path.relative_to(site)): (path.stat().st_mtime_ns, path.stat().st_size)
            for path in site.rglob("*") if path.is_file()}


def assert_untouched(site: Path, before: dict[str, tuple[int, int]], when: str) -> None:
    """The engine and its host write nothing into the installed packages (pip compiled the
    .pyc files at install, so importing writes none)."""
    after = snapshot(site)
    changed = sorted(name for name in before.keys() | after.keys()
                     if before.get(name) != after.get(name))
    assert not changed, f"site-packages changed {when}: {changed[:20]}"


def host_env() -> dict[str, str]:
    """The outer environment without what points at this repository or its test settings."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("JOBS_") and name not in {
               "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
               "DATABASE_URL"}}
    return {**env, "DJANGO_SETTINGS_MODULE": "hostsite.settings", "PYTHONUNBUFFERED": "1",
            "DJANGO_SUPERUSER_PASSWORD": PASSWORD, "METRICS_TOKEN": METRICS_TOKEN}


def start_project(python: Path, project: Path, section: str, env: dict[str, str]) -> None:
    """``startproject``, the README's URLs, the host's ``schedules`` app (``startapp``), the
    shop app and the probe script."""
    project.mkdir()
    run([python, "-m", "django", "startproject", "hostsite", project], cwd=project.parent,
        env=env)  # not the outer settings module (nor PYTHONPATH), which it would try to load
    (project / "hostsite" / "urls.py").write_text(code_block(section, "# urls.py"))
    manage(python, project, env, "startapp", "schedules")
    for name, text in {**HOST_SCHEDULES_APP, **SHOP_APP, "probe.py": PROBE}.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    settings = project / "hostsite" / "settings.py"
    settings.with_suffix(".startproject").write_text(settings.read_text())


def write_settings(project: Path, section: str, *, api: bool) -> None:
    """startproject's settings, then the README's block (its ``"ninja"`` line only with the
    api extra installed), then the host's ``schedules`` app (first) and the shop app; with the
    extras, the ``# settings.py`` block of docs/tasks.md (Django's Tasks API) too."""
    block = code_block(section, "# settings.py")
    if not api:
        block = "\n".join(line for line in block.splitlines() if '"ninja"' not in line)
    else:
        block += "\n" + code_block(page(TASKS_PAGE), "# settings.py")
    settings = project / "hostsite" / "settings.py"
    base = settings.with_suffix(".startproject").read_text()
    apps = 'INSTALLED_APPS = ["schedules", *INSTALLED_APPS, "shop"]'
    settings.write_text(f"{base}\n{block}\n{apps}\n")


def manage(python: Path, project: Path, env: dict[str, str], *args: str) -> str:
    return run([python, "manage.py", *args], cwd=project, env=env)


def delivered(outbox: Path) -> list[object]:
    if not outbox.exists():
        return []
    return [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]


def deliver_with_worker(python: Path, project: Path, env: dict[str, str]) -> None:
    """A job enqueued in a committed transaction reaches the handler through a real
    ``run_workers``, which then exits 0 on SIGTERM. The worker is started the way a host
    project's own tests would start it: ``jobs_engine.testing`` with the host's interpreter
    and ``manage.py``."""
    workers = ProcessGroup(project / "manage.py", project / "worker-output", env, python=python)
    try:
        worker = workers.start("run_workers")
        worker.worker_id(timeout=30)
        manage(python, project, env, "shell", "-c", ENQUEUE)

        def sent() -> bool:
            assert worker.alive(), f"run_workers exited:\n{worker.dump()}"
            outbox = delivered(project / "outbox.jsonl")
            return DELIVERED in outbox and {"welcome": 7} in outbox

        try:
            wait_until(sent, 30, f"{DELIVERED} to be delivered", interval=0.2)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}:\n{worker.dump()}") from None
        worker.send(signal.SIGTERM)
        try:
            code = worker.wait_exit(10)
        except subprocess.TimeoutExpired:
            raise AssertionError("run_workers still running 10 s after SIGTERM:\n"
                                 f"{worker.dump()}") from None
        assert code == 0, f"run_workers exited {code} on SIGTERM:\n{worker.dump()}"
    finally:
        workers.kill_all()
    assert {"order": 2} not in delivered(project / "outbox.jsonl")


def test_host_project(tmp_path: Path) -> None:
    started = time.monotonic()
    section = readme_section()
    for command in ("python manage.py migrate", "python manage.py run_workers"):
        assert command in section, f"README {SECTION!r} lost {command!r}"

    wheel, sdist = build(tmp_path)
    check_wheel(wheel)
    check_sdist(sdist)

    python, site = make_venv(tmp_path / "venv")
    pip_install(python, str(wheel), cwd=tmp_path)
    installed = snapshot(site)
    project, env = tmp_path / "host", host_env()
    start_project(python, project, section, env)
    write_settings(project, section, api=False)
    manage(python, project, env, "check", "--fail-level", "WARNING")
    manage(python, project, env, "makemigrations", "schedules")  # the host's own app
    manage(python, project, env, "makemigrations", "--check", "--dry-run")
    manage(python, project, env, "migrate")
    manage(python, project, env, "createsuperuser", "--noinput", "--username", "admin",
           "--email", "admin@example.com")
    print(run([python, "probe.py", "bare"], cwd=project, env=env))
    assert_untouched(site, installed, "without extras")

    pip_install(python, f"{wheel}[{readme_extras(section)}]", cwd=tmp_path)
    installed = snapshot(site)
    write_settings(project, section, api=True)
    manage(python, project, env, "check", "--fail-level", "WARNING")
    deliver_with_worker(python, project, env)  # its job is kept DONE for the probe's pages
    print(run([python, "probe.py", "full"], cwd=project, env=env))
    assert_untouched(site, installed, "with the extras")
    print(f"host project test: {time.monotonic() - started:.1f} s")
