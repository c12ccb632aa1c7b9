"""A task's updates on the hot path can be HOT (issue 37).

Each operation updates its task's row when it is proposed, claimed and accepted (the journal's
sequence, the counters, the condition, ``updated_at``). The condition changes with the claim
and the acceptance (runnable, running, runnable), and ``task_condition_outcome`` named it: two
of those three updates inserted a new entry into each of the table's nine indexes, about 1 KB of
WAL per operation (deploy/bench_wal.py). No index names the condition now (the queries that
filter by it narrow by the parent, the schedule, the owner or recency first), and on PostgreSQL
the table keeps a tenth of each page free (fillfactor 90) so the new version fits in its page.
SQLite drops the index too (no such option there).
"""

from django.db import migrations
from runtime.migrations import _dialect


def leave_room(apps, schema_editor):
    if _dialect.tuned_storage(schema_editor.connection):
        schema_editor.execute("ALTER TABLE runtime_task SET (fillfactor = 90)")


def fill(apps, schema_editor):
    if _dialect.tuned_storage(schema_editor.connection):
        schema_editor.execute("ALTER TABLE runtime_task RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0021_operation_partial_indexes"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="task", name="task_condition_outcome"),
        migrations.RunPython(leave_room, fill),
    ]
