"""System check: a bad ``JOBS["KAFKA"]`` stops every command at start-up, naming the
field, instead of starting a worker that fails at its first send."""

from __future__ import annotations

import logging
from importlib.util import find_spec
from typing import Any

from django.core import checks

from jobs_engine.errors import InvalidSettings

_quiet = logging.getLogger("jobs_engine.kafka.check")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


MISSING_EXTRA = ("jobs_engine.contrib.kafka is in INSTALLED_APPS but confluent-kafka is not "
                 "installed: pip install 'jobs-engine[kafka]'")


def kafka_settings_problem() -> str | None:
    """Why the configured Kafka settings cannot work, or None."""
    if find_spec("confluent_kafka") is None:
        return MISSING_EXTRA

    from jobs_engine.contrib.kafka.settings import configured

    try:
        kafka = configured()
    except InvalidSettings as exc:
        return str(exc)
    if not kafka.bootstrap_servers:
        return None
    # librdkafka validates property names and values when a client is made; make one
    # (it is not kept, and sends nothing) so a typo in CLIENT fails here, not in a worker.
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({**kafka.producer_config(), "logger": _quiet})
    except KafkaException as exc:
        return f"JOBS['KAFKA']['CLIENT']: librdkafka refused the configuration: {exc.args[0].str()}"
    return None


@checks.register("jobs_engine_kafka")
def check_kafka_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    problem = kafka_settings_problem()
    if problem is None:
        return []
    return [checks.Error(problem, id="jobs_engine_kafka.E001", obj="JOBS['KAFKA']")]
