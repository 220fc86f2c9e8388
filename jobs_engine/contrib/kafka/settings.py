"""The ``JOBS["KAFKA"]`` settings: parsed once, every problem named by its field.

```python
JOBS = {"KAFKA": {
    "BOOTSTRAP_SERVERS": "broker1:9092,broker2:9092",   # or a list
    "ENABLED": True,                                    # False: every Kafka target paused
    "TOPIC_OVERRIDES": {"order_created": "orders.v2"},  # job code -> topic
    "EXTRA_TOPICS": ["audit", "billing:at_least_once"], # or "audit,billing:at_least_once"
    "CLIENT": {"compression.type": "lz4"},              # extra librdkafka producer config
    "BATCH_SIZE": 1000,                                 # records per send (one poll)
    "POLICIES": {"billing": RUN_ONCE_POLICY},           # topic -> JobPolicy (DEFAULT_POLICY)
}}
```

A topic's ``JobPolicy`` (``from jobs_engine import JobPolicy``: importable in a settings
module) sets its retries and how many of its sent jobs are kept; a topic whose events are
not worth keeping once sent sets ``keep_completed=0`` and pays nothing for it.

``BOOTSTRAP_SERVERS``, ``ENABLED``, ``EXTRA_TOPICS`` and ``BATCH_SIZE`` may be overridden by
the environment (``JOBS_KAFKA_<KEY>``), so an operator can point a pod at another cluster or
switch Kafka off without a deploy.

``BATCH_SIZE`` is the most rows of one topic a worker reads in a poll and produces in one
send (waiting once for all their reports). The send, not the poll, is what a broker round
trip costs, so it is larger than the engine's ``FAST_BATCH``; a send never holds two
versions of one key, so a topic with fewer keys due gets smaller sends.

The client settings that make a send's outcome classifiable and bounded (retries off, the
timeouts, acks) belong to the engine: ``CLIENT`` may not change them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jobs_engine.errors import InvalidSettings
from jobs_engine.policies import DEFAULT_POLICY, JobPolicy
from jobs_engine.states import DeliveryMode

TARGET_PREFIX = "kafka:"
SETTING = "JOBS['KAFKA']"
KNOWN_KEYS = ("BOOTSTRAP_SERVERS", "ENABLED", "TOPIC_OVERRIDES", "EXTRA_TOPICS", "CLIENT",
              "BATCH_SIZE", "POLICIES")
ENV_KEYS = ("BOOTSTRAP_SERVERS", "ENABLED", "EXTRA_TOPICS", "BATCH_SIZE")
DEFAULT_BATCH_SIZE = 1000
# A send must fit the client's queue (librdkafka queue.buffering.max.messages: 100,000).
MAX_BATCH_SIZE = 10_000

# Kafka's own rule (kafka.common.internals.Topic): legal characters, 1..249 long, not . or ..
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# host:port, [ipv6]:port, optionally with a listener scheme (PLAINTEXT://host:port).
_SERVER = re.compile(
    r"(?:[A-Za-z][A-Za-z0-9_]*://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r":(\d{1,5})")

# Timeouts that keep one send well under the 30 s partition lease
# (docs/design.md#kafka-target). A message not yet transmitted after QUEUE_WAIT_S is purged
# from the client (never sent: unreachable); one in flight gets MESSAGE_TIMEOUT_MS, and
# nothing outlives SEND_DEADLINE_S.
CONNECT_TIMEOUT_MS = 3000
REQUEST_TIMEOUT_MS = 10000
MESSAGE_TIMEOUT_MS = 10000
QUEUE_WAIT_S = CONNECT_TIMEOUT_MS / 1000 + 1.0
SEND_DEADLINE_S = MESSAGE_TIMEOUT_MS / 1000 + 1.5

# librdkafka settings the engine owns. Idempotence needs retries >= 1 in librdkafka
# ("`retries` must be set >= 1 when `enable.idempotence` is true"), so it is off.
ENGINE_CLIENT = {
    "retries": 0,
    "message.send.max.retries": 0,
    "enable.idempotence": False,
    "acks": "all",
    "socket.connection.setup.timeout.ms": CONNECT_TIMEOUT_MS,
    "request.timeout.ms": REQUEST_TIMEOUT_MS,
    "message.timeout.ms": MESSAGE_TIMEOUT_MS,
}
_ENGINE_ALIASES = {
    "bootstrap.servers", "metadata.broker.list", "delivery.timeout.ms",
    "request.required.acks", "retry.backoff.ms", "transactional.id",
    "error_cb", "on_delivery", "delivery.report.only.error", "logger", "on_error",
}
# Defaults a CLIENT entry may change: an unknown topic fails after 1 s instead of waiting
# for the message timeout; reconnects stay frequent enough for a 4 s queue wait; keys are
# partitioned like the Java client does (murmur2), so other producers agree on partitions.
DEFAULT_CLIENT: dict[str, Any] = {
    "topic.metadata.propagation.max.ms": 1000,
    "reconnect.backoff.max.ms": 1000,
    "partitioner": "murmur2_random",
    "log.connection.close": False,  # brokers close idle connections; not worth an error line
}


@dataclass(frozen=True)
class TopicSpec:
    topic: str
    delivery_mode: DeliveryMode = DeliveryMode.AT_MOST_ONCE
    policy: JobPolicy = DEFAULT_POLICY

    @property
    def target(self) -> str:
        return target_name(self.topic)


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: tuple[str, ...] = ()
    enabled: bool = True
    topic_overrides: Mapping[str, str] = field(default_factory=dict)
    extra_topics: tuple[TopicSpec, ...] = ()
    client: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int = DEFAULT_BATCH_SIZE

    def producer_config(self) -> dict[str, Any]:
        """The librdkafka configuration (without callbacks) of this cluster's producer."""
        return {**DEFAULT_CLIENT, **self.client, **ENGINE_CLIENT,
                "bootstrap.servers": ",".join(self.bootstrap_servers)}

    def topic_for(self, code: str, target_topic: str) -> str:
        return self.topic_overrides.get(code, target_topic)


def target_name(topic: str) -> str:
    return f"{TARGET_PREFIX}{topic}"


def topic_problem(topic: Any) -> str | None:
    """Why ``topic`` is not a legal Kafka topic name, or None."""
    if not isinstance(topic, str):
        return f"must be a string, got {topic!r}"
    if topic in {".", ".."}:
        return f"{topic!r} is not allowed as a topic name"
    if not _TOPIC.fullmatch(topic):
        return (f"{topic!r} is not a Kafka topic name (1 to 249 characters of "
                "a-z A-Z 0-9 . _ -)")
    return None


def server_problem(server: str) -> str | None:
    match = _SERVER.fullmatch(server)
    if not match:
        return f"{server!r} is not host:port"
    if not 1 <= int(match.group(1)) <= 65535:
        return f"{server!r} has port {match.group(1)}, outside 1..65535"
    return None


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"on", "true", "1", "yes"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"off", "false", "0", "no"}:
        return False
    raise InvalidSettings(f"{where} must be true or false, got {value!r}")


def _batch_size(value: Any) -> int:
    where = f"{SETTING}['BATCH_SIZE']"
    number = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int) \
            or not 1 <= number <= MAX_BATCH_SIZE:
        raise InvalidSettings(f"{where} must be an integer from 1 to {MAX_BATCH_SIZE:,}, "
                              f"got {value!r}")
    return number


def _string_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value]
    raise InvalidSettings(f"{where} must be a comma-separated string or a list of strings, "
                          f"got {value!r}")


def _bootstrap(value: Any) -> tuple[str, ...]:
    where = f"{SETTING}['BOOTSTRAP_SERVERS']"
    servers = _string_list(value, where)
    for server in servers:
        problem = server_problem(server)
        if problem:
            raise InvalidSettings(f"{where}: {problem} (expected 'host:port,host:port')")
    return tuple(servers)


def _extra_topics(value: Any) -> tuple[TopicSpec, ...]:
    where = f"{SETTING}['EXTRA_TOPICS']"
    specs: dict[str, TopicSpec] = {}
    for entry in _string_list(value, where):
        topic, _, mode = entry.partition(":")
        problem = topic_problem(topic)
        if problem:
            raise InvalidSettings(f"{where}: {problem}")
        try:
            delivery_mode = DeliveryMode(mode) if mode else DeliveryMode.AT_MOST_ONCE
        except ValueError:
            raise InvalidSettings(
                f"{where}: {entry!r}: the suffix must be ':at_least_once' or ':at_most_once', "
                f"got {mode!r}") from None
        if topic in specs:
            raise InvalidSettings(f"{where}: topic {topic!r} is listed twice")
        specs[topic] = TopicSpec(topic, delivery_mode)
    return tuple(specs.values())


def _with_policies(specs: tuple[TopicSpec, ...], value: Any) -> tuple[TopicSpec, ...]:
    """Each topic's policy. A policy may name a topic this process does not register: the
    environment may narrow ``EXTRA_TOPICS`` for one pod, which must not stop it."""
    where = f"{SETTING}['POLICIES']"
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"{where} must be a mapping of topic to JobPolicy, got {value!r}")
    for topic, policy in value.items():
        problem = topic_problem(topic)
        if problem:
            raise InvalidSettings(f"{where}: {problem}")
        if not isinstance(policy, JobPolicy):
            raise InvalidSettings(f"{where}[{topic!r}] must be a JobPolicy (from jobs_engine "
                                  f"import JobPolicy), got {policy!r}")
    return tuple(replace(spec, policy=value.get(spec.topic, spec.policy)) for spec in specs)


def _overrides(value: Any) -> dict[str, str]:
    where = f"{SETTING}['TOPIC_OVERRIDES']"
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"{where} must be a mapping of job code to topic, got {value!r}")
    for code, topic in value.items():
        if not isinstance(code, str) or not code:
            raise InvalidSettings(f"{where}: job code {code!r} must be a non-empty string")
        problem = topic_problem(topic)
        if problem:
            raise InvalidSettings(f"{where}[{code!r}]: {problem}")
    return dict(value)


def _client(value: Any) -> dict[str, Any]:
    where = f"{SETTING}['CLIENT']"
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"{where} must be a mapping of librdkafka settings, got {value!r}")
    for name, setting in value.items():
        if not isinstance(name, str):
            raise InvalidSettings(f"{where}: setting names must be strings, got {name!r}")
        if name in ENGINE_CLIENT or name in _ENGINE_ALIASES:
            raise InvalidSettings(
                f"{where}[{name!r}] is set by the engine (retries off and bounded timeouts make "
                "every send's outcome classifiable within the partition lease; use "
                "BOOTSTRAP_SERVERS for the brokers)")
        if not isinstance(setting, str | int | float):  # bool is an int
            raise InvalidSettings(f"{where}[{name!r}] must be a string, number or boolean, "
                                  f"got {setting!r}")
    return dict(value)


def configured() -> KafkaSettings:
    """The project's ``JOBS["KAFKA"]`` with its environment overrides."""
    from django.conf import settings

    jobs = getattr(settings, "JOBS", {})
    return parse_kafka_settings(jobs.get("KAFKA", {}) if isinstance(jobs, dict) else {})


def parse_kafka_settings(raw: Any, environ: Mapping[str, str] | None = None) -> KafkaSettings:
    """``JOBS["KAFKA"]`` (plus its environment overrides) as ``KafkaSettings``.

    Raises ``InvalidSettings`` naming the field. An empty dict means no Kafka targets.
    """
    environ = os.environ if environ is None else environ
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InvalidSettings(f"{SETTING} must be a dict, got {raw!r}")
    given = dict(raw)
    unknown = sorted(set(given) - set(KNOWN_KEYS), key=str)
    if unknown:
        raise InvalidSettings(f"{SETTING} has unknown keys: {', '.join(map(str, unknown))} "
                              f"(known: {', '.join(KNOWN_KEYS)})")
    for key in ENV_KEYS:
        if f"JOBS_KAFKA_{key}" in environ:
            given[key] = environ[f"JOBS_KAFKA_{key}"]
    settings = KafkaSettings(
        bootstrap_servers=_bootstrap(given.get("BOOTSTRAP_SERVERS", ())),
        enabled=_bool(given.get("ENABLED", True), f"{SETTING}['ENABLED']"),
        topic_overrides=_overrides(given.get("TOPIC_OVERRIDES", {})),
        extra_topics=_with_policies(_extra_topics(given.get("EXTRA_TOPICS", ())),
                                    given.get("POLICIES", {})),
        client=_client(given.get("CLIENT", {})),
        batch_size=_batch_size(given.get("BATCH_SIZE", DEFAULT_BATCH_SIZE)),
    )
    if settings.enabled and settings.extra_topics and not settings.bootstrap_servers:
        raise InvalidSettings(f"{SETTING}['BOOTSTRAP_SERVERS'] is required when Kafka topics "
                              "are configured and ENABLED is true")
    return settings
