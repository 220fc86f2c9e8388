"""Limits and fair shares: each row's key under its target's limits (``Job.limit_key``) and
the indexes its admission and the fair reserve read, the limits' buckets, operators'
overrides and the tenants' weights; and on PostgreSQL the enqueue's functions again
(``store/sql/enqueue.sql`` now stores ``limit_key``). ``jobs_engine_new_rows`` returns one
more column, which ``CREATE OR REPLACE`` cannot change: it is dropped first. Not
reversible: the functions of 0001 are not kept anywhere to bring back.
"""

from django.db import migrations, models

from jobs_engine.store.functions import RunOnPostgreSQL, postgresql_functions

# The sha256 of store/sql/enqueue.sql this migration was written for.
ENQUEUE_SQL_DIGEST = "499a8c0b237d27424c2c76a9823dcc13a70b9022d6bba6884a8ad88243057cdd"


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='LimitBucket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('target', models.CharField(max_length=200)),
                ('name', models.CharField(help_text="The limit's name on its target.", max_length=60)),
                ('key', models.CharField(blank=True, default='', help_text='Its key; empty: the target as a whole.', max_length=200)),
                ('tokens', models.FloatField(default=0.0, help_text='Rate: starts it may make now.')),
                ('refilled_at', models.DateTimeField(blank=True, null=True)),
                ('blocked_until', models.DateTimeField(blank=True, help_text='A handler said wait (RateLimited).', null=True)),
                ('admitted', models.BigIntegerField(default=0, help_text='Jobs started under it.')),
                ('throttled', models.BigIntegerField(default=0, help_text='Times it held a due job back.')),
                ('used_at', models.DateTimeField(help_text='Its last admission.')),
            ],
            options={
                'db_table': 'jobs_engine_limit_bucket',
            },
        ),
        migrations.CreateModel(
            name='LimitOverride',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('target', models.CharField(max_length=200)),
                ('name', models.CharField(max_length=60)),
                ('slots', models.IntegerField(blank=True, help_text='Concurrency: slots.', null=True)),
                ('starts', models.IntegerField(blank=True, help_text='Rate: starts a period.', null=True)),
                ('period_s', models.FloatField(blank=True, help_text='Rate: the period.', null=True)),
                ('burst', models.IntegerField(blank=True, help_text='Rate: the burst.', null=True)),
                ('updated_at', models.DateTimeField()),
                ('updated_by', models.CharField(blank=True, default='', max_length=150)),
            ],
            options={
                'db_table': 'jobs_engine_limit_override',
            },
        ),
        migrations.CreateModel(
            name='TenantWeight',
            fields=[
                ('tenant_id', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('weight', models.IntegerField(default=1)),
                ('updated_at', models.DateTimeField()),
                ('updated_by', models.CharField(blank=True, default='', max_length=150)),
            ],
            options={
                'db_table': 'jobs_engine_tenant_weight',
            },
        ),
        migrations.AddField(
            model_name='job',
            name='limit_key',
            field=models.CharField(blank=True, help_text="Its key under its target's limits.", max_length=200, null=True),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'PENDING'), ('limit_key__isnull', False)), fields=['target', 'limit_key', '-priority', 'next_run_at', 'id'], name='jobs_limited_pending'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'RUNNING'), ('limit_key__isnull', False)), fields=['target', 'limit_key'], name='jobs_limited_running'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'PENDING'), ('lane', 'long'), ('tenant_id__isnull', False)), fields=['tenant_id', '-priority', 'next_run_at', 'id'], name='jobs_long_pending_tenant'),
        ),
        migrations.AddIndex(
            model_name='limitbucket',
            index=models.Index(fields=['used_at'], name='jobs_limit_bucket_used'),
        ),
        migrations.AddConstraint(
            model_name='limitbucket',
            constraint=models.UniqueConstraint(fields=('target', 'name', 'key'), name='jobs_limit_bucket_key'),
        ),
        migrations.AddConstraint(
            model_name='limitoverride',
            constraint=models.UniqueConstraint(fields=('target', 'name'), name='jobs_limit_override_one'),
        ),
        RunOnPostgreSQL("DROP FUNCTION IF EXISTS jobs_engine_new_rows(jsonb)"),
        postgresql_functions(ENQUEUE_SQL_DIGEST, reversible=False),
    ]
