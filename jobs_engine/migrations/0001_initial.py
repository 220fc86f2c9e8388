"""The engine's tables, and on PostgreSQL the sequences and functions of the enqueue, the
wake-ups and the limits' admission, which models do not express.

The tables are ``makemigrations``' output (two of them, ``Worker`` and ``JobStatShard``, list
their last columns in the order the schema has always had them; Django reads columns by name).

The PostgreSQL objects, which ``jobs_engine.store`` names and calls, are the file
``jobs_engine/store/sql/enqueue.sql``, their one source, which says what each does: the last
operation runs its statements as the file has them when the migration runs
(``store.functions.postgresql_functions``; reversed, it drops them). A later change to the
file, or to a function, is a new migration that runs the file again (every statement is
``CREATE OR REPLACE`` or ``IF NOT EXISTS``; a function whose arguments change is dropped
there first, or its old version stays beside the new), and that new migration names the
file's new digest: tests/unit/test_enqueue_sql.py fails while the newest one names another.

A database role that is not the migrations' owner needs ``USAGE, SELECT, UPDATE`` on the five
sequences and ``EXECUTE`` on the functions (PostgreSQL grants ``EXECUTE`` to ``PUBLIC`` by
default).
"""

import django.db.models.deletion
from django.db import migrations, models

from jobs_engine.store.functions import postgresql_functions

# The sha256 of store/sql/enqueue.sql this migration was written for.
ENQUEUE_SQL_DIGEST = "a871d15584cbc27bb56068b3abf199c0cf642edbd46c379ab2023bf0c0552e09"


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='JobStat',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ],
            options={
                'db_table': 'jobs_engine_jobstat',
                'managed': False,
            },
        ),
        migrations.CreateModel(
            name='RegisteredTarget',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
            ],
            options={
                'verbose_name': 'target',
                'db_table': 'jobs_engine_registered_target',
                'managed': False,
            },
        ),
        migrations.CreateModel(
            name='Partition',
            fields=[
                ('partition', models.SmallIntegerField(primary_key=True, serialize=False)),
                ('owner', models.CharField(blank=True, db_index=True, max_length=200, null=True)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='TargetPause',
            fields=[
                ('target', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('paused_until', models.DateTimeField()),
                ('reason', models.TextField(blank=True, default='')),
                ('paused_at', models.DateTimeField()),
                ('probe_by', models.CharField(blank=True, max_length=200, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='VersionCounter',
            fields=[
                ('key', models.CharField(max_length=255, primary_key=True, serialize=False)),
                ('value', models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name='Worker',
            fields=[
                ('worker_id', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('heartbeat_at', models.DateTimeField(db_index=True)),
                ('started_at', models.DateTimeField()),
                ('hostname', models.CharField(blank=True, default='', max_length=200)),
                ('pid', models.IntegerField(default=0)),
                ('lanes', models.CharField(blank=True, default='', max_length=50)),
                ('db_outages', models.IntegerField(db_default=0, default=0)),
                ('last_db_error', models.TextField(blank=True, db_default='', default='')),
                ('last_db_outage_at', models.DateTimeField(blank=True, null=True)),
                ('last_db_outage_s', models.FloatField(db_default=0.0, default=0.0)),
            ],
        ),
        migrations.CreateModel(
            name='AuditRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(db_index=True)),
                ('user_id', models.BigIntegerField(blank=True, null=True)),
                ('username', models.CharField(blank=True, default='', max_length=150)),
                ('action', models.CharField(max_length=32)),
                ('object_type', models.CharField(max_length=32)),
                ('object_id', models.CharField(max_length=255)),
                ('result', models.CharField(choices=[('ok', 'Done'), ('refused', 'Refused')], max_length=8)),
                ('message', models.TextField(blank=True, default='')),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
            ],
            options={
                'indexes': [models.Index(fields=['object_type', 'object_id'], name='audit_object'), models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='audit_by_tenant')],
            },
        ),
        migrations.CreateModel(
            name='CompletedJob',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('target', models.CharField(max_length=200)),
                ('lane', models.CharField(choices=[('fast', 'Fast'), ('long', 'Long')], max_length=8)),
                ('code', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, max_length=255, null=True)),
                ('version', models.BigIntegerField(default=0)),
                ('partition', models.SmallIntegerField(default=0)),
                ('dedupe_key', models.CharField(max_length=255)),
                ('delivery_mode', models.CharField(choices=[('at_most_once', 'At most once'), ('at_least_once', 'At least once')], max_length=16)),
                ('payload', models.JSONField(blank=True, null=True)),
                ('headers', models.JSONField(blank=True, default=dict)),
                ('result', models.JSONField(blank=True, help_text='What the handler returned.', null=True)),
                ('attempts', models.IntegerField(default=1, help_text='Tries made, this one included.')),
                ('trace_id', models.CharField(blank=True, default='', max_length=64)),
                ('actor', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField()),
                ('duration_ms', models.FloatField(default=0.0)),
                ('tries', models.JSONField(blank=True, help_text="Long lane: one entry per try that ended: the worker, its start and end, and the exception's class and traceback when it raised.", null=True)),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
            ],
            options={
                'db_table': 'jobs_engine_done',
                'indexes': [models.Index(fields=['target', 'finished_at', 'id'], name='jobs_done_by_target'), models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='jobs_done_by_tenant')],
            },
        ),
        migrations.CreateModel(
            name='Flow',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200)),
                ('kind', models.CharField(choices=[('chain', 'Chain'), ('batch', 'Batch')], max_length=8)),
                ('state', models.CharField(choices=[('RUNNING', 'Running'), ('COMPLETED', 'Completed'), ('FAILED', 'Failed'), ('CANCELLED', 'Cancelled')], default='RUNNING', max_length=10)),
                ('definition', models.CharField(blank=True, default='', help_text='The defined flow it was started from, if any.', max_length=200)),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
                ('steps_total', models.IntegerField()),
                ('steps_done', models.IntegerField(default=0)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'job flow',
                'db_table': 'jobs_engine_flow',
                'permissions': [('manage_flows', 'Can start, retry and cancel job flows')],
                'indexes': [models.Index(fields=['tenant_id', 'state', 'id'], name='jobs_flow_by_tenant'), models.Index(condition=models.Q(('finished_at__isnull', False)), fields=['finished_at'], name='jobs_flow_finished')],
            },
        ),
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
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('code', models.CharField(help_text='Business name; defaults to the target.', max_length=200)),
                ('target', models.CharField(max_length=200)),
                ('lane', models.CharField(choices=[('fast', 'Fast'), ('long', 'Long')], max_length=8)),
                ('key', models.CharField(blank=True, help_text='Ordering key.', max_length=255, null=True)),
                ('partition', models.SmallIntegerField()),
                ('version', models.BigIntegerField(default=0, help_text='Order inside a key.')),
                ('payload', models.JSONField(blank=True, null=True)),
                ('headers', models.JSONField(blank=True, default=dict)),
                ('dedupe_key', models.CharField(max_length=255)),
                ('status', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('DEAD', 'Dead'), ('DONE', 'Done')], default='PENDING', max_length=8)),
                ('delivery_mode', models.CharField(choices=[('at_most_once', 'At most once'), ('at_least_once', 'At least once')], default='at_most_once', max_length=16)),
                ('attempts', models.IntegerField(default=0, help_text='Tries made so far.')),
                ('next_run_at', models.DateTimeField()),
                ('last_error', models.TextField(blank=True, default='')),
                ('claimed_by', models.CharField(blank=True, max_length=200, null=True)),
                ('claim_token', models.CharField(blank=True, max_length=32, null=True)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('running_code', models.CharField(blank=True, max_length=200, null=True)),
                ('outcome_token', models.CharField(blank=True, max_length=32, null=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('trace_id', models.CharField(blank=True, default='', max_length=64)),
                ('actor', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('priority', models.SmallIntegerField(db_default=0, default=0, help_text='Long lane: -100..100, higher runs first.')),
                ('tries', models.JSONField(blank=True, help_text="Long lane: one entry per try that ended: the worker, its start and end, and the exception's class and traceback when it raised.", null=True)),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
                ('limit_key', models.CharField(blank=True, help_text="Its key under its target's limits.", max_length=200, null=True)),
            ],
            options={
                'permissions': [('manage_jobs', 'Can manage jobs and schedules')],
                'indexes': [models.Index(condition=models.Q(('status', 'PENDING'), ('limit_key__isnull', False)), fields=['target', 'limit_key', '-priority', 'next_run_at', 'id'], name='jobs_limited_pending'), models.Index(condition=models.Q(('status', 'RUNNING'), ('limit_key__isnull', False)), fields=['target', 'limit_key'], name='jobs_limited_running'), models.Index(condition=models.Q(('status', 'PENDING'), ('lane', 'long'), ('tenant_id__isnull', False), ('limit_key__isnull', True)), fields=['tenant_id', '-priority', 'next_run_at', 'id'], name='jobs_long_pending_tenant'), models.Index(condition=models.Q(('status', 'PENDING'), ('lane', 'long'), ('limit_key__isnull', True)), fields=['-priority', 'next_run_at', 'id'], name='jobs_long_pending_due'), models.Index(condition=models.Q(('status', 'PENDING'), ('lane', 'fast')), fields=['target', 'next_run_at', 'id'], name='jobs_fast_pending_due'), models.Index(condition=models.Q(('status', 'PENDING'), ('key__isnull', False)), fields=['partition', 'target', 'key', 'version', 'id'], name='jobs_pending_key_order'), models.Index(condition=models.Q(('status', 'RUNNING')), fields=['lease_until'], name='jobs_running_lease'), models.Index(condition=models.Q(('status', 'DEAD')), fields=['closed_at'], name='jobs_dead_closed'), models.Index(condition=models.Q(('status', 'DEAD')), fields=['target', 'closed_at', 'id'], name='jobs_dead_by_target'), models.Index(condition=models.Q(('key__isnull', False)), fields=['key'], name='jobs_key'), models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='jobs_by_tenant')],
                'constraints': [models.UniqueConstraint(fields=('dedupe_key',), name='jobs_one_per_dedupe_key'), models.UniqueConstraint(condition=models.Q(('status', 'RUNNING'), ('running_code__isnull', False)), fields=('running_code',), name='jobs_one_running_per_code')],
            },
        ),
        migrations.CreateModel(
            name='JobStatShard',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text='Start of the hour (UTC).')),
                ('target', models.CharField(max_length=200)),
                ('outcome', models.CharField(max_length=16)),
                ('shard', models.SmallIntegerField(help_text="The counting session's shard; -1: folded.")),
                ('count', models.BigIntegerField(default=0)),
                ('tenant_id', models.CharField(blank=True, db_default='', default='', help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200)),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='job_stat_shards_hour')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('shard', -1)), fields=('hour', 'target', 'outcome', 'tenant_id'), name='job_stat_shards_folded')],
            },
        ),
        migrations.CreateModel(
            name='FlowStep',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('position', models.IntegerField(help_text="Order in the chain, or in the batch's results.")),
                ('role', models.CharField(choices=[('step', 'Chain step'), ('job', 'Batch job'), ('callback', 'Batch callback')], max_length=8)),
                ('name', models.CharField(max_length=200)),
                ('target', models.CharField(max_length=200)),
                ('data', models.JSONField(blank=True, null=True)),
                ('state', models.CharField(choices=[('WAITING', 'Waiting'), ('QUEUED', 'Queued'), ('DONE', 'Done'), ('FAILED', 'Failed'), ('CANCELLED', 'Cancelled')], default='WAITING', max_length=10)),
                ('job_id', models.BigIntegerField(blank=True, null=True)),
                ('result', models.JSONField(blank=True, null=True)),
                ('attempts', models.IntegerField(default=0, help_text='Tries made, over every retry.')),
                ('last_error', models.TextField(blank=True, default='')),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('flow', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='jobs_engine.flow')),
            ],
            options={
                'db_table': 'jobs_engine_flowstep',
                'indexes': [models.Index(condition=models.Q(('job_id__isnull', False)), fields=['job_id'], name='jobs_flowstep_by_job')],
                'constraints': [models.UniqueConstraint(fields=('flow', 'position'), name='jobs_flowstep_place')],
            },
        ),
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
                'indexes': [models.Index(fields=['used_at'], name='jobs_limit_bucket_used')],
                'constraints': [models.UniqueConstraint(fields=('target', 'name', 'key'), name='jobs_limit_bucket_key')],
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
                'constraints': [models.UniqueConstraint(fields=('target', 'name'), name='jobs_limit_override_one')],
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
        migrations.CreateModel(
            name='TargetLimit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ],
            options={
                'verbose_name': 'limit',
                'verbose_name_plural': 'limits',
                'db_table': 'jobs_engine_target_limit',
                'managed': False,
            },
        ),
        postgresql_functions(ENQUEUE_SQL_DIGEST),
    ]
