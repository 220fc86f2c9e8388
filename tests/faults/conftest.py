"""Fixtures of the fault suite: a dedicated PostgreSQL cluster, one database per scenario,
a Kafka broker of its own for the Kafka scenario, worker processes always reaped.

The cluster is never the suite's main one (54329): the scenarios restart and stop their
database, and other tests use the main one at the same time. It lives in
``~/.cache/jobs-engine/pg-faults/run-<pid>/`` (deleted at the end; or ``JOBS_FAULTS_PG_DIR``,
kept) on a free port (or ``JOBS_FAULTS_PG_PORT``), holds one migrated template database, and
each scenario runs on a copy. PostgreSQL only: on SQLite the
suite refuses to be collected instead of skipping silently.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.harness import SETTINGS_MODULE, TEMPLATE_DB, FaultRun
from tests.faults.pg import PgCluster, free_port, remove_run, run_data_dir, template_cluster
from tests.helpers import require_postgres

require_postgres("tests/faults", "restarts and stops a PostgreSQL cluster under real worker "
                 "processes")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: real processes under database and broker faults (tests/faults; "
        "JOBS_FAULTS_FULL=1 for the full sizes)")


@pytest.fixture(scope="session")
def fault_pg() -> Iterator[PgCluster]:
    """The dedicated cluster, with the migrated template; stopped when the session ends."""
    given = os.environ.get("JOBS_FAULTS_PG_DIR")
    data_dir = Path(given) if given else run_data_dir()
    port = int(os.environ["JOBS_FAULTS_PG_PORT"]) if os.environ.get("JOBS_FAULTS_PG_PORT") \
        else None
    cluster = template_cluster(data_dir, port, SETTINGS_MODULE, TEMPLATE_DB)
    try:
        yield cluster
    finally:
        if given:
            cluster.stop()
        else:
            remove_run(cluster)


@pytest.fixture
def fault_run(request: pytest.FixtureRequest, tmp_path: Path,
              fault_pg: PgCluster) -> Iterator[FaultRun]:
    """A run on a fresh copy of the template; every process it started is killed at the
    end, whatever happened."""
    fault_pg.start()  # a scenario that failed mid-outage may have left it stopped
    name = "faults_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    run = FaultRun(tmp_path, fault_pg, fault_pg.create_database(name, TEMPLATE_DB))
    try:
        yield run
    finally:
        run.kill_all()


@pytest.fixture
def fault_kafka(tmp_path: Path) -> Iterator[object]:
    """A Kafka broker of this test (``scripts/kafka.sh`` on a free port pair and a data dir
    under the test's tmp), stopped at the end."""
    from tests.kafka.broker import KafkaBroker

    port = int(os.environ.get("JOBS_FAULTS_KAFKA_PORT") or free_port(span=2))
    broker = KafkaBroker(port, str(tmp_path / "kafka-data"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
