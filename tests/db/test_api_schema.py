"""Schemathesis against the API's own OpenAPI schema, in-process through Django's WSGI
application, logged in as an engine manager: generated valid (positive) and invalid
(negative) requests to every route (jobs, schedules, flows, limits), and schemathesis's
coverage cases (boundary values, missing, unknown and malformed parameters and bodies) in
both modes.

No request gets a 5xx, no invalid request is accepted (schemathesis's
``negative_data_rejection`` check: a request it made invalid must get 400, 404, 405 or
413; a 2xx, or a 409 that means it reached the operation, fails) and every error is in the
API's one error shape. Half the cases name real rows (a generated id or code names none),
some with a real id spelt as a near miss (``042``, ``+42``, ``42.0``): always 404, never
acted on. The settings are schemathesis 4's ``schema.config`` (what a
``schemathesis.toml`` would say); examples are capped so the file runs in about 10 s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.schemas import BaseSchema

from jobs_engine import flows
from jobs_engine.limits import PER_TENANT, Concurrency, Rate
from jobs_engine.models import Flow, FlowStep
from jobs_engine.operators.api import api
from jobs_engine.states import FlowState, JobStatus, StepState
from tests.db.operator_helpers import make_job, manager
from tests.db.schedule_helpers import declared_schedule

pytestmark = pytest.mark.django_db

MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
EXAMPLES_PER_OPERATION = 20  # fuzzed cases per operation and generation mode: ~4 s a mode
# What an invalid request may get: refused (400), naming no row (404: a malformed id), or a
# method the route lacks (405). Never a 2xx, nor a 409: that would mean it was acted on.
REJECTED = ["400", "404", "405", "413"]
BODY_FIELDS = {"PUT /jobs/api/v1/schedules/{code}/cron_override": {"cron_override"},
               "POST /jobs/api/v1/job-flows/definitions/{name}/start": {"input"},
               "PUT /jobs/api/v1/limits/{target}/{name}": {"slots", "starts", "period_s",
                                                           "burst"},
               "PUT /jobs/api/v1/tenant-weights/{tenant_id}": {"weight"}}
UNKNOWN_FIELD = "unknown field"  # a JSON body with a field its route does not declare
EVERY_OPERATION = {"GET /jobs/api/v1/jobs", "GET /jobs/api/v1/jobs/{job_id}",
                   "POST /jobs/api/v1/jobs/{job_id}/retry",
                   "POST /jobs/api/v1/jobs/{job_id}/skip",
                   "POST /jobs/api/v1/jobs/{job_id}/cancel",
                   "GET /jobs/api/v1/schedules",
                   "POST /jobs/api/v1/schedules/{code}/enable",
                   "POST /jobs/api/v1/schedules/{code}/disable",
                   "POST /jobs/api/v1/schedules/{code}/run",
                   "PUT /jobs/api/v1/schedules/{code}/cron_override",
                   "DELETE /jobs/api/v1/schedules/{code}/cron_override",
                   "GET /jobs/api/v1/job-flows", "GET /jobs/api/v1/job-flows/definitions",
                   "GET /jobs/api/v1/job-flows/{flow_id}",
                   "POST /jobs/api/v1/job-flows/definitions/{name}/start",
                   "POST /jobs/api/v1/job-flows/{flow_id}/retry",
                   "POST /jobs/api/v1/job-flows/{flow_id}/cancel",
                   "GET /jobs/api/v1/limits", "PUT /jobs/api/v1/limits/{target}/{name}",
                   "DELETE /jobs/api/v1/limits/{target}/{name}",
                   "GET /jobs/api/v1/tenant-weights",
                   "PUT /jobs/api/v1/tenant-weights/{tenant_id}",
                   "POST /jobs/api/v1/targets/{name}/pause",
                   "POST /jobs/api/v1/targets/{name}/resume"}
# Operations that take no parameter at all: there is no invalid request of them to make.
NO_PARAMETERS = {"GET /jobs/api/v1/schedules", "GET /jobs/api/v1/job-flows/definitions",
                 "GET /jobs/api/v1/tenant-weights"}
DEFINED_FLOW = "schema-flow"
LIMITED = "schema.lim"  # limits "concurrency" and "rate/tenant" (its name holds a slash)


@dataclass(frozen=True)
class Session:
    app: Any
    cookies: dict[str, str]
    headers: dict[str, str]


@pytest.fixture
def session() -> Iterator[Session]:
    """Django's WSGI application, called in this thread on the test's connection, and a
    manager's session cookie with its CSRF token, as a browser sends them."""
    client = Client()
    client.force_login(manager(flows=True))
    client.get("/jobs/api/v1/docs")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    cookies = {"sessionid": client.cookies["sessionid"].value, "csrftoken": token}
    # Like Django's test client: a request must not close the connection at its end (it
    # holds the test's transaction).
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield Session(get_wsgi_application(), cookies, {"X-CSRFToken": token})
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@dataclass(frozen=True)
class Real:
    code: str  # a declared schedule
    job_ids: list[int]  # DEAD, DEAD, PENDING, RUNNING and started (no action removes it)
    flow_ids: list[int]  # RUNNING, FAILED


@pytest.fixture
def real(targets: Any) -> Iterator[Real]:
    """Rows for the generated requests to find: generated ids and codes name none."""
    targets("schema.target")
    targets("schema.long", lane="long")
    targets(LIMITED, lane="long", limits=[Concurrency(2), Rate(5, period_s=60, per=PER_TENANT)])
    jobs = [make_job("schema.target", status=status, key="k")
            for status in (JobStatus.DEAD, JobStatus.DEAD, JobStatus.PENDING)]
    jobs.append(make_job("schema.long", status=JobStatus.RUNNING, started_at=timezone.now()))
    running = flows.chain("schema-running", [flows.Step("a")])
    failed = flows.chain("schema-failed", [flows.Step("a")])
    FlowStep.objects.filter(flow_id=failed).update(state=StepState.FAILED)
    Flow.objects.filter(id=failed).update(state=FlowState.FAILED)
    flows.define(DEFINED_FLOW, lambda value: flows.ChainSpec([flows.Step("a", value)]), "")
    with declared_schedule("schema_sched") as schedule:
        yield Real(schedule.code, [job.id for job in jobs], [running, failed])
    flows._definitions.pop(DEFINED_FLOW, None)


def api_schema(session: Session) -> BaseSchema:
    # The schema the documentation serves (to staff only: JOBS API_DOCS), called through
    # the WSGI application.
    schema = schemathesis.openapi.from_dict(api.get_openapi_schema())
    schema.app = session.app
    config = schema.config
    config.generation.update(
        modes=MODES, max_examples=EXAMPLES_PER_OPERATION, allow_x00=True,
        # The session cookie is fixed: generated session ids would only meet 401, and a
        # "negative" case whose only invalid part is that cookie is not negative once sent.
        with_security_parameters=False)
    config.checks.update(included_check_names=["not_a_server_error",
                                               "negative_data_rejection"])
    config.checks.negative_data_rejection.expected_statuses = REJECTED
    return schema


# How a real id is put in a path: itself, or a near miss that int() or pydantic would read
# as that id; a near miss names no row (404), so it must never act on the real one.
SPELLINGS = ["{}", "{}", "{}", "0{}", "+{}", "{}.0", " {}", "{}e0", "{}_0"]
NEAR_MISS = "near miss"


def as_sent(case: Any) -> None:
    """Put the case's query in the form the request carries, so schemathesis judges the
    request that is sent (it revalidates a changed case): an object would go out as its
    keys (``{"a": 1}`` as ``?key=a``, a valid text), so it is sent as its JSON text; an
    empty list is no parameter at all, a one-item list that item. A longer list stays: it
    is the parameter given several times, which the API refuses."""
    def one(value: Any) -> Any:
        return json.dumps(value) if isinstance(value, dict | list) else value

    query = {}
    for name, value in (case.query or {}).items():
        if not isinstance(value, list):
            query[name] = one(value)
        elif len(value) == 1:
            query[name] = one(value[0])
        elif value:
            query[name] = [one(item) for item in value]
    if query != (case.query or {}):
        case.query = query


def check(case: Any, session: Session, real: Real, pick: int, spelling: str,
          seen: dict[str, set[int]]) -> None:
    """Send one case as the manager, then the configured checks and the error shape. Half
    the cases name a real row (``pick``): a generated id or code names none; a real id
    goes in as ``spelling``."""
    params = case.path_parameters or {}
    label = f"{case.method} {case.operation.path}"
    near_miss = False
    if pick % 2 and "code" in params:
        params["code"] = real.code
    path = case.operation.path
    if pick % 2 and "name" in params:  # a defined flow, a limit, or a target
        params["name"] = ((("concurrency", "rate/tenant")[pick // 2 % 2])
                          if path.startswith("/jobs/api/v1/limits/")
                          else LIMITED if path.startswith("/jobs/api/v1/targets/")
                          else DEFINED_FLOW)
    if pick % 2 and "target" in params:
        params["target"] = LIMITED
    # A read names the row no action removes: an earlier case may have skipped the others.
    job_ids = real.job_ids[-1:] if case.method == "GET" else real.job_ids
    for param, ids in (("job_id", job_ids), ("flow_id", real.flow_ids)):
        if pick % 2 and param in params:
            row_id = ids[pick // 2 % len(ids)]
            near_miss = spelling != "{}" and label in EVERY_OPERATION  # not a method it lacks
            params[param] = spelling.format(row_id) if spelling != "{}" else row_id
    as_sent(case)
    response = case.call(cookies=session.cookies, headers=session.headers)
    seen.setdefault(label, set()).add(response.status_code)
    body = getattr(case, "body", None)
    if label in EVERY_OPERATION and isinstance(body, dict) \
            and set(body) - BODY_FIELDS.get(label, set()):
        seen.setdefault(UNKNOWN_FIELD, set()).add(response.status_code)
    if near_miss:
        seen.setdefault(NEAR_MISS, set()).add(response.status_code)
    detail = (label, params, case.query, body, response.status_code, response.text[:300])
    assert response.status_code < 500, detail
    assert not near_miss or response.status_code == 404, detail
    case.validate_response(response)  # not_a_server_error, negative_data_rejection
    if response.status_code >= 400 and response.status_code != 405:
        error = response.json()
        assert error["status_code"] == response.status_code, detail
        assert isinstance(error["code"], str) and isinstance(error["message"], list), detail


@pytest.mark.parametrize("mode", MODES)
def test_generated_requests(mode: GenerationMode, session: Session, real: Real) -> None:
    schema = api_schema(session)
    seen: dict[str, set[int]] = {}
    # Each operation gets its share of the examples: one strategy over all of them left
    # an operation without a negative case now and then (the schema's enums change with
    # the targets other tests register).
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.label in NO_PARAMETERS:
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(generation_mode=mode, cookies=session.cookies,
                                          headers=session.headers),
               pick=st.integers(0, 1000), spelling=st.sampled_from(SPELLINGS))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None,
                  database=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def call(case: Any, pick: int, spelling: str) -> None:
            check(case, session, real, pick, spelling, seen)

        call()

    operations = set(seen) - {UNKNOWN_FIELD, NEAR_MISS}
    if mode is GenerationMode.POSITIVE:
        assert operations == EVERY_OPERATION, seen
    else:
        assert operations == EVERY_OPERATION - NO_PARAMETERS, seen
    every = set().union(*seen.values())
    assert not every & {401, 403}, seen  # the manager's session and CSRF token were used
    if mode is GenerationMode.POSITIVE:
        assert 200 in seen["GET /jobs/api/v1/jobs"], seen
        assert 200 in seen["GET /jobs/api/v1/schedules"], seen
        assert 200 in seen["POST /jobs/api/v1/schedules/{code}/disable"], seen  # the real code
        assert 200 in seen["GET /jobs/api/v1/jobs/{job_id}"], seen  # a real id
        assert 200 in seen["GET /jobs/api/v1/limits"], seen
        assert 200 in seen["POST /jobs/api/v1/targets/{name}/pause"], seen  # a real target
        assert 200 in seen["PUT /jobs/api/v1/limits/{target}/{name}"], seen  # a real limit
        assert 200 in seen["PUT /jobs/api/v1/tenant-weights/{tenant_id}"], seen
    else:
        assert 400 in seen["GET /jobs/api/v1/jobs"], seen
        assert 404 in seen["POST /jobs/api/v1/jobs/{job_id}/retry"], seen
        assert 400 in seen["PUT /jobs/api/v1/schedules/{code}/cron_override"], seen
        assert 400 in seen["PUT /jobs/api/v1/limits/{target}/{name}"], seen
        assert 400 in seen["PUT /jobs/api/v1/tenant-weights/{tenant_id}"], seen
    assert seen[NEAR_MISS] == {404}, seen  # a real id spelt otherwise names no row
    assert seen.get(UNKNOWN_FIELD, set()) <= {400, 404}, seen  # 404: and a malformed code


def test_coverage_cases(session: Session, real: Real) -> None:
    """Schemathesis's deterministic cases per operation, both modes: boundary values (0,
    2**63, the longest code), wrong types, missing and duplicate parameters, bodies of
    the wrong shape or with unknown fields."""
    schema = api_schema(session)
    seen: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        config = schema.config.generation_for(operation=operation, phase="coverage")
        for number, case in enumerate(schema.iter_coverage_cases(
                operation, generation_modes=MODES, generation_config=config)):
            check(case, session, real, number, SPELLINGS[number % len(SPELLINGS)], seen)

    assert set(seen) >= EVERY_OPERATION, seen  # and methods the routes lack: 405
    assert 404 in seen["POST /jobs/api/v1/jobs/{job_id}/retry"], seen
    assert 400 in seen["PUT /jobs/api/v1/schedules/{code}/cron_override"], seen
    # The schema says a body takes no other field, so schemathesis tried unknown ones.
    unknown = seen.get(UNKNOWN_FIELD, set())
    assert 400 in unknown and unknown <= {400, 404}, seen
