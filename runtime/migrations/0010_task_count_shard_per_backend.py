"""Dashboard counters: a transaction's counter rows are its own backend's shard.

0003 sharded the counters by task id, so two tasks in one shard moving in opposite directions
(one runnable -> idle, the other idle -> runnable, each transaction holding its first counter
row until commit) deadlocked; `make bench` met it with 20 tasks. Now the shard is the backend
that writes (pg_backend_pid() % SHARDS): concurrent transactions are different backends and
touch different counter rows (the sum over shards is what is read, so a task may enter in one
shard and leave in another). Within one call the two rows are taken in a fixed order, so even
two backends that share a shard cannot cross on a single task's move. PostgreSQL only: SQLite
has one writer at a time.
"""

from django.db import migrations
from runtime.migrations import _dialect

SHARDS = 64

PG_FUNCTION = f"""
CREATE OR REPLACE FUNCTION runtime_task_count_move() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  my_shard smallint := pg_backend_pid() % {SHARDS};
  old_key text := NULL;
  new_key text := NULL;
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    old_key := OLD.condition || '/' || COALESCE(OLD.outcome, '');
  END IF;
  IF TG_OP IN ('UPDATE', 'INSERT') THEN
    new_key := NEW.condition || '/' || COALESCE(NEW.outcome, '');
  END IF;
  -- The smaller key first: every backend takes a shard's rows in one order.
  IF new_key IS NOT NULL AND (old_key IS NULL OR new_key < old_key) THEN
    INSERT INTO runtime_taskcount (condition, outcome, shard, n)
    VALUES (NEW.condition, COALESCE(NEW.outcome, ''), my_shard, 1)
    ON CONFLICT (condition, outcome, shard) DO UPDATE SET n = runtime_taskcount.n + 1;
    new_key := NULL;
  END IF;
  IF old_key IS NOT NULL THEN
    INSERT INTO runtime_taskcount (condition, outcome, shard, n)
    VALUES (OLD.condition, COALESCE(OLD.outcome, ''), my_shard, -1)
    ON CONFLICT (condition, outcome, shard) DO UPDATE SET n = runtime_taskcount.n - 1;
  END IF;
  IF new_key IS NOT NULL THEN
    INSERT INTO runtime_taskcount (condition, outcome, shard, n)
    VALUES (NEW.condition, COALESCE(NEW.outcome, ''), my_shard, 1)
    ON CONFLICT (condition, outcome, shard) DO UPDATE SET n = runtime_taskcount.n + 1;
  END IF;
  RETURN NULL;
END $$;
"""

PG_FUNCTION_0003 = """
CREATE OR REPLACE FUNCTION runtime_task_count_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    INSERT INTO runtime_taskcount (condition, outcome, shard, n)
    VALUES (OLD.condition, COALESCE(OLD.outcome, ''), abs(hashtext(OLD.id)) % 16, -1)
    ON CONFLICT (condition, outcome, shard) DO UPDATE SET n = runtime_taskcount.n - 1;
  END IF;
  IF TG_OP IN ('UPDATE', 'INSERT') THEN
    INSERT INTO runtime_taskcount (condition, outcome, shard, n)
    VALUES (NEW.condition, COALESCE(NEW.outcome, ''), abs(hashtext(NEW.id)) % 16, 1)
    ON CONFLICT (condition, outcome, shard) DO UPDATE SET n = runtime_taskcount.n + 1;
  END IF;
  RETURN NULL;
END $$;
"""


def _run(sql):
    def run(apps, schema_editor):
        if _dialect.server_functions(schema_editor.connection):
            with schema_editor.connection.cursor() as cur:
                cur.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0009_attempt_end"),
    ]

    operations = [
        migrations.RunPython(_run(PG_FUNCTION), _run(PG_FUNCTION_0003)),
    ]
