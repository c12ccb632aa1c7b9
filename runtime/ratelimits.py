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
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from runtime.errors import DomainError
from runtime.models import RateCounter

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


@dataclass(frozen=True)
class Limit:
    """At most ``attempts`` failed attempts per ``window_seconds`` for one subject."""

    name: str
    attempts: int
    window_seconds: int


@dataclass(frozen=True)
class Backoff:
    """``free`` failures, then a wait of ``base_seconds * 2**k`` after the k-th further one
    (k from 0), at most ``cap_seconds``; forgotten ``window_seconds`` after the last wait."""

    name: str
    free: int
    base_seconds: float
    cap_seconds: float
    window_seconds: int

    def delay(self, failures: int) -> float:
        """The wait that the ``failures``-th failure in a row imposes."""
        beyond = failures - self.free
        if beyond <= 0:
            return 0.0
        # min() first: 2**beyond overflows a float for a long enough flood.
        return min(self.cap_seconds, self.base_seconds * 2 ** min(beyond - 1, 64))


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
            over, ttl = client.eval(_COUNT_ALL, len(keyed), *(k for k, _ in keyed), *args)
        except Exception:
            redis_failed()
        else:
            if int(over):
                raise _refuse(int(ttl))
            return
    waits = [w for key, limit in keyed if (w := _db_take(key, limit, _dt(at))) is not None]
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
                _BACKOFF_FAIL,
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
    wait = _db_backoff_fail(key, backoff, _dt(at))
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


# --- Redis --------------------------------------------------------------------------------

# One failure per key (ARGV: window and limit per key, in order). Each increment and its
# window's start are one step: a crash between INCR and EXPIRE cannot leave a counter that
# never expires. Over: the longest wait among the keys over their limit.
_COUNT_ALL = """
local over, wait = 0, 0
for i, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  local ttl = redis.call('TTL', key)
  if ttl < 0 then
    redis.call('EXPIRE', key, ARGV[2 * i - 1])
    ttl = tonumber(ARGV[2 * i - 1])
  end
  if n > tonumber(ARGV[2 * i]) then
    over = 1
    if ttl > wait then wait = ttl end
  end
end
return {over, wait}
"""
# A hash per account: n (failures in a row), until (ms: no attempt before). ARGV: now (ms),
# free, window (ms: failures are forgotten this long after the wait ends), then the delay (ms)
# of the 1st, 2nd, ... failure beyond ``free`` (the last one repeats: the cap). While waiting,
# nothing is counted.
_BACKOFF_FAIL = """
local now = tonumber(ARGV[1])
local free = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'n', 'until')
local n = tonumber(state[1] or '0')
local untl = tonumber(state[2] or '0')
-- Only a failure beyond the free ones makes a wait (the others keep their own time in until,
-- which a concurrent attempt's clock may find a moment in its future).
if n > free and now < untl then return {0, untl - now} end
if now >= untl + window then n = 0 end
n = n + 1
local delay = 0
if n > free then
  local i = n - free
  if i > #ARGV - 3 then i = #ARGV - 3 end
  delay = tonumber(ARGV[3 + i])
end
redis.call('HSET', KEYS[1], 'n', n, 'until', now + delay)
redis.call('PEXPIRE', KEYS[1], delay + window)
return {1, delay}
"""

_clients: dict[int, Any] = {}


def _redis() -> Any:

    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        _clients.clear()
        client = _clients[pid] = redis.Redis.from_url(str(settings.REDIS_URL))
    return client


# --- database -----------------------------------------------------------------------------


def _db_take(key: str, limit: Limit, now: datetime) -> float | None:
    """Count one failure by guarded UPDATE; the seconds to wait when the limit has no room
    left, else None. PostgreSQL re-evaluates ``count < attempts`` on the row a concurrent
    UPDATE just changed, so the last failure allowed goes to exactly one attempt."""
    ends = now + timedelta(seconds=limit.window_seconds)
    for _ in range(3):
        if RateCounter.objects.filter(
            key=key, window_ends_at__gt=now, count__lt=limit.attempts
        ).update(count=F("count") + 1):
            return None
        if RateCounter.objects.filter(key=key, window_ends_at__lte=now).update(
            count=1, window_ends_at=ends
        ):
            return None if limit.attempts >= 1 else limit.window_seconds
        row = RateCounter.objects.filter(key=key).values_list("window_ends_at", flat=True).first()
        if row is not None:
            if row > now:
                # Clamped: another attempt may have opened the window a moment "after" now.
                return min(limit.window_seconds, (row - now).total_seconds())
            continue  # the window ended between the two statements: take the fresh one
        try:
            with transaction.atomic():
                RateCounter.objects.create(key=key, count=1, window_ends_at=ends)
            return None if limit.attempts >= 1 else limit.window_seconds
        except IntegrityError:
            continue  # a concurrent first failure created it: count against that row
    return limit.window_seconds


def _db_backoff_fail(key: str, backoff: Backoff, now: datetime) -> float | None:
    """One failure under the row's lock (embedded SQLite's IMMEDIATE transactions serialise
    the same way): the row holds the failures in a row and the end of the wait (the last
    failure's time while there is none: only a failure beyond the free ones makes a wait). The
    seconds to wait when waiting, else None."""
    window = timedelta(seconds=backoff.window_seconds)
    for _ in range(3):
        with transaction.atomic():
            row = RateCounter.objects.select_for_update().filter(key=key).first()
            if row is None:
                try:
                    with transaction.atomic():
                        RateCounter.objects.create(
                            key=key, count=1, window_ends_at=now + _seconds(backoff.delay(1))
                        )
                    return None
                except IntegrityError:
                    continue  # a concurrent first failure created it: lock that row
            if row.count > backoff.free and row.window_ends_at > now:
                return (row.window_ends_at - now).total_seconds()
            failures = 1 if now >= row.window_ends_at + window else row.count + 1
            RateCounter.objects.filter(key=key).update(
                count=failures, window_ends_at=now + _seconds(backoff.delay(failures))
            )
            return None
    return backoff.cap_seconds


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
