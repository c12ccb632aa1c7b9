"""Small database rules the whole runtime shares: no remote call inside a transaction, and one
reading of datetimes that a raw cursor returns (SQLite hands back naive text)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection


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
