"""Small database rules the whole runtime shares: no remote call inside a transaction, and one
reading of datetimes that a raw cursor returns (SQLite hands back naive text).

A service's transaction is named, never probed: ``x()`` opens its own (``atomic(durable=True)``,
or ``durable_statement`` for one statement) and ``x_txn()`` runs in the caller's. Only this
module looks at Django's open blocks, and only to refuse a broken precondition
(``outside_transaction``, ``durable_statement``), never to choose what a service does."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction

from runtime import dialect
from runtime.sqlfiles import queries

T = TypeVar("T")

_SQL = queries("database_now", slots={})


class TransactionOpen(RuntimeError):
    """A remote call was about to run while this process holds a transaction (a programming
    error: locks would be held across the network and the call could not be rolled back)."""


def outside_transaction(what: str) -> None:
    """Refuse ``what`` (a receiver call, a broker publish) while a transaction is open. The
    transaction a test case wraps around each test is not the code's own and does not count
    (Django marks it the same way for ``atomic(durable=True)``)."""
    if any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
        raise TransactionOpen(f"{what} while a database transaction is open")


def db_datetime(value: datetime | str | None) -> datetime | None:
    """A timestamp read through a raw cursor, as an aware UTC datetime. PostgreSQL returns aware
    datetimes; SQLite returns the stored text, naive and in UTC (Django stores UTC there)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def db_now() -> datetime:
    """The database's clock (PostgreSQL's ``statement_timestamp()``), for a decision that
    compares with a time another host wrote (an approval's validity, a lease): two hosts'
    clocks may disagree, the database's is one. The embedded mode (SQLite) runs on one host,
    so its process clock is that clock."""
    if not dialect.database_clock():
        return datetime.now(UTC)
    with connection.cursor() as cur:
        cur.execute(_SQL["database_now"])
        row = fetchone_named(cur)
    return row["now"]  # type: ignore[no-any-return,index]


# PostgreSQL's answers to contention that a retry of the whole transaction resolves:
# serialization_failure, deadlock_detected, lock_not_available.
_CONTENTION_SQLSTATES = {"40001", "40P01", "55P03"}


def is_contention(exc: BaseException) -> bool:
    """Whether a database error only says concurrent transactions got in the way (the
    transaction rolled back and may be run again), as opposed to a fault of the statement."""

    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) in _CONTENTION_SQLSTATES:
        return True
    # SQLite: another connection holds the write lock past the busy timeout.
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def contention_retry(fn: Callable[[], T], *, attempts: int = 3) -> T:
    """Run ``fn`` (a whole transaction of its own: no transaction may be open around it) again
    when the database rolled it back for contention, after a short jittered pause; any other
    error, or contention on the last attempt, propagates. A worker's claim or report that lost a
    deadlock is then retried at once instead of waiting for the sweeper to announce it again."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not is_contention(exc):
                raise
            time.sleep(random.uniform(0.005, 0.03) * attempt)
    raise AssertionError("unreachable")


@contextmanager
def durable_statement() -> Iterator[None]:
    """Run the block's one statement as a transaction of its own, as ``atomic(durable=True)``
    would, without its BEGIN and COMMIT round trips: in autocommit the statement is its own
    transaction. The precondition is durable's, and checked by it: no transaction is open
    (RuntimeError otherwise; a caller inside one calls the service's ``_txn`` entry). A test
    case's transaction stands for none, as it does for durable, which gives the statement a
    savepoint there, so a refusal leaves the test's transaction usable."""
    if connection.in_atomic_block:
        with transaction.atomic(durable=True):
            yield
    else:
        yield


# The SQLSTATE of ``runtime_refuse(code)`` (migration 0012): a statement that refused itself.
REFUSED_SQLSTATE = "RT409"


def refusal_code(exc: BaseException) -> str | None:
    """The code a statement refused itself with (``runtime_refuse``), or None when ``exc`` is
    any other error. The statement failed, so it wrote nothing."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) != REFUSED_SQLSTATE:
        return None
    return str(cause.diag.message_primary)  # type: ignore[union-attr]


def _column_names(cur: Any) -> list[str]:
    names = [column[0] for column in cur.description]
    if len(set(names)) != len(names):
        # A dict would keep one of two columns of the same name: name them apart in the SQL.
        raise ValueError(f"a statement returned two columns of the same name: {names}")
    return names


def fetchone_named(cur: Any) -> dict[str, Any] | None:
    """The cursor's next row as ``{column name: value}`` (None when there is none): a row of
    the runtime's hand-written statements is read by the names its SQL gives its columns,
    never by position, so a column added to or moved in a statement cannot shift another."""
    row = cur.fetchone()
    return None if row is None else dict(zip(_column_names(cur), row, strict=True))


def fetchall_named(cur: Any) -> list[dict[str, Any]]:
    """The cursor's remaining rows as ``fetchone_named`` reads one."""
    rows = cur.fetchall()
    if not rows:
        return []
    names = _column_names(cur)
    return [dict(zip(names, row, strict=True)) for row in rows]


def prepared_cursor() -> Any:
    """A cursor for the statements every operation runs (the hot path): on PostgreSQL it binds
    parameters on the server, so psycopg prepares each statement once per connection after
    a few runs (its ``prepare_threshold``) and the server stops parsing and planning the
    large data-modifying CTEs for every operation. Django's own cursors bind on the client
    (they inline the values into the text), which no server can prepare. Execute wrappers
    (query counting) still see every statement."""
    # The default connection, looked up once: each attribute read through the ``connection``
    # proxy is a lookup of the thread's connection, and this runs twice per proposal.
    conn = connections[DEFAULT_DB_ALIAS]
    if not dialect.server_side_binding(conn):
        return conn.cursor()

    conn.close_if_health_check_failed()
    conn.ensure_connection()
    cursor: Any = psycopg.Cursor(conn.connection)
    if conn.queries_logged:  # as Django's own cursor() does (debug and query capture)
        return conn.make_debug_cursor(cursor)
    return conn.make_cursor(cursor)
