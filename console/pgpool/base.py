"""Django's PostgreSQL backend with the pool's check made cheap: ``socket_check``.

Django's pool (CONN_HEALTH_CHECKS) checks every connection it hands out with an empty query: a
round trip per checkout, and the web makes two per POST (console.edge's admission, then the
view). A connection idle in the pool has nothing to read from its server; one the server ended
(a restart, ``pg_terminate_backend``, an idle timeout) has the server's FATAL message or the
end of the stream waiting on its socket. So a look at the socket decides, and only a connection
with something to read (or not idle) pays the empty query, which fails for a dead one: the pool
then replaces it, as before. Django passes ``check=`` itself, so the pool is built here (as
Django builds it) with this check."""

from __future__ import annotations

import select
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg import Connection, OperationalError
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool


def socket_check(conn: Connection[Any]) -> None:
    """Return quietly for a connection that looks alive; raise for a dead one (the pool then
    discards it and hands out another)."""
    if conn.closed or conn.broken:
        raise OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable or conn.info.transaction_status != TransactionStatus.IDLE:
        ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> ConnectionPool[Any] | None:  # type: ignore[override]
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        # Django's own (its stubs do not name them): the pools by alias, the configure hook.
        pools: dict[str, ConnectionPool[Any]] = self._connection_pools  # type: ignore[attr-defined]
        if self.alias not in pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets the mode later
            pool = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,  # type: ignore[attr-defined]
                check=socket_check,
                **({} if pool_options is True else pool_options),
            )
            pools.setdefault(self.alias, pool)
        return pools[self.alias]
