"""The task counters' triggers again on SQLite, and the counters recounted.

Adding a column to ``runtime_task`` (0019) makes Django rebuild the table on SQLite (a new table,
the rows copied, the old one dropped), and the triggers of 0003 went with the old table: from then
on the embedded mode's counters stopped moving. PostgreSQL alters the table in place and keeps its
triggers, so nothing runs there. The statements are 0003's, written again: a migration must not
change when an older one is edited."""

from django.db import migrations
from runtime.migrations import _dialect

_ADD = """
  INSERT INTO runtime_taskcount (condition, outcome, shard, n)
  VALUES ({row}.condition, COALESCE({row}.outcome, ''), 0, {n})
  ON CONFLICT (condition, outcome, shard) DO UPDATE SET n = n + {n};"""
DROP = [
    "DROP TRIGGER IF EXISTS runtime_task_count_insert;",
    "DROP TRIGGER IF EXISTS runtime_task_count_update;",
    "DROP TRIGGER IF EXISTS runtime_task_count_delete;",
]
CREATE = [
    "CREATE TRIGGER runtime_task_count_insert AFTER INSERT ON runtime_task BEGIN"
    + _ADD.format(row="NEW", n=1)
    + " END;",
    "CREATE TRIGGER runtime_task_count_update AFTER UPDATE OF condition, outcome ON runtime_task"
    " WHEN OLD.condition IS NOT NEW.condition OR OLD.outcome IS NOT NEW.outcome BEGIN"
    + _ADD.format(row="OLD", n=-1)
    + _ADD.format(row="NEW", n=1)
    + " END;",
    "CREATE TRIGGER runtime_task_count_delete AFTER DELETE ON runtime_task BEGIN"
    + _ADD.format(row="OLD", n=-1)
    + " END;",
]
RECOUNT = [
    "DELETE FROM runtime_taskcount;",
    "INSERT INTO runtime_taskcount (condition, outcome, shard, n)"
    " SELECT condition, COALESCE(outcome, ''), 0, count(*) FROM runtime_task"
    " GROUP BY condition, COALESCE(outcome, '');",
]


def _up(apps, schema_editor):
    if not _dialect.alter_rebuilds_table(schema_editor.connection):
        return
    with schema_editor.connection.cursor() as cur:
        for statement in [*DROP, *CREATE, *RECOUNT]:
            cur.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0019_task_external_id"),
    ]

    operations = [
        migrations.RunPython(_up, migrations.RunPython.noop),
    ]
