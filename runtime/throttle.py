"""Per-token request rate of the API: an agent calling in a loop is refused once it goes past its
token's rate, while honest parallel calls are never refused for being parallel.

The limit is GCRA (the generic cell rate algorithm: a leaky bucket kept as one time per token).
The token's theoretical arrival time (TAT) moves ``1 / API_RATE_PER_SECOND`` seconds forward
with each request admitted; a request is admitted while the TAT stands at most
``(API_RATE_BURST - 1) / API_RATE_PER_SECOND`` seconds after now. So a token may send a burst
of API_RATE_BURST requests at once, and API_RATE_PER_SECOND a second sustained. Requests are
counted as they arrive, never while in flight: how many run at once does not matter (the
lock-out of parallel calls cannot return), only how many arrived. A refused request does not
move the TAT (it spends nothing), so a client that waits its Retry-After gets in, and a loop
that keeps knocking does not push its own wait further.

Own code on this package's counters (runtime.ratelimits: its ``clock()``, Redis with the
database as fallback) rather than a library: redis-py has no limiter; DRF's throttles read,
then write, so concurrent requests get past them; pyrate-limiter (here only as schemathesis's
dependency) has a GCRA in Lua, but declares that layer internal in its version 4, keeps a
bucket's last verdict on the bucket object (not shareable between request threads), has no
store on Django's database for the embedded mode, and reads its own clock. The algorithm
itself is a dozen lines.

Redis: one key per token holding the TAT in integer microseconds (exact in Lua's doubles, as
fractional milliseconds added to an epoch time are not), read and moved by one Lua script; the
key expires a minute after its TAT has passed. Database (embedded mode, or while Redis is
away): the TAT in a ``RateCounter`` row's ``window_ends_at``, moved by a guarded UPDATE. Either
way, of N requests arriving at one moment exactly API_RATE_BURST are admitted, whatever N.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Greatest

from runtime import ratelimits
from runtime.models import RateCounter
from runtime.ratelimits import RateLimited

KEY_NAME = "api-rate"


@dataclass(frozen=True)
class TokenRate:
    """``per_second`` requests a second sustained, ``burst`` at once."""

    per_second: float
    burst: int

    @property
    def emission_us(self) -> int:
        """Microseconds each request moves the TAT; rounded up, so a rate that does not divide
        a second evenly errs on the strict side."""
        return max(1, math.ceil(1_000_000 / self.per_second))

    @property
    def tolerance_us(self) -> int:
        """How far after now the TAT may stand for a request to be admitted."""
        return (self.burst - 1) * self.emission_us


def token_rate() -> TokenRate | None:
    """The configured rate (API_RATE_PER_SECOND, API_RATE_BURST); None when either is 0 (off)."""
    per_second = float(settings.API_RATE_PER_SECOND)
    burst = int(settings.API_RATE_BURST)
    if per_second <= 0 or burst <= 0:
        return None
    return TokenRate(per_second, burst)


def token_throttle(token_id: str, *, backend: str | None = None, now: float | None = None) -> None:
    """Count one request made with the token ``token_id``; RateLimited (429 with Retry-After,
    counting nothing) when it comes faster than the token's rate allows.

    Preconditions: the token was verified (a bad one is the failure limits' business), and this
    runs once per request, before the request reads its body or does any work. Safe under any
    concurrency."""
    rate = token_rate()
    if rate is None:
        return
    at = ratelimits.clock() if now is None else now
    key = f"{ratelimits.KEY_PREFIX}:{KEY_NAME}:{token_id}"
    client = ratelimits.redis_or_none(backend)
    if client is not None:
        args = [round(at * 1_000_000), rate.emission_us, rate.tolerance_us, _EXPIRY_MARGIN_MS]
        try:
            wait_us = int(_script(client)(keys=[key], args=args))
        except Exception:
            ratelimits.redis_failed()
        else:
            if wait_us > 0:
                raise _refuse(wait_us / 1_000_000)
            return
    wait = _db_admit(key, rate, datetime.fromtimestamp(at, tz=UTC))
    if wait is not None:
        raise _refuse(wait)


def _refuse(seconds: float) -> RateLimited:
    wait = max(1, math.ceil(seconds))
    return RateLimited(
        f"too many requests with this token; try again in {wait} s", retry_after=wait
    )


# --- Redis --------------------------------------------------------------------------------

# KEYS: the token's key. ARGV: now, emission interval, tolerance (microseconds), the expiry's
# margin (ms). Returns 0 when admitted (the TAT moved), else the microseconds until a request
# would be (nothing moved).
_GCRA = """
local now = tonumber(ARGV[1])
local emission = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local wait = tat - tolerance - now
if wait > 0 then return wait end
tat = tat + emission
-- %.0f: Lua's own number formatting keeps 14 digits, too few for epoch microseconds.
redis.call('SET', KEYS[1], string.format('%.0f', tat),
  'PX', string.format('%.0f', math.ceil((tat - now) / 1000) + tonumber(ARGV[4])))
return 0
"""
# The key outlives its TAT by this long (ms): the time is each web process's own clock, and one
# a moment behind must still find the TAT that another process moved.
_EXPIRY_MARGIN_MS = 60_000


@functools.lru_cache(maxsize=4)
def _script(client: Any) -> Any:
    # EVALSHA with the script's digest (computed here, not asked of Redis), sending the script
    # itself only when Redis does not know it (after a restart).
    return client.register_script(_GCRA)


# --- database -----------------------------------------------------------------------------


def _db_admit(key: str, rate: TokenRate, now: datetime) -> float | None:
    """Admit one request by one guarded UPDATE of the token's TAT (one statement whether the
    token was idle or busy); the seconds to wait when it is refused, else None. PostgreSQL
    re-evaluates the guard, and the new TAT, on the row a concurrent UPDATE just changed, and
    SQLite runs one writer at a time, so the burst's last place goes to exactly one request."""
    step = timedelta(microseconds=rate.emission_us)
    tolerance = timedelta(microseconds=rate.tolerance_us)
    counters = RateCounter.objects.filter(key=key)
    for _ in range(3):
        if counters.filter(window_ends_at__lte=now + tolerance).update(
            window_ends_at=Greatest(F("window_ends_at"), Value(now, DateTimeField())) + step
        ):
            return None
        tat = counters.values_list("window_ends_at", flat=True).first()
        if tat is not None:
            if tat > now + tolerance:
                return (tat - tolerance - now).total_seconds()
            continue  # a first request created it between the statements: decide again
        try:
            with transaction.atomic():
                RateCounter.objects.create(key=key, count=0, window_ends_at=now + step)
            return None
        except IntegrityError:
            continue  # a concurrent first request created it: take a place in that row
    return rate.emission_us / 1_000_000
