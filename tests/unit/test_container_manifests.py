"""docker/compose.yaml and docker/k8s/ name only what exists, and are hardened.

The manifests are examples an operator copies, so nothing runs them here but
scripts/docker-test.sh (compose, with a real daemon). These tests parse them and check
that every role they start is one the image's entrypoint knows, every ``manage.py``
command that role runs exists, every environment variable they set is one the project
reads, every probe runs a file the image contains, and every worker's grace period covers
a drain. And that every pod and app container found in them (whatever its kind, so a new
workload cannot escape) runs as the image's user with no capabilities, no privilege gain,
the runtime's seccomp profile and a read-only root with a writable /tmp; that no image is
``latest``; and that compose publishes nothing beyond 127.0.0.1 by default.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands

import jobs_engine
from jobs_engine.conf import JobsSettings
from jobs_engine.contrib.kafka.settings import ENV_KEYS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
ENTRYPOINT = (DOCKER / "entrypoint.sh").read_text()
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
WORKER_ROLES = {"fast", "long", "schedules", "workers"}
# A drain: a worker on SIGTERM finishes the rows in hand (docs/operations.md#commands).
MIN_WORKER_GRACE_S = 120
VERSION = jobs_engine.__version__
IMAGE_UID = int(re.search(r"useradd .*--uid (\d+)", DOCKERFILE)[1])
# Where the image's processes write at run time: gunicorn's worker heartbeat files.
WRITABLE = {"/tmp"}


def manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted(K8S.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def pod_containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of every workload in docker/k8s/."""
    for doc in manifests():
        if doc["kind"] in {"Deployment", "Job"}:
            pod = doc["spec"]["template"]["spec"]
            for container in pod["containers"]:
                yield pod, container


def where(path: Path, doc: dict[str, Any]) -> str:
    return f"{path.name}:{doc['kind']}/{doc.get('metadata', {}).get('name', '')}"


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of every pod spec in docker/k8s/, of any kind (Deployment, Job,
    a CronJob's job template, a StatefulSet...): any mapping with ``containers``."""
    def walk(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, dict):
            if "containers" in node:
                yield where, node
            for value in node.values():
                yield from walk(value, where)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value, where)

    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield from walk(doc, where(path, doc))


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def app_services() -> list[str]:
    """The compose services that run the engine's image."""
    return [name for name, service in compose()["services"].items()
            if service.get("image", "").startswith("${APP_IMAGE")]


def with_defaults(text: str) -> str:
    """Compose's interpolation with an empty environment: ${VAR:-default} is the default."""
    return re.sub(r"\$\{[A-Z0-9_]+(?::?-([^}]*))?\}", lambda m: m[1] or "", text)


def image_tag(image: str) -> str | None:
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else None


def entrypoint_roles() -> dict[str, str]:
    """Each role of docker/entrypoint.sh and the shell text it runs."""
    block = ENTRYPOINT.split('case "$role" in')[-1]
    return {m[1]: m[2] for m in re.finditer(r"^\s{4}(\w+)\)\s+(.*?);;", block, re.M | re.S)}


def read_env_names() -> set[str]:
    """Environment variables the image's processes read."""
    settings_py = (ROOT / "config" / "settings.py").read_text()
    names = set(re.findall(r'(?:environ\.get|env_flag)\(\s*"([A-Z0-9_]+)"', settings_py))
    names |= set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", ENTRYPOINT))
    names |= {f"JOBS_{field.name}" for field in dataclasses.fields(JobsSettings)}
    names |= {f"JOBS_KAFKA_{key}" for key in ENV_KEYS}
    return names


def image_paths() -> set[str]:
    """Files the final stage copies from the repository, as paths in the image."""
    final = DOCKERFILE.split("\nFROM ")[-1]
    paths = set()
    for sources, dest in re.findall(r"^COPY (?!--from)(.+) (\S+)$", final, re.M):
        for source in sources.split():
            paths.add(dest.rstrip("/") + "/" + Path(source).name if dest.endswith("/")
                      else dest)
    return paths


def test_the_entrypoint_runs_manage_py_commands_that_exist() -> None:
    commands = get_commands()
    ran = {role: re.findall(r"manage\.py (\w+)", text) for role, text in
           entrypoint_roles().items()}
    assert set(ran) >= WORKER_ROLES | {"web", "migrate"}
    for role, names in ran.items():
        for name in names:
            assert name in commands, f"entrypoint role {role} runs unknown command {name}"


def test_every_role_started_is_one_the_entrypoint_knows() -> None:
    roles = set(entrypoint_roles())
    started = [container["args"][0] for _, container in pod_containers()]
    started += [service["command"][0] for name, service in compose()["services"].items()
                if service.get("image", "").startswith("${APP_IMAGE")]
    assert len(started) >= 10
    assert set(started) <= roles, set(started) - roles


def test_every_environment_variable_set_is_read() -> None:
    read = read_env_names()
    config_map = next(doc for doc in manifests() if doc["kind"] == "ConfigMap")
    set_here = set(config_map["data"])
    set_here |= {env["name"] for _, c in pod_containers() for env in c.get("env", [])}
    set_here |= set(compose()["x-app"]["environment"])
    # The secret docs/workers.md and kustomization.yaml tell operators to create.
    kustomization = (K8S / "kustomization.yaml").read_text()
    secret = set(re.findall(r"--from-literal=([A-Z_]+)=", kustomization))
    assert secret == {"DATABASE_URL", "DJANGO_SECRET_KEY", "JOBS_METRICS_TOKEN"}
    assert set_here | secret <= read, (set_here | secret) - read


def test_every_pod_reads_the_config_and_the_secret() -> None:
    for _, container in pod_containers():
        sources = {next(iter(ref)): ref[next(iter(ref))]["name"]
                   for ref in container["envFrom"]}
        assert sources == {"configMapRef": "jobs-engine", "secretRef": "jobs-engine"}


def test_probes_run_a_file_the_image_contains() -> None:
    in_image = image_paths()
    probes = [container[probe]["exec"]["command"] for _, container in pod_containers()
              for probe in ("livenessProbe", "readinessProbe") if probe in container]
    assert len(probes) >= 5
    for command in probes:
        assert command[0] == "python" and command[1] in in_image, command
    healthcheck = re.search(r'^HEALTHCHECK .*CMD \["python", "(\S+)"\]', DOCKERFILE,
                            re.M | re.S)
    assert healthcheck and healthcheck[1] in in_image


def test_every_worker_has_a_heartbeat_probe_and_a_grace_period_above_a_drain() -> None:
    workers = [(pod, c) for pod, c in pod_containers() if c["args"][0] in WORKER_ROLES]
    assert {c["args"][0] for _, c in workers} == {"fast", "long", "schedules"}
    for pod, container in workers:
        assert pod["terminationGracePeriodSeconds"] >= MIN_WORKER_GRACE_S, container["name"]
        assert "livenessProbe" in container and "resources" in container
    services = compose()["services"]
    for role in ("fast", "long", "schedules"):
        grace = services[role]["stop_grace_period"]
        assert int(grace.rstrip("s")) >= MIN_WORKER_GRACE_S


def test_pods_run_the_image_with_resource_requests() -> None:
    for _, container in pod_containers():
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}
        assert container["image"] == "jobs-engine-demo"


def test_every_workload_is_found() -> None:
    kinds = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
    workloads = [where(path, doc) for path in sorted(K8S.glob("*.yaml"))
                 for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] in kinds]
    assert [w for w, _ in pod_specs()] == workloads
    assert len(workloads) >= 5


@pytest.mark.parametrize("where,pod", list(pod_specs()), ids=[w for w, _ in pod_specs()])
def test_every_pod_is_hardened(where: str, pod: dict[str, Any]) -> None:
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": IMAGE_UID,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    empty_dirs = {volume["name"] for volume in pod.get("volumes", []) if "emptyDir" in volume}
    for container in pod["containers"] + pod.get("initContainers", []):
        assert container.get("securityContext") == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        }, container["name"]
        writable = {mount["mountPath"] for mount in container.get("volumeMounts", [])
                    if mount["name"] in empty_dirs and not mount.get("readOnly")}
        assert writable >= WRITABLE, container["name"]


def test_gunicorn_writes_only_where_the_containers_may() -> None:
    web = entrypoint_roles()["web"]
    assert re.search(r"--worker-tmp-dir (\S+)", web)[1] in WRITABLE
    # Its control socket would be made under $HOME (/app, read-only).
    assert "--no-control-socket" in web
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE.split("\nFROM ")[-1]


def test_the_k8s_image_tag_is_pinned_to_the_projects_version() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    pinned = {image["name"]: image["newTag"] for image in kustomization["images"]}
    for _, pod in pod_specs():
        for container in pod["containers"] + pod.get("initContainers", []):
            image = container["image"]
            tag = image_tag(image) or pinned.get(image)
            assert tag and tag != "latest", image
    assert pinned == {"jobs-engine-demo": VERSION}


def test_the_compose_images_are_pinned_the_apps_to_the_projects_version() -> None:
    for name, service in compose()["services"].items():
        tag = image_tag(with_defaults(service["image"]))
        assert tag and tag != "latest", name
    for name in app_services():
        assert with_defaults(compose()["services"][name]["image"]) == \
            f"jobs-engine-demo:{VERSION}", name


@pytest.mark.parametrize("service", app_services())
def test_compose_app_services_are_hardened(service: str) -> None:
    spec = compose()["services"][service]
    assert spec["read_only"] is True
    assert set(spec["tmpfs"]) >= WRITABLE
    assert spec["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in spec["security_opt"]
    assert "privileged" not in spec and "cap_add" not in spec


@pytest.mark.parametrize("service", list(compose()["services"]))
def test_compose_publishes_ports_on_127_0_0_1_by_default(service: str) -> None:
    for port in compose()["services"][service].get("ports", []):
        if isinstance(port, dict):
            host_ip = with_defaults(port.get("host_ip", ""))
        else:
            parts = with_defaults(str(port)).split(":")
            host_ip = parts[0] if len(parts) == 3 else ""
        assert host_ip == "127.0.0.1", (service, port)


def test_only_the_web_port_is_published_and_it_can_be_moved() -> None:
    published = {name: spec["ports"] for name, spec in compose()["services"].items()
                 if spec.get("ports")}
    assert published == {"web": ["${WEB_BIND:-127.0.0.1}:${WEB_PORT:-8000}:8000"]}


def test_the_database_password_is_one_variable_for_postgres_and_the_app() -> None:
    services = compose()["services"]
    password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert password.startswith("${POSTGRES_PASSWORD")
    url = compose()["x-app"]["environment"]["DATABASE_URL"]
    assert url == f"postgres://jobs:{password}@postgres:5432/jobs"
    for name in app_services():
        assert services[name]["environment"]["DATABASE_URL"] == url, name


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize("service", ["web", "fast", "long", "schedules", "migrate"])
def test_compose_app_services_wait_for_what_they_need(service: str) -> None:
    spec = compose()["services"][service]
    needs = spec["depends_on"]
    if service == "migrate":
        assert needs == {"postgres": {"condition": "service_healthy"}}
    else:
        assert needs == {"migrate": {"condition": "service_completed_successfully"}}
