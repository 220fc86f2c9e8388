from django.apps import AppConfig


class KafkaTargetConfig(AppConfig):
    name = "kafka_target"
    verbose_name = "Kafka target"
