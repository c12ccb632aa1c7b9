"""The Idempotency-Key claim of a request's own transaction (PostgreSQL) as one server round
trip: ``runtime_idempotency_claim`` takes the key's transaction-scoped advisory lock and, once
it holds it, reads the key's record. One SQL statement could not do both: its snapshot is taken
before the lock, so a record committed by the key's previous holder while the statement waited
to run would be missed and the request run twice. A VOLATILE function's queries each take a
snapshot of their own (READ COMMITTED), so the read here sees everything committed before the
lock was held."""

from django.db import migrations
from runtime.migrations import _dialect

CREATE = """
CREATE OR REPLACE FUNCTION runtime_idempotency_claim(p_principal text, p_key text)
RETURNS TABLE (taken boolean, existing runtime_idempotentrequest)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The lock key is the one the two-statement form took (a deployment mixing old and new
    -- processes still excludes itself).
    taken := pg_try_advisory_xact_lock(hashtextextended(p_principal || '|' || p_key, 7));
    IF taken THEN
        SELECT r.* INTO existing FROM runtime_idempotentrequest r
        WHERE r.principal = p_principal AND r.key = p_key;
    END IF;
    RETURN NEXT;
END
$$;
"""
DROP = "DROP FUNCTION IF EXISTS runtime_idempotency_claim(text, text);"


def create(apps, schema_editor):
    if _dialect.server_functions(schema_editor.connection):
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if _dialect.server_functions(schema_editor.connection):
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("runtime", "0016_notifications")]

    operations = [migrations.RunPython(create, drop)]
