"""Schemathesis against the API's own OpenAPI schema, in-process through Django's WSGI
application, logged in as an engine manager: generated valid and invalid requests to
every route (jobs and schedules) never get a 5xx, and every error is in the API's one
error shape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager
from tests.db.schedule_helpers import declared_schedule

pytestmark = pytest.mark.django_db

EXAMPLES = 200  # per generation mode, spread over every operation; a few seconds


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
    client.force_login(manager())
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


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(targets: Any, mode: GenerationMode,
                                        session: Session) -> None:
    targets("schema.target")
    targets("schema.long", lane="long")
    for status in (JobStatus.DEAD, JobStatus.DEAD, JobStatus.PENDING):
        make_job("schema.target", status=status, key="k")
    make_job("schema.long", status=JobStatus.RUNNING)
    with declared_schedule("schema_sched") as schedule:
        seen = run_schemathesis(mode, session, schedule.code)

    every = set().union(*seen.values())
    assert not every & {401, 403}, seen  # the manager's session and CSRF token were used
    if mode is GenerationMode.POSITIVE:
        assert 200 in seen["GET /jobs/api/v1/jobs"], seen
        assert 200 in seen["GET /jobs/api/v1/schedules"], seen
        assert 200 in seen["POST /jobs/api/v1/schedules/{code}/disable"], seen  # the real code
    else:
        assert 400 in seen["GET /jobs/api/v1/jobs"], seen

    assert set(seen) >= {"GET /jobs/api/v1/jobs", "GET /jobs/api/v1/jobs/{job_id}",
                         "POST /jobs/api/v1/jobs/{job_id}/retry",
                         "POST /jobs/api/v1/jobs/{job_id}/skip",
                         "POST /jobs/api/v1/jobs/{job_id}/cancel",
                         "POST /jobs/api/v1/schedules/{code}/enable",
                         "POST /jobs/api/v1/schedules/{code}/disable",
                         "POST /jobs/api/v1/schedules/{code}/run",
                         "PUT /jobs/api/v1/schedules/{code}/cron_override",
                         "DELETE /jobs/api/v1/schedules/{code}/cron_override"}, seen
    # GET /schedules takes no parameter, so there is no invalid request of it to generate.


def run_schemathesis(mode: GenerationMode, session: Session, code: str
                     ) -> dict[str, set[int]]:
    """Call every operation with generated cases; the status codes seen per operation.
    Half the schedule cases use the real ``code`` (a generated one names no schedule)."""
    schema = schemathesis.openapi.from_wsgi("/jobs/api/v1/openapi.json", session.app)
    seen: dict[str, set[int]] = {}

    cookies, headers = session.cookies, session.headers
    # The session cookie is fixed: the schema's cookie security scheme would otherwise
    # get generated (wrong) session ids and every case would stop at 401.
    @given(case=schema.as_strategy(generation_mode=mode, cookies=cookies, headers=headers),
           real_code=st.booleans())
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def call(case: Any, real_code: bool) -> None:
        if real_code and "code" in (case.path_parameters or {}):
            case.path_parameters["code"] = code
        response = case.call(cookies=cookies, headers=headers)
        label = f"{case.method} {case.operation.path}"
        seen.setdefault(label, set()).add(response.status_code)
        assert response.status_code < 500, (label, case.path_parameters, case.query,
                                             response.status_code, response.text[:500])
        if response.status_code >= 400 and response.status_code != 405:
            body = response.json()
            assert body["status_code"] == response.status_code, body
            assert isinstance(body["code"], str) and isinstance(body["message"], list), body

    call()
    return seen
