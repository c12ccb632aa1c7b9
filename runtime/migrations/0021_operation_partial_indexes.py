"""Fewer index entries per operation (issue 37).

A claim and an acceptance each change the operation's status, so neither can be a HOT update:
each inserts a new entry into every index of the table whose key or predicate it must follow.
With four full (status, x) indexes, the proposal, claim and acceptance wrote 30 index entries
per operation; no query read ``(status, next_attempt_at)`` at all, and the others are read only
for rows in a few statuses. Now the status indexes are partial (runtime/models/operations.py):
in flight (status, tool), waiting (wait_until), expired (task); a succeeded operation leaves
them. On PostgreSQL, also:
- the foreign-key indexes of ``execution_id`` and ``compensates_id`` hold only the rows that
  have one (a compensation is rare; a proposal has no execution yet): a NULL is never looked up;
- the table keeps a tenth of each page free (fillfactor 90), so an update that changes no
  indexed column (a heartbeat's lease) can stay in its page as a HOT update.
SQLite keeps its full foreign-key indexes and its fill (one writer; no such option there).
"""

from django.db import migrations, models
from runtime.migrations import _dialect

IN_FLIGHT = (
    "pending",
    "waiting_approval",
    "waiting",
    "running",
    "retry_scheduled",
    "unresolved",
    "compensating",
    "expired",
    "manual_intervention",
)

# (column, partial index) whose full Django foreign-key index becomes partial.
NOT_NULL = [("execution_id", "op_execution_set"), ("compensates_id", "op_compensates_set")]

FIND_SINGLE = """
SELECT c.relname FROM pg_index x
JOIN pg_class c ON c.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0]
WHERE t.relname = 'runtime_operation' AND a.attname = %s AND x.indnatts = 1
  AND NOT x.indisunique AND NOT x.indisprimary AND x.indpred IS NULL
  AND t.relnamespace = current_schema()::regnamespace
"""


def narrow(apps, schema_editor):
    conn = schema_editor.connection
    if not _dialect.tuned_storage(conn):
        return
    with conn.cursor() as cur:
        for column, name in NOT_NULL:
            cur.execute(FIND_SINGLE, [column])
            for (full,) in cur.fetchall():
                cur.execute(f'DROP INDEX IF EXISTS "{full}"')
            cur.execute(
                f'CREATE INDEX IF NOT EXISTS "{name}" ON runtime_operation ("{column}") '
                f'WHERE "{column}" IS NOT NULL'
            )
        cur.execute("ALTER TABLE runtime_operation SET (fillfactor = 90)")


def widen(apps, schema_editor):
    conn = schema_editor.connection
    if not _dialect.tuned_storage(conn):
        return
    with conn.cursor() as cur:
        for column, name in NOT_NULL:
            cur.execute(f'DROP INDEX IF EXISTS "{name}"')
            cur.execute(
                f'CREATE INDEX IF NOT EXISTS "runtime_operation_{column}_fk" '
                f'ON runtime_operation ("{column}")'
            )
        cur.execute("ALTER TABLE runtime_operation RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0020_task_count_triggers_sqlite"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="operation", name="op_status_updated"),
        migrations.RemoveIndex(model_name="operation", name="op_status_lease"),
        migrations.RemoveIndex(model_name="operation", name="op_status_next"),
        migrations.RemoveIndex(model_name="operation", name="op_status_wait"),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(status__in=IN_FLIGHT),
                fields=["status", "tool"],
                name="op_live",
            ),
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(status="waiting"),
                fields=["wait_until"],
                name="op_waiting_until",
            ),
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(status="expired"), fields=["task"], name="op_expired"
            ),
        ),
        migrations.RunPython(narrow, widen),
    ]
