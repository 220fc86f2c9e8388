"""The admin's Limits page (``TargetLimit``): a model without a table, like ``JobStat``, for
the page's place, URL and view permission; nothing in the database changes."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0002_limits'),
    ]

    operations = [
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
    ]
