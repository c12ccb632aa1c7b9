"""The dialect differences the migrations depend on, one capability per function, as
``runtime/dialect.py`` names the runtime's. Kept here, beside the migrations, and frozen with
them: a migration is history and imports no runtime module that may change after it (the
leading underscore keeps Django's loader from taking this for a migration).

Two dialects run: PostgreSQL and SQLite (the embedded mode)."""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper


def _postgresql(conn: BaseDatabaseWrapper) -> bool:
    """The migrations' one vendor test."""
    return conn.vendor == "postgresql"


def server_functions(conn: BaseDatabaseWrapper) -> bool:
    """PL/pgSQL functions and statement-level triggers with transition tables (the task
    counters, ``runtime_refuse``, the Idempotency-Key claim). SQLite has row triggers only."""
    return _postgresql(conn)


def deferred_constraints(conn: BaseDatabaseWrapper) -> bool:
    """``SET CONSTRAINTS``: deferred trigger events that must be flushed before an ALTER."""
    return _postgresql(conn)


def tuned_storage(conn: BaseDatabaseWrapper) -> bool:
    """Indexes and table storage tuned by hand: the catalog's list of indexes, indexes rebuilt
    partial by raw SQL, ``fillfactor``. SQLite keeps Django's plain indexes."""
    return _postgresql(conn)


def alter_rebuilds_table(conn: BaseDatabaseWrapper) -> bool:
    """Whether altering a table copies it into a new one, which drops the old table's
    triggers (SQLite); PostgreSQL alters in place and keeps them."""
    return not _postgresql(conn)
