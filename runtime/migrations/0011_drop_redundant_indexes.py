"""Fewer indexes on the hot tables (PostgreSQL).

Every claim and acceptance changes indexed columns of its operation (status, lease), so each is
a non-HOT update that inserts into *every* index of the table; the journal and the invocation
rows are inserted once per transition. Django gave these tables indexes no query uses:
- a ``varchar_pattern_ops`` twin (``*_like``) of every text key and foreign key, which only
  serves ``LIKE 'prefix%'``, and nothing here filters ids by prefix;
- a single-column index on a foreign key that a composite index already leads with:
  operation(task_id) beside (task_id, created_at) and (task_id, idempotency_key),
  event(task_id) beside (task_id, seq), invocation(operation_id) beside (operation_id, number),
  task(agent_id) beside (agent_id, created_at, id).
Dropping them took the operation table from 16 indexes to 10 and the journal from 6 to 3.
``tests/runtime/test_hotpath.py`` checks that the queue and list queries still find an index.
SQLite keeps its indexes (one writer; a table rebuild there would also drop the counters'
triggers).
"""

from django.db import migrations
from runtime.migrations import _dialect

# (table, column) whose plain single-column index a composite index makes redundant.
REDUNDANT = [
    ("runtime_operation", "task_id"),
    ("runtime_event", "task_id"),
    ("runtime_invocation", "operation_id"),
    ("runtime_task", "agent_id"),
]

FIND_LIKE = """
SELECT i.indexname FROM pg_indexes i
WHERE i.schemaname = current_schema() AND i.tablename LIKE 'runtime\\_%%'
  AND i.indexdef LIKE '%%varchar_pattern_ops%%'
"""

FIND_SINGLE = """
SELECT c.relname FROM pg_index x
JOIN pg_class c ON c.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0]
WHERE t.relname = %s AND a.attname = %s AND x.indnatts = 1 AND NOT x.indisunique
  AND NOT x.indisprimary AND t.relnamespace = current_schema()::regnamespace
"""


def drop(apps, schema_editor):
    conn = schema_editor.connection
    if not _dialect.tuned_storage(conn):
        return
    with conn.cursor() as cur:
        cur.execute(FIND_LIKE)
        names = [row[0] for row in cur.fetchall()]
        for table, column in REDUNDANT:
            cur.execute(FIND_SINGLE, [table, column])
            names += [row[0] for row in cur.fetchall()]
        for name in names:
            cur.execute(f'DROP INDEX IF EXISTS "{name}"')


def restore(apps, schema_editor):
    conn = schema_editor.connection
    if not _dialect.tuned_storage(conn):
        return
    with conn.cursor() as cur:
        for table, column in REDUNDANT:
            cur.execute(f'CREATE INDEX IF NOT EXISTS "{table}_{column}_fk" ON "{table}" ("{column}")')


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0010_task_count_shard_per_backend"),
    ]

    operations = [
        migrations.RunPython(drop, restore),
    ]
