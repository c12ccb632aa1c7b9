"""Brute-force limits on atomic counters (DRF's throttles read, then write, so concurrent
requests get past them). An attempt takes a slot per subject (the account, the client address)
*before* the credentials are checked: the counter's own atomic increment decides, so N
concurrent attempts can never all pass a limit of fewer than N. A successful attempt gives its
slots back, so only failures use up the budget.

Services mode counts in Redis (INCR and EXPIRE in one Lua script, which Redis runs atomically);
embedded mode in the database (``RateCounter``, guarded UPDATEs only).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from runtime.errors import DomainError
from runtime.models import RateCounter

KEY_PREFIX = "ratelimit"
log = logging.getLogger(__name__)


class RateLimited(DomainError):
    """Too many attempts; try again later."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)


@dataclass(frozen=True)
class Limit:
    """At most ``attempts`` failed attempts per ``window_seconds`` for one subject."""

    name: str
    attempts: int
    window_seconds: int


@dataclass
class Held:
    """The slots an attempt holds; give them back with ``attempt_succeeded``."""

    backend: str
    keys: list[tuple[str, str]] = field(default_factory=list)  # (backend, key)


def login_limits() -> tuple[Limit, Limit]:
    window = int(settings.RATE_WINDOW_SECONDS)
    return (
        Limit("login-account", int(settings.RATE_LOGIN_PER_ACCOUNT), window),
        Limit("login-address", int(settings.RATE_LOGIN_PER_ADDRESS), window),
    )


def token_limits() -> tuple[Limit, Limit]:
    window = int(settings.RATE_WINDOW_SECONDS)
    return (
        Limit("token-account", int(settings.RATE_TOKEN_PER_ACCOUNT), window),
        Limit("token-address", int(settings.RATE_TOKEN_PER_ADDRESS), window),
    )


def _backend() -> str:
    return "redis" if settings.REDIS_URL else "database"


def attempt_begin(
    checks: Sequence[tuple[Limit, str]], *, backend: str | None = None, now: datetime | None = None
) -> Held:
    """Take one slot for each (limit, subject). Raises RateLimited (with the seconds until the
    fullest window ends) when any is used up; the slots already taken are given back.

    Preconditions: none; safe under any concurrency (the counters decide atomically)."""
    held = Held(backend or _backend())
    keyed = [(f"{KEY_PREFIX}:{limit.name}:{subject}"[:300], limit) for limit, subject in checks]
    if held.backend == "redis":
        try:
            # Every slot in one script (one round trip; Redis runs it atomically).
            taken, retry = _redis_take_all(keyed)
        except Exception:
            # Redis only helps here: while it is away, count in the database instead of
            # turning every request into an error (or letting every guess through).
            log.warning("rate limit counter in Redis unavailable; counting in the database")
            held.backend = "database"
        else:
            if not taken:
                raise RateLimited(f"too many attempts; try again in {retry} s", retry_after=retry)
            held.keys = [("redis", key) for key, _ in keyed]
            return held
    for key, limit in keyed:
        taken, retry = _db_take(key, limit, now or timezone.now())
        if not taken:
            attempt_succeeded(held)
            raise RateLimited(f"too many attempts; try again in {retry} s", retry_after=retry)
        held.keys.append((held.backend, key))
    return held


def attempt_succeeded(held: Held) -> None:
    """The credentials were good: the attempt does not count against anyone."""
    in_redis = [key for backend, key in held.keys if backend == "redis"]
    if in_redis:
        with contextlib.suppress(Exception):  # an unreturned slot only expires later
            _redis().eval(_GIVE_BACK, len(in_redis), *in_redis)
    for backend, key in held.keys:
        if backend != "redis":
            RateCounter.objects.filter(key=key, count__gt=0).update(count=F("count") - 1)
    held.keys.clear()


# --- Redis --------------------------------------------------------------------------------

# A slot per key (ARGV: window and limit per key, in order). Each increment and its window's
# start are one step: a crash between INCR and EXPIRE cannot leave a counter that never expires.
# A key over its limit refuses the attempt; the slots taken before it are given back, its own
# increment stays counted (as a failed attempt does).
_TAKE_ALL = """
for i, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  local ttl = redis.call('TTL', key)
  if ttl < 0 then
    redis.call('EXPIRE', key, ARGV[2 * i - 1])
    ttl = tonumber(ARGV[2 * i - 1])
  end
  if n > tonumber(ARGV[2 * i]) then
    for j = 1, i - 1 do
      if redis.call('EXISTS', KEYS[j]) == 1 then redis.call('DECR', KEYS[j]) end
    end
    return {0, ttl}
  end
end
return {1, 0}
"""
# Never DECR a key that expired meanwhile: that would create one without a window.
_GIVE_BACK = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('DECR', key) end
end
return 0
"""

_clients: dict[int, Any] = {}


def _redis() -> Any:
    import redis

    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        _clients.clear()
        client = _clients[pid] = redis.Redis.from_url(str(settings.REDIS_URL))
    return client


def _redis_take_all(keyed: list[tuple[str, Limit]]) -> tuple[bool, int]:
    args = [str(v) for _, limit in keyed for v in (limit.window_seconds, limit.attempts)]
    taken, ttl = _redis().eval(_TAKE_ALL, len(keyed), *(key for key, _ in keyed), *args)
    return int(taken) == 1, int(ttl)


# --- database -----------------------------------------------------------------------------


def _db_take(key: str, limit: Limit, now: datetime) -> tuple[bool, int]:
    """One slot by guarded UPDATE: PostgreSQL re-evaluates ``count < attempts`` on the row a
    concurrent UPDATE just changed, so the last slot goes to exactly one attempt."""
    ends = now + timedelta(seconds=limit.window_seconds)
    for _ in range(3):
        if RateCounter.objects.filter(
            key=key, window_ends_at__gt=now, count__lt=limit.attempts
        ).update(count=F("count") + 1):
            return True, 0
        if RateCounter.objects.filter(key=key, window_ends_at__lte=now).update(
            count=1, window_ends_at=ends
        ):
            return True, 0
        row = RateCounter.objects.filter(key=key).values_list("window_ends_at", flat=True).first()
        if row is not None:
            if row > now:
                # Clamped: another attempt may have opened the window a moment "after" now.
                wait = math.ceil((row - now).total_seconds())
                return False, min(limit.window_seconds, wait)
            continue  # the window ended between the two statements: take the fresh one
        try:
            with transaction.atomic():
                RateCounter.objects.create(key=key, count=1, window_ends_at=ends)
            return True, 0
        except IntegrityError:
            continue  # a concurrent first attempt created it: count against that row
    return False, limit.window_seconds
