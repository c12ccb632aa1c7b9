"""The simulation's one clock. Inside ``simulated_clock`` every reading of time the runtime makes
answers the fake clock: ``django.utils.timezone.now`` (the services' default ``now``), the
identifiers' millisecond prefix and random part (seeded, so ids and their order replay
exactly), ``runtime.db``'s embedded clock, and on PostgreSQL the database's own clock:
``now()`` and ``statement_timestamp()`` are shadowed for this session by functions of a
``sim_clock`` schema placed before ``pg_catalog`` on the search path, reading ``sim.now``. The
broker is replaced by a sink: deliveries are the scheduler's to make."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

from django.db import connection

from runtime import dialect

EPOCH = datetime(2031, 1, 1, tzinfo=UTC)

_SHADOWS = """
CREATE SCHEMA IF NOT EXISTS sim_clock;
CREATE OR REPLACE FUNCTION sim_clock.now() RETURNS timestamptz LANGUAGE sql STABLE
  AS $$ SELECT current_setting('sim.now')::timestamptz $$;
CREATE OR REPLACE FUNCTION sim_clock.statement_timestamp() RETURNS timestamptz LANGUAGE sql
  STABLE AS $$ SELECT current_setting('sim.now')::timestamptz $$;
CREATE OR REPLACE FUNCTION sim_clock.transaction_timestamp() RETURNS timestamptz LANGUAGE sql
  STABLE AS $$ SELECT current_setting('sim.now')::timestamptz $$;
CREATE OR REPLACE FUNCTION sim_clock.clock_timestamp() RETURNS timestamptz LANGUAGE sql
  STABLE AS $$ SELECT current_setting('sim.now')::timestamptz $$;
"""


class FakeClock:
    def __init__(self, seed: int) -> None:
        self.at = EPOCH
        self.rng = random.Random(f"ids-{seed}")
        self._pushed: datetime | None = None

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)

    def timestamp(self) -> float:
        return self.at.timestamp()

    def urandom(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "big")

    def push(self) -> None:
        """Tell the database the time (PostgreSQL), before each step."""
        if not dialect.database_clock():
            return
        with connection.cursor() as cur:
            cur.execute(
                "SELECT set_config('sim.now', %s, false),"
                " set_config('search_path', 'sim_clock, pg_catalog, public', false)",
                [self.at.isoformat()],
            )


class _Broker:
    """The broker's stand-in: the scheduler delivers work itself (from the rows), so a publish
    is dropped, as a lost message would be; the outbox rows stay the record."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextmanager
def simulated_clock(clock: FakeClock) -> Iterator[FakeClock]:
    if dialect.database_clock():
        with connection.cursor() as cur:
            cur.execute(_SHADOWS)
    shim = SimpleNamespace(now=lambda tz=None: clock.now())
    with ExitStack() as stack:
        stack.enter_context(mock.patch("django.utils.timezone.now", clock.now))
        stack.enter_context(mock.patch("runtime.ids.time", SimpleNamespace(time=clock.timestamp)))
        stack.enter_context(mock.patch("runtime.ids.os", SimpleNamespace(urandom=clock.urandom)))
        stack.enter_context(mock.patch("runtime.db.datetime", shim))
        stack.enter_context(mock.patch("runtime.publish.current_app", _Broker()))
        # No message is built for a push of its own either: every publish goes to the stand-in.
        stack.enter_context(
            mock.patch("runtime.transitions.fast.message_now", lambda *a, **k: None)
        )
        clock.push()
        try:
            yield clock
        finally:
            if dialect.database_clock() and connection.connection is not None:
                with connection.cursor() as cur:
                    cur.execute("RESET search_path")
