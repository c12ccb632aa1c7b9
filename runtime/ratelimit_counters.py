"""The two shapes of a brute-force limit (runtime.ratelimits) and how a failure is counted
atomically with its decision: one Lua script in Redis per entry, guarded or compare-and-set
UPDATEs of ``RateCounter`` rows in the database (embedded mode, or while Redis is away)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F

from runtime.models import RateCounter


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


# One failure per key (ARGV: window and limit per key, in order). Each increment and its
# window's start are one step: a crash between INCR and EXPIRE cannot leave a counter that
# never expires. Over: the longest wait among the keys over their limit.
REDIS_COUNT_ALL = """
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
REDIS_BACKOFF_FAIL = """
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


def db_take(key: str, limit: Limit, now: datetime) -> float | None:
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


def db_backoff_fail(key: str, backoff: Backoff, now: datetime) -> float | None:
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
