"""The database's dialect, by name: what the runtime may ask of the database it runs on, one
capability per function. Code asks for a capability (``dialect.database_clock()``), never
which database it runs on (``connection.vendor == ...``), as Django's own code asks
``connection.features``: a reader of a branch sees why it exists, and another database would
be one answer per capability here instead of a hunt through every branch.

Two dialects run: PostgreSQL (the service) and SQLite (the embedded mode: one host, one
writer at a time). Where Django already names a difference (``connection.features``), ask
Django; these are the differences the runtime's own SQL and its reading of time depend on.
Migrations ask ``runtime/migrations/_dialect.py`` instead: they are history, written against the
schema of their day, and import no runtime module that may change after them.

Each capability takes the connection to ask about (default: this thread's default one)."""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper


def _postgresql(conn: BaseDatabaseWrapper | None) -> bool:
    """The runtime's one vendor test."""
    return (conn if conn is not None else connections[DEFAULT_DB_ALIAS]).vendor == "postgresql"


def one_statement_forms(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether a transition may take its one-statement form (the statements of
    ``runtime.transitions``, the drainers' batches): a chain of data-modifying CTEs
    (``INSERT ... ON CONFLICT DO NOTHING`` and ``UPDATE ... RETURNING`` feeding one another) that
    refuses itself through ``runtime_refuse()`` (migration 0012) when a guard fails, so a proposal,
    a claim and an acceptance are one round trip each. PostgreSQL runs them; SQLite has no
    data-modifying CTE and no function that raises, so there every transition takes its general
    writer (the same rows, written by the ORM in a transaction). ``HOTPATH = False`` turns the forms
    off on PostgreSQL too: the tests of the general path (the differential tests run both)."""
    return _postgresql(conn) and getattr(settings, "HOTPATH", True)


def database_clock(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether the database has a clock of its own that every host reads (PostgreSQL's
    ``statement_timestamp()``): a decision that compares with a time another host wrote (a
    lease's expiry, an approval's validity) then reads that clock, in its statement where it
    can, since two hosts' clocks may disagree. The embedded mode (SQLite) runs on one host:
    its process clock is the one clock, and the caller's ``now`` is written as it is."""
    return _postgresql(conn)


def advisory_locks(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether a transaction can lock a name rather than a row, until it ends (PostgreSQL's
    ``pg_try_advisory_xact_lock``, migration 0017): an Idempotency-Key is then taken inside the
    request's own transaction, and a second request under the same key is refused at once
    instead of waiting for the first. SQLite has no such lock: there the key's record is
    claimed in a short transaction of its own first (``runtime.idempotent_requests``)."""
    return _postgresql(conn)


def server_side_binding(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether statements can be bound on the server (psycopg 3's ``Cursor`` on PostgreSQL), so
    the driver prepares each one once per connection after a few runs and the server stops
    parsing and planning the hot path's large statements on every call
    (``db.prepared_cursor``). Django's cursors bind on the client, which no server can
    prepare; SQLite's driver keeps its own statement cache, so there Django's cursor is
    already the right one."""
    return _postgresql(conn)


def connection_pool(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether Django can pool the database's connections (``OPTIONS["pool"]``, psycopg_pool:
    PostgreSQL only), so a tool slot's thread takes a connection from a small pool of its
    process's only while it writes, instead of holding one of the server's shared connections
    while its call waits (``runtime.slots``). An SQLite connection is a file opened in the
    process: nothing to pool."""
    return _postgresql(conn)


def skip_locked_rows(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether a transaction can lock rows and pass over those another transaction holds
    (PostgreSQL's ``SELECT ... FOR UPDATE SKIP LOCKED``), so a background removal (retention)
    takes only what nobody is working on and never waits for live work. SQLite has no row
    locks: its write transactions (``IMMEDIATE``) run one at a time, so what a transaction reads
    after it began cannot move under it."""
    return _postgresql(conn)
