"""The fast lane's in-flight marks as rows of their own (``InflightMark``), inserted before a
send and deleted with its outcomes, instead of two updates of the partition's row a poll.
The partition rows' ``inflight_ids`` and ``inflight_token`` stay: a takeover still judges
what a worker of the release before left there."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0017_statistics_appended'),
    ]

    operations = [
        migrations.CreateModel(
            name='InflightMark',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('token', models.CharField(help_text="The poll's token.", max_length=32)),
                ('partition', models.SmallIntegerField()),
                ('owner', models.CharField(max_length=200)),
                ('ids', models.JSONField(help_text='The rows of the send in this partition.')),
                ('marked_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'jobs_engine_inflight',
                'indexes': [models.Index(fields=['token'], name='jobs_inflight_by_token'), models.Index(fields=['partition'], name='jobs_inflight_by_partition')],
            },
        ),
    ]
