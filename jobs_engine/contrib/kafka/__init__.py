"""Kafka targets for the jobs engine: ``kafka:<topic>`` fast-lane targets from settings.

``JOBS["KAFKA"]`` (see its ``settings``) declares the cluster and topics; the app's ``ready()``
registers one target per topic. Enqueue with ``target="kafka:<topic>"``, the event's code as
``code`` (``TOPIC_OVERRIDES`` may send a code elsewhere), the entity id as ``key`` and a
growing ``version`` for per-entity order.
"""

from jobs_engine.contrib.kafka.settings import target_name

__all__ = ["target_name"]
