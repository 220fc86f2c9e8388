"""Retention's index holds DEAD rows only.

``jobs_status_closed`` (status, closed_at) held an entry for every version of every row:
each enqueue and each long-lane reserve wrote one, and since few rows are RUNNING the
planner read it for statements that find their RUNNING rows by id or by lease (a
long-lane write, the rescue of expired leases). Under an old snapshot nothing removes the
entries of the RUNNING versions it still sees, and those statements visited each one:
2-3 ms a write after a few thousand jobs. ``jobs_dead_closed`` (closed_at, DEAD rows) is
what retention reads; the counts by status read the lanes' partial indexes.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs_engine", "0020_wake_only_when_waited"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(condition=models.Q(("status", "DEAD")), fields=["closed_at"],
                               name="jobs_dead_closed"),
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="jobs_status_closed",
        ),
    ]
