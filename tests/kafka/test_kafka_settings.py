"""``JOBS["KAFKA"]`` parsing: every bad value is a clear error naming its field, raised at
start-up (system check), never a worker that fails at its first send."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from jobs_engine import DEFAULT_POLICY, RUN_ONCE_POLICY, JobPolicy
from jobs_engine.contrib.kafka.checks import kafka_settings_problem
from jobs_engine.contrib.kafka.settings import (
    ENGINE_CLIENT,
    TopicSpec,
    parse_kafka_settings,
    server_problem,
    topic_problem,
)
from jobs_engine.errors import InvalidSettings
from jobs_engine.registry import all_targets
from jobs_engine.states import DeliveryMode


def parse(environ: dict[str, str] | None = None, **kafka: Any) -> Any:
    return parse_kafka_settings(kafka, environ=environ or {})


def test_full_settings_parse() -> None:
    kafka = parse(BOOTSTRAP_SERVERS="b1:9092, b2:9093", ENABLED=True,
                  TOPIC_OVERRIDES={"order_shipped": "orders.v2"},
                  EXTRA_TOPICS=["audit", "billing:at_least_once", "ops:at_most_once"],
                  CLIENT={"compression.type": "lz4", "linger.ms": 10}, BATCH_SIZE=250)
    assert kafka.batch_size == 250
    assert kafka.bootstrap_servers == ("b1:9092", "b2:9093")
    assert kafka.extra_topics == (
        TopicSpec("audit"), TopicSpec("billing", DeliveryMode.AT_LEAST_ONCE),
        TopicSpec("ops", DeliveryMode.AT_MOST_ONCE))
    assert [spec.target for spec in kafka.extra_topics] == [
        "kafka:audit", "kafka:billing", "kafka:ops"]
    assert kafka.topic_for("order_shipped", "orders") == "orders.v2"
    assert kafka.topic_for("order_created", "orders") == "orders"
    config = kafka.producer_config()
    assert config["bootstrap.servers"] == "b1:9092,b2:9093"
    assert config["compression.type"] == "lz4" and config["linger.ms"] == 10
    assert all(config[name] == value for name, value in ENGINE_CLIENT.items())


def test_empty_settings_mean_no_kafka() -> None:
    kafka = parse()
    assert kafka.extra_topics == () and kafka.enabled is True
    assert kafka.batch_size == 1000
    assert parse_kafka_settings(None, environ={}).extra_topics == ()


@pytest.mark.parametrize("topic", ["a", "A-b_c.9", "x" * 249, "..a", "._-"])
def test_legal_topic_names(topic: str) -> None:
    assert topic_problem(topic) is None


@pytest.mark.parametrize(("topic", "problem"), [
    ("", "not a Kafka topic name"),
    (".", "not allowed"),
    ("..", "not allowed"),
    ("x" * 250, "not a Kafka topic name"),
    ("has space", "not a Kafka topic name"),
    ("slash/no", "not a Kafka topic name"),
    ("ünicode", "not a Kafka topic name"),
    (42, "must be a string"),
])
def test_illegal_topic_names(topic: Any, problem: str) -> None:
    assert problem in (topic_problem(topic) or "")


@pytest.mark.parametrize("server", ["localhost:9092", "10.0.0.1:19092", "[::1]:9092",
                                    "kafka-0.kafka.svc.cluster.local:9092",
                                    "PLAINTEXT://broker:9092"])
def test_legal_bootstrap_servers(server: str) -> None:
    assert server_problem(server) is None


@pytest.mark.parametrize(("value", "problem"), [
    ("localhost", "'localhost' is not host:port"),
    ("localhost:", "'localhost:' is not host:port"),
    (":9092", "':9092' is not host:port"),
    ("host:99999", "outside 1..65535"),
    ("host:0", "outside 1..65535"),
    ("a:1,,b", "'b' is not host:port"),
    ("host name:9092", "is not host:port"),
    (9092, "must be a comma-separated string or a list"),
])
def test_bad_bootstrap_servers_name_the_field(value: Any, problem: str) -> None:
    with pytest.raises(InvalidSettings, match=r"JOBS\['KAFKA'\]\['BOOTSTRAP_SERVERS'\]") as err:
        parse(BOOTSTRAP_SERVERS=value)
    assert problem in str(err.value)


@pytest.mark.parametrize(("kafka", "field", "problem"), [
    ({"EXTRA_TOPICS": ["ok", "bad topic"]}, "EXTRA_TOPICS", "'bad topic' is not a Kafka topic"),
    ({"EXTRA_TOPICS": "a:exactly_once"}, "EXTRA_TOPICS", "':at_least_once' or ':at_most_once'"),
    ({"EXTRA_TOPICS": "a,a:at_least_once"}, "EXTRA_TOPICS", "'a' is listed twice"),
    ({"EXTRA_TOPICS": ".."}, "EXTRA_TOPICS", "not allowed"),
    ({"EXTRA_TOPICS": [1]}, "EXTRA_TOPICS", "list of strings"),
    ({"TOPIC_OVERRIDES": {"code": "no/slash"}}, "TOPIC_OVERRIDES", "not a Kafka topic"),
    ({"TOPIC_OVERRIDES": {"": "t"}}, "TOPIC_OVERRIDES", "non-empty string"),
    ({"TOPIC_OVERRIDES": ["t"]}, "TOPIC_OVERRIDES", "mapping of job code to topic"),
    ({"ENABLED": "maybe"}, "ENABLED", "true or false"),
    ({"CLIENT": {"retries": 3}}, "CLIENT", "set by the engine"),
    ({"CLIENT": {"message.timeout.ms": 60000}}, "CLIENT", "set by the engine"),
    ({"CLIENT": {"enable.idempotence": True}}, "CLIENT", "set by the engine"),
    ({"CLIENT": {"bootstrap.servers": "x:1"}}, "CLIENT", "use BOOTSTRAP_SERVERS"),
    ({"CLIENT": {"linger.ms": [1]}}, "CLIENT", "string, number or boolean"),
    ({"CLIENT": "linger.ms=1"}, "CLIENT", "mapping of librdkafka settings"),
    ({"BATCH_SIZE": 0}, "BATCH_SIZE", "integer from 1 to 10,000, got 0"),
    ({"BATCH_SIZE": 10_001}, "BATCH_SIZE", "integer from 1 to 10,000"),
    ({"BATCH_SIZE": "lots"}, "BATCH_SIZE", "got 'lots'"),
    ({"BATCH_SIZE": True}, "BATCH_SIZE", "got True"),
    ({"BATCH_SIZE": 2.5}, "BATCH_SIZE", "got 2.5"),
    ({"POLICIES": {"a": {"attempts": 1}}}, "POLICIES", "must be a JobPolicy"),
    ({"POLICIES": {"a": "RUN_ONCE_POLICY"}}, "POLICIES", "must be a JobPolicy"),
    ({"POLICIES": {"no/slash": RUN_ONCE_POLICY}}, "POLICIES", "not a Kafka topic"),
    ({"POLICIES": [RUN_ONCE_POLICY]}, "POLICIES", "mapping of topic to JobPolicy"),
])
def test_bad_values_name_their_field(kafka: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(InvalidSettings) as err:
        parse(**{"BOOTSTRAP_SERVERS": "b:9092", **kafka})
    assert f"JOBS['KAFKA']['{field}']" in str(err.value)
    assert problem in str(err.value)


def test_a_topic_gets_its_policy_or_the_default() -> None:
    """A policy for a topic this process does not register is kept aside, not an error:
    the environment may narrow EXTRA_TOPICS on one pod."""
    keep_none = JobPolicy(keep_completed=0)
    kafka = parse(BOOTSTRAP_SERVERS="b:9092", EXTRA_TOPICS="audit,billing:at_least_once",
                  POLICIES={"billing": RUN_ONCE_POLICY, "audit": keep_none,
                            "elsewhere": RUN_ONCE_POLICY})
    assert [(spec.topic, spec.policy) for spec in kafka.extra_topics] == [
        ("audit", keep_none), ("billing", RUN_ONCE_POLICY)]
    assert parse(BOOTSTRAP_SERVERS="b:9092", EXTRA_TOPICS="x").extra_topics[0].policy is \
        DEFAULT_POLICY


def test_unknown_keys_and_wrong_type() -> None:
    with pytest.raises(InvalidSettings, match="unknown keys: TOPICS"):
        parse(TOPICS=["a"])
    with pytest.raises(InvalidSettings, match=r"JOBS\['KAFKA'\] must be a dict"):
        parse_kafka_settings(["a"], environ={})


def test_topics_need_a_cluster_unless_disabled() -> None:
    with pytest.raises(InvalidSettings, match="BOOTSTRAP_SERVERS'] is required"):
        parse(EXTRA_TOPICS="a")
    assert parse(EXTRA_TOPICS="a", ENABLED=False).extra_topics == (TopicSpec("a"),)


def test_environment_overrides() -> None:
    """Operators point a pod elsewhere or switch Kafka off without a deploy."""
    kafka = parse({"JOBS_KAFKA_BOOTSTRAP_SERVERS": "env:9092", "JOBS_KAFKA_ENABLED": "off",
                   "JOBS_KAFKA_EXTRA_TOPICS": "x:at_least_once,y",
                   "JOBS_KAFKA_BATCH_SIZE": " 300 "},
                  BOOTSTRAP_SERVERS="settings:9092", EXTRA_TOPICS=["z"], BATCH_SIZE=50)
    assert kafka.bootstrap_servers == ("env:9092",)
    assert kafka.batch_size == 300
    assert kafka.enabled is False
    assert [(s.topic, s.delivery_mode) for s in kafka.extra_topics] == [
        ("x", DeliveryMode.AT_LEAST_ONCE), ("y", DeliveryMode.AT_MOST_ONCE)]
    with pytest.raises(InvalidSettings, match="'nope' is not host:port"):
        parse({"JOBS_KAFKA_BOOTSTRAP_SERVERS": "nope"})


def test_system_check_reports_bad_settings(settings: Any) -> None:
    """``manage.py check`` (run by every worker command before it starts) fails naming the
    field; a good configuration passes."""
    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:1", "EXTRA_TOPICS": ["a b"]}}
    with pytest.raises(SystemCheckError,
                       match=r"jobs_engine_kafka.E001.*'a b' is not a Kafka topic"):
        call_command("check")
    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:1", "EXTRA_TOPICS": ["ok"]}}
    assert kafka_settings_problem() is None
    call_command("check")


def test_system_check_asks_librdkafka_about_client_settings(settings: Any) -> None:
    """A CLIENT property librdkafka does not know, or a value it refuses, fails at start-up."""
    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:1",
                               "CLIENT": {"linger.msx": 5}}}
    assert "No such configuration property" in (kafka_settings_problem() or "")
    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:1",
                               "CLIENT": {"compression.type": "zip"}}}
    assert 'Invalid value "zip"' in (kafka_settings_problem() or "")


def test_the_project_settings_register_only_the_demo_topic() -> None:
    """The project's own settings declare one topic, the demo's order events
    (``examples.orders``); the tests register theirs explicitly."""
    assert [t.name for t in all_targets() if t.name.startswith("kafka:")] == [
        "kafka:demo.orders"]


def test_ready_registers_the_configured_topics(settings: Any) -> None:
    """The app's ready() reads ``jobs_settings().KAFKA`` and registers one fast-lane target
    per topic, in its delivery mode."""
    from django.apps import apps

    from jobs_engine.registry import get_target, unregister_target

    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:1",
                               "EXTRA_TOPICS": "jt.ready,jt.ready-alo:at_least_once",
                               "BATCH_SIZE": 400, "POLICIES": {"jt.ready-alo": RUN_ONCE_POLICY}}}
    try:
        apps.get_app_config("jobs_engine_kafka").ready()
        assert get_target("kafka:jt.ready").batch_size == 400
        assert get_target("kafka:jt.ready").delivery_mode is DeliveryMode.AT_MOST_ONCE
        assert get_target("kafka:jt.ready-alo").delivery_mode is DeliveryMode.AT_LEAST_ONCE
        assert get_target("kafka:jt.ready").lane == "fast"
        assert get_target("kafka:jt.ready").policy is DEFAULT_POLICY
        assert get_target("kafka:jt.ready-alo").policy is RUN_ONCE_POLICY
    finally:
        unregister_target("kafka:jt.ready")
        unregister_target("kafka:jt.ready-alo")


def test_ready_with_bad_settings_registers_nothing(settings: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Half a configuration is never registered; the error is logged (and the system check
    stops the commands)."""
    from django.apps import apps

    before = [t.name for t in all_targets() if t.name.startswith("kafka:")]
    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:1",
                               "EXTRA_TOPICS": "jt.fine,bad topic"}}
    apps.get_app_config("jobs_engine_kafka").ready()
    assert [t.name for t in all_targets() if t.name.startswith("kafka:")] == before
    assert "kafka:jt.fine" not in before
    assert "kafka targets not registered" in caplog.text and "'bad topic'" in caplog.text
