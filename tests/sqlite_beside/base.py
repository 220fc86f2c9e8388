"""SQLite as the second database of the PostgreSQL test run (tests/settings.py): Django's own
backend, with its JSON support known instead of probed.

``manage.py check`` asks every database whether it supports ``JSONField``, and SQLite's
backend answers by opening a connection, which a test without database access may not
(tests/kafka/test_kafka_settings.py runs the check). The engine needs SQLite's JSON
functions anyway: its models have JSON fields.
"""

from django.db.backends.sqlite3 import base, features


class DatabaseFeatures(features.DatabaseFeatures):
    supports_json_field = True


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
