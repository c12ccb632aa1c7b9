"""The web server's pool checks a connection by its socket (console.pgpool): a live one is handed
out without the empty query Django's check sends, one the server ended is found out and
replaced."""

from __future__ import annotations

import select
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from console.pgpool.base import DatabaseWrapper, socket_check
from tests.conftest import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pool() -> Iterator[ConnectionPool[Any]]:
    """The engine's pool as settings.database_pooled configures it, on the test database,
    opened."""
    settings_dict = {
        **connection.settings_dict,
        "ENGINE": "console.pgpool",
        "CONN_MAX_AGE": 0,
        "OPTIONS": {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 2}},
    }
    db = DatabaseWrapper(settings_dict, alias="pgpool-test")
    try:
        opened = db.pool
        assert opened is not None
        opened.open(wait=True)
        yield opened
    finally:
        db.close_pool()


def _sent(conn: psycopg.Connection[Any]) -> list[str]:
    """The queries sent through ``conn.execute`` from now on (the empty query of the check)."""
    sent: list[str] = []
    real = conn.execute

    def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return real(query, *args, **kwargs)

    conn.execute = execute  # type: ignore[method-assign]
    return sent


def _ended_by_the_server(conn: psycopg.Connection[Any]) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
    wait_for(
        lambda: select.select([conn.fileno()], [], [], 0)[0] != [],
        timeout=10,
        what="the server's goodbye on the socket",
    )


def test_a_live_idle_connection_is_handed_out_without_a_round_trip(pool):
    with pool.connection() as conn:
        pid = conn.info.backend_pid
    sent = _sent(conn)
    with pool.connection() as again:
        assert again is conn and again.info.backend_pid == pid
        assert again.execute("SELECT 1").fetchone() == (1,)
    assert sent == ["SELECT 1"]  # the check itself sent nothing


def test_a_connection_the_server_ended_fails_the_check_and_is_replaced(pool):
    with pool.connection() as conn:
        ended = conn.info.backend_pid
    _ended_by_the_server(conn)
    with pytest.raises(psycopg.OperationalError):
        socket_check(conn)
    with pool.connection(timeout=30) as fresh:
        assert fresh.info.backend_pid != ended
        assert fresh.execute("SELECT 1").fetchone() == (1,)


def test_a_connection_left_in_a_transaction_takes_the_full_check():
    """Not idle: the socket alone cannot vouch for it, so the empty query runs."""
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": True}) as conn:
        conn.execute("BEGIN")  # a transaction is open now
        sent = _sent(conn)
        socket_check(conn)
        assert sent == [""]
