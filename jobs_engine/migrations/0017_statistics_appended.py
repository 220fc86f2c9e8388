"""The hourly statistics are appended (``JobStatShard``): the outcome path inserts a row per
write instead of updating its session's bucket row, so only the folded rows (``shard`` -1,
one per bucket) stay unique. The rows already there keep their meaning."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0016_tenants'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='jobstatshard',
            name='job_stat_shards_tenant_bucket',
        ),
        migrations.AddIndex(
            model_name='jobstatshard',
            index=models.Index(fields=['hour'], name='job_stat_shards_hour'),
        ),
        migrations.AddConstraint(
            model_name='jobstatshard',
            constraint=models.UniqueConstraint(condition=models.Q(('shard', -1)), fields=('hour', 'target', 'outcome', 'tenant_id'), name='job_stat_shards_folded'),
        ),
    ]
