"""Counting what a piece of code sends to the database: commits (each outermost atomic block)
and statements (transaction control left out), for the tests that pin the hot path's cost."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


# A statement that writes (or locks rows to write them).
_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b", re.I)


@contextmanager
def commits_counted() -> Iterator[list[int]]:
    """Count the commits made on this connection: each outermost atomic block Django commits,
    and each writing statement sent outside one (autocommit: the statement is its own
    transaction, as the hot path's proposal is)."""
    counted = [0]
    real = connection.commit

    def commit() -> None:
        counted[0] += 1
        real()

    def autocommitted(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not context["connection"].in_atomic_block and _WRITE.search(sql):
            counted[0] += 1
        return execute(sql, params, many, context)

    connection.commit = commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(autocommitted):
            yield counted
    finally:
        connection.commit = real  # type: ignore[method-assign]


def statements(ctx: CaptureQueriesContext) -> list[str]:
    """The SQL statements sent (transaction control is counted as commits, not here)."""
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(CONTROL)]


def generic_plan(sql: str) -> str:
    """EXPLAIN of the generic plan PostgreSQL keeps for ``sql`` (written with ``%(name)s``
    parameters) once it is prepared, as the hot path's statements are on a worker's
    connection (force_generic_plan): the plan that runs whatever the parameters are."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    with connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE plan_probe AS " + re.sub(r"%\((\w+)\)[sb]", number, sql))
        try:
            cur.execute(
                "SELECT parameter_types::text[] FROM pg_prepared_statements "
                "WHERE name = 'plan_probe'"
            )
            types = cur.fetchone()[0]
            cur.execute(f"EXPLAIN EXECUTE plan_probe({', '.join(f'NULL::{t}' for t in types)})")
            return "\n".join(row[0] for row in cur.fetchall())
        finally:
            cur.execute("DEALLOCATE plan_probe")
