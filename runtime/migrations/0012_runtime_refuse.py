"""``runtime_refuse(code)``: lets one statement refuse itself (PostgreSQL).

A proposal runs as a single autocommit statement (runtime.hotpath): it inserts the operation,
then locks and updates the task row, and only then can it read whether the task still admits
work. Refusing at that point must undo the insert, and a statement can only do that by failing.
This function raises SQLSTATE ``RT409`` with the refusal's code as the message (runtime.db reads it
back). It is volatile, so the planner never folds a call with a constant argument.
SQLite has no such statement and no function.
"""

from django.db import migrations
from runtime.migrations import _dialect

CREATE = """
CREATE OR REPLACE FUNCTION runtime_refuse(code text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'RT409', MESSAGE = code;
END
$$
"""


def create(apps, schema_editor):
    if _dialect.server_functions(schema_editor.connection):
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if _dialect.server_functions(schema_editor.connection):
        schema_editor.execute("DROP FUNCTION IF EXISTS runtime_refuse(text)")


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0011_drop_redundant_indexes"),
    ]

    operations = [migrations.RunPython(create, drop)]
