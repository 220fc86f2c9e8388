"""The Kafka target app: registers the ``kafka:<topic>`` targets from ``JOBS["KAFKA"]``.

The engine imports nothing of this app; this app registers its targets with the engine,
as any business app does.
"""

from __future__ import annotations

import logging

from django.apps import AppConfig

from jobs_engine.conf import register_section

logger = logging.getLogger("jobs_engine.kafka")

# The Kafka settings are this app's section of ``JOBS``; the engine passes over it.
register_section("KAFKA")


class KafkaTargetConfig(AppConfig):
    name = "jobs_engine.contrib.kafka"
    label = "jobs_engine_kafka"  # not "kafka": a host project's own app may take that one
    verbose_name = "Kafka target"

    def ready(self) -> None:
        from jobs_engine.contrib.kafka import checks  # noqa: F401  registers the system check
        from jobs_engine.contrib.kafka.settings import configured
        from jobs_engine.contrib.kafka.target import register_topics
        from jobs_engine.errors import InvalidSettings

        try:
            kafka = configured()
        except (InvalidSettings, TypeError) as exc:
            # The system check reports it and stops every management command (workers
            # included) at start-up; registering half a configuration would be worse.
            logger.error("kafka targets not registered: %s", exc)
            return
        register_topics(kafka)
