"""Counting what a piece of code sends to the database: commits (each outermost atomic block)
and statements (transaction control left out), for the tests that pin the hot path's cost."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from django.test.utils import CaptureQueriesContext

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@contextmanager
def commits_counted() -> Iterator[list[int]]:
    """Count the commits Django makes on this connection (each outermost atomic block)."""
    counted = [0]
    real = connection.commit

    def commit() -> None:
        counted[0] += 1
        real()

    connection.commit = commit  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        connection.commit = real  # type: ignore[method-assign]


def statements(ctx: CaptureQueriesContext) -> list[str]:
    """The SQL statements sent (transaction control is counted as commits, not here)."""
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(CONTROL)]
