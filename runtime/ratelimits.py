"""Brute-force limits on atomic counters (DRF's throttles read, then write, so concurrent
requests get past them). The credential is checked first and only failures are counted: a good
credential never spends from any budget, so honest concurrency (an agent's parallel calls, many
people behind one address) is never refused for being concurrent.

Two shapes of limit:

- ``Limit``: at most ``attempts`` failures per fixed window for one subject (a client address,
  a token prefix). The failure that goes over is answered 429, and so is every further one
  until the window ends.
- ``Backoff``: per account (a username). After ``free`` failures each further failure makes
  the account wait ``base * 2**k`` seconds, capped at ``cap``; an attempt during the wait is
  refused unchecked-in-effect (429) and is *not* counted, so a flood from addresses that are
  already limited cannot keep the owner out: they get in at most ``cap`` seconds after the
  last failure that was let through. Failures are forgotten ``window`` seconds after the wait.

A failure is decided atomically with its counting (one Lua script in Redis; guarded or
compare-and-set UPDATEs in the database), so of N concurrent failures exactly those the limit
allows are answered as failures and the rest 429, whatever N. The current time is ``clock()``
(Python's, not Redis's): the database backend needs it anyway, and tests can set it.

Services mode counts in Redis; embedded mode (and services mode while Redis is away) in the
database (``RateCounter``).

The shapes and their atomic counting (the Lua scripts, the database's guarded UPDATEs) are in
runtime.ratelimit_counters; here, the limits the console applies and the entries that count
and check against them.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings

from runtime.errors import DomainError
from runtime.models import RateCounter
from runtime.ratelimit_counters import (
    REDIS_BACKOFF_FAIL,
    REDIS_COUNT_ALL,
    Backoff,
    Limit,
    db_backoff_fail,
    db_take,
)

KEY_PREFIX = "ratelimit"


log = logging.getLogger(__name__)


def clock() -> float:
    """Seconds since the epoch; one place so a test can move time instead of sleeping."""
    return time.time()


class RateLimited(DomainError):
    """Too many failed attempts, or too many requests with one token (runtime.throttle); try
    again in ``retry_after`` seconds."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)


def _refuse(seconds: float) -> RateLimited:
    wait = max(1, math.ceil(seconds))
    return RateLimited(f"too many failed attempts; try again in {wait} s", retry_after=wait)


def login_limits() -> tuple[Backoff, Limit]:
    """(per username, per client address)."""
    window = int(settings.RATE_WINDOW_SECONDS)
    return (
        Backoff(
            "login-delay",
            int(settings.RATE_LOGIN_PER_ACCOUNT),
            float(settings.RATE_LOGIN_DELAY_BASE_SECONDS),
            float(settings.RATE_LOGIN_DELAY_MAX_SECONDS),
            window,
        ),
        Limit("login-address", int(settings.RATE_LOGIN_PER_ADDRESS), window),
    )


def token_limits() -> tuple[Limit, Limit]:
    """(per token prefix, per client address)."""
    window = int(settings.RATE_WINDOW_SECONDS)
    return (
        Limit("token-account", int(settings.RATE_TOKEN_PER_ACCOUNT), window),
        Limit("token-address", int(settings.RATE_TOKEN_PER_ADDRESS), window),
    )


def _backend() -> str:
    return "redis" if settings.REDIS_URL else "database"


def _key(name: str, subject: str) -> str:
    return f"{KEY_PREFIX}:{name}:{subject}"[:300]


def redis_or_none(backend: str | None) -> Any:
    """The Redis client when counting there (``backend`` "redis", or None in services mode),
    None for the database."""
    if (backend or _backend()) != "redis":
        return None
    try:
        return _redis()
    except Exception:
        redis_failed()
        return None


def redis_failed() -> None:
    """Log that the counters fall back to the database (Redis unreachable or failing)."""
    # Redis only helps here: while it is away, count in the database instead of turning every
    # request into an error (or letting every guess through).
    log.warning("rate limit counter in Redis unavailable; counting in the database")


def failure_count(
    checks: Sequence[tuple[Limit, str]], *, backend: str | None = None, now: float | None = None
) -> None:
    """Count one failed attempt against each (limit, subject). Raises RateLimited (with the
    seconds until the fullest window ends) when any of them is over its limit with it.

    Preconditions: the attempt was checked and failed. Safe under any concurrency."""
    at = clock() if now is None else now
    keyed = [(_key(limit.name, subject), limit) for limit, subject in checks]
    client = redis_or_none(backend)
    if client is not None:
        args = [str(v) for _, limit in keyed for v in (limit.window_seconds, limit.attempts)]
        try:
            over, ttl = client.eval(REDIS_COUNT_ALL, len(keyed), *(k for k, _ in keyed), *args)
        except Exception:
            redis_failed()
        else:
            if int(over):
                raise _refuse(int(ttl))
            return
    waits = [w for key, limit in keyed if (w := db_take(key, limit, _dt(at))) is not None]
    if waits:
        raise _refuse(max(waits))


def limit_check(
    checks: Sequence[tuple[Limit, str]], *, backend: str | None = None, now: float | None = None
) -> None:
    """Raises RateLimited when any (limit, subject) has no failure left in its window, counting
    nothing: a good password is refused then too, as a right guess must look like a wrong one.
    """
    at = clock() if now is None else now
    keys = [(_key(limit.name, subject), limit) for limit, subject in checks]
    client = redis_or_none(backend)
    if client is not None:
        try:
            pipe = client.pipeline(transaction=False)
            for key, _ in keys:
                pipe.get(key)
                pipe.ttl(key)
            answers = pipe.execute()
        except Exception:
            redis_failed()
        else:
            waits = [
                max(1, int(answers[2 * i + 1]))
                for i, (_, limit) in enumerate(keys)
                if answers[2 * i] is not None and int(answers[2 * i]) >= limit.attempts
            ]
            if waits:
                raise _refuse(max(waits))
            return
    now_dt = _dt(at)
    for key, limit in keys:
        row = RateCounter.objects.filter(key=key, window_ends_at__gt=now_dt).first()
        if row is not None and row.count >= limit.attempts:
            raise _refuse((row.window_ends_at - now_dt).total_seconds())


def backoff_failed(
    backoff: Backoff, subject: str, *, backend: str | None = None, now: float | None = None
) -> None:
    """Count a failure against ``subject``'s backoff, or raise RateLimited (counting nothing)
    while it is waiting. The failure that starts a wait is still answered as a failure.

    Preconditions: the attempt was checked and failed. Safe under any concurrency."""
    at = clock() if now is None else now
    key = _key(backoff.name, subject)
    client = redis_or_none(backend)
    if client is not None:
        # The delays for the first failures beyond ``free`` until the cap, in milliseconds: the
        # script takes the table instead of computing powers itself.
        delays = _delay_table_ms(backoff)
        try:
            counted, wait_ms = client.eval(
                REDIS_BACKOFF_FAIL,
                1,
                key,
                str(_ms(at)),
                str(backoff.free),
                str(int(backoff.window_seconds * 1000)),
                *delays,
            )
        except Exception:
            redis_failed()
        else:
            if not int(counted):
                raise _refuse(min(backoff.cap_seconds, int(wait_ms) / 1000))
            return
    wait = db_backoff_fail(key, backoff, _dt(at))
    if wait is not None:
        # Clamped: a concurrent failure may have started the wait a moment "after" now.
        raise _refuse(min(backoff.cap_seconds, wait))


def backoff_check(
    backoff: Backoff, subject: str, *, backend: str | None = None, now: float | None = None
) -> None:
    """Raises RateLimited while ``subject`` is waiting (a good password is refused then too),
    counting nothing."""
    at = clock() if now is None else now
    key = _key(backoff.name, subject)
    client = redis_or_none(backend)
    if client is not None:
        try:
            failures, until = client.hmget(key, "n", "until")
        except Exception:
            redis_failed()
        else:
            if until is not None and int(failures) > backoff.free and int(until) > _ms(at):
                raise _refuse(min(backoff.cap_seconds, (int(until) - _ms(at)) / 1000))
            return
    row = RateCounter.objects.filter(
        key=key, window_ends_at__gt=_dt(at), count__gt=backoff.free
    ).first()
    if row is not None:
        raise _refuse(min(backoff.cap_seconds, (row.window_ends_at - _dt(at)).total_seconds()))


def backoff_clear(backoff: Backoff, subject: str, *, backend: str | None = None) -> None:
    """The account's owner got in: its failures are forgotten."""
    key = _key(backoff.name, subject)
    client = redis_or_none(backend)
    if client is not None:
        try:
            client.delete(key)
        except Exception:
            redis_failed()
        else:
            return
    RateCounter.objects.filter(key=key).delete()


def _ms(at: float) -> int:
    return round(at * 1000)


def _dt(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=UTC)


def _delay_table_ms(backoff: Backoff) -> list[str]:
    table = []
    n = backoff.free + 1
    while True:
        delay = backoff.delay(n)
        table.append(str(int(delay * 1000)))
        if delay >= backoff.cap_seconds or len(table) >= 64:
            return table
        n += 1


_clients: dict[int, Any] = {}


def _redis() -> Any:

    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        _clients.clear()
        client = _clients[pid] = redis.Redis.from_url(str(settings.REDIS_URL))
    return client
