"""Drainers: under a backlog, one worker process per queue (and the helpers it asks for) runs
the queue's new calls without a Celery message each (``runtime.executor.queue_drain``): quick
calls in batches, the others one at a time through the one-operation path.

A drainer registers in Redis (a sorted set per queue, scored by when its registration lapses).
A proposal, once committed, asks Redis in one script: if a drainer is registered for its
queue, the operation's id goes onto one of the queue's drain lists (quick calls' or the list of
calls run one at a time) and no Celery message is published; otherwise the message is
published as always. The drainer takes the quick calls' ids in batches and claims them
together, and the others one by one, each claimed, run and accepted alone as a Celery delivery
would (``runtime.executor.operation_execute``). Nothing is lost by this:

- the script is atomic, and a drainer leaves the set before it takes the lists' last ids: an
  id pushed while it was registered is taken by it; after it left, proposals publish;
- the operation's outbox row, written in the proposal's transaction, stays the record: an id
  lost with Redis, or left on a list by a drainer killed while registered (its registration
  lapses after DRAIN_LEASE_SECONDS), is announced again by the sweeper once no claim consumed
  the row within OUTBOX_GRACE_SECONDS (a list counts as waiting only while a drainer is
  registered); Redis unreachable reads as "no drainer";
- every id a batch does not claim (a paused or stopping task, a deadline passed, another
  claimant first) runs the one-operation path, which settles or refuses it.

A worker starts draining only after it ran a call a drainer may take, and only when messages
wait for the queue in the broker (a backlog of DRAIN_BACKLOG or more); at a load the workers
keep up with, every call keeps its own message and its lowest latency. Only calls a tool
declares quick (``ToolAdapter.quick``: milliseconds, in this process) are batched: a batch runs
its calls one after another under leases taken together, so a slow call would hold the others'
leases. Calls of a tool class with a concurrency limit are never left to a drainer (their claim
waits for a slot), nor calls of a tool that waits (runtime.slots: each has its own message, and
the worker that claims it makes it side by side with others instead of one after another)."""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from runtime import dialect
from runtime.admission import tool_class_of
from runtime.tools import ToolAdapter, adapters
from runtime.tools.base import waits

log = logging.getLogger(__name__)

_KEY = "drainers:{queue}"
_LIST = "drain:{queue}"
# Calls a drainer takes one at a time (each through the one-operation path): those not quick.
_SINGLES = "drain1:{queue}"
# KEYS: the queue's drainer set, its drain list; ARGV: now, the operation id.
_ANNOUNCE = """
if redis.call('ZCOUNT', KEYS[1], ARGV[1], '+inf') > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
# The same look, and when no drainer takes the call, its Celery message pushed where the Redis
# transport would push it (runtime.publish.message_now): one round trip either way.
# KEYS: the drainer set, the drain list, the broker's queue list; ARGV: now, the operation id,
# the message, whether a drainer may take the call ('1' or '').
_ANNOUNCE_OR_PUSH = """
if ARGV[4] == '1' and redis.call('ZCOUNT', KEYS[1], ARGV[1], '+inf') > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
redis.call('LPUSH', KEYS[3], ARGV[3])
return 2
"""
_clients: dict[int, Any] = {}
_scripts: dict[tuple[int, str], Any] = {}


def draining_enabled() -> bool:
    """Batches need the one-statement forms (``dialect.one_statement_forms``) and a Redis
    registry; DRAIN_BATCH=0 turns them off (every call then has its own message, as in the
    embedded mode)."""
    return (
        int(settings.DRAIN_BATCH) > 0 and bool(settings.REDIS_URL) and dialect.one_statement_forms()
    )


def queue_of(tool: str) -> str:
    """The Celery queue a tool's calls are announced on (TOOL_QUEUES, else the default)."""
    return settings.TOOL_QUEUES.get(tool_class_of(tool)) or settings.CELERY_QUEUE


def _drainable(tool: str, adapter: ToolAdapter) -> bool:
    """A tool whose calls can be quick, of a class without a concurrency limit (a batch claim
    takes no slot), that does not wait (a call that waits is never quick)."""
    return (
        adapter.quick_calls
        and not waits(adapter)
        and tool_class_of(tool) not in settings.TOOL_CONCURRENCY
    )


def call_quick(tool: str, params: dict[str, Any]) -> bool:
    """Whether a drainer may take this call: its tool is drainable and says this call is quick,
    and batches are on."""
    adapter = adapters().get(tool)
    return (
        adapter is not None
        and _drainable(tool, adapter)
        and adapter.quick(params)
        and draining_enabled()
    )


def call_drained_singly(tool: str, kind: str) -> bool:
    """Whether a drainer may take this call one at a time, through the one-operation path, when
    it is not quick: a tool call of a class without a concurrency limit (whose claim would wait
    for a slot), with batches on. Never a call of a tool that waits: each has its own message,
    and the worker that claims it makes it in a slot (runtime.slots), where a drainer would
    make its calls one after another."""
    adapter = adapters().get(tool)
    return (
        kind == "tool"
        and adapter is not None
        and not waits(adapter)
        and tool_class_of(tool) not in settings.TOOL_CONCURRENCY
        and draining_enabled()
    )


def drainable_tools(queue: str) -> list[str]:
    """``tool:version`` of every drainable tool announced on ``queue`` that this worker runs
    (what a drainer of that queue may claim)."""
    return [
        f"{name}:{version}"
        for name, adapter in adapters().items()
        if _drainable(name, adapter) and queue_of(name) == queue
        for version in adapter.supported_versions
    ]


def _redis() -> Any:

    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        _clients.clear()
        client = _clients[pid] = redis.Redis.from_url(
            str(settings.REDIS_URL), socket_timeout=2, socket_connect_timeout=2
        )
    return client


def _script(source: str) -> Any:
    """A script of this module, sent by its digest (EVALSHA; redis-py loads it again should the
    server have lost it)."""
    client = _redis()
    script = _scripts.get((id(client), source))
    if script is None:
        if any(key[0] != id(client) for key in _scripts):
            _scripts.clear()
        script = _scripts[(id(client), source)] = client.register_script(source)
    return script


def drain_announce(queue: str, operation_id: str, *, single: bool = False) -> bool:
    """After the proposal's commit: leave the call to ``queue``'s drainer if one is registered
    (True: its id is on the drain list, or with ``single`` on the list of calls taken one at a
    time), else False (the caller publishes its message)."""
    try:
        key = _KEY.format(queue=queue)
        items = (_SINGLES if single else _LIST).format(queue=queue)
        return bool(_script(_ANNOUNCE)(keys=[key, items], args=[time.time(), operation_id]))
    except Exception:
        log.warning("drainer registry unreachable; publishing", exc_info=True)
        return False


def announce_or_push(
    operation_id: str, message: tuple[str, bytes], *, drained: bool, single: bool = False
) -> str | None:
    """After the proposal's commit, in one round trip: leave the call to its queue's drainer
    (when ``drained``: a drainer may take it) if one is registered, as drain_announce does
    ("drained"), else push ``message`` (runtime.publish.message_now: its broker list, the
    queue's, and its bytes; "pushed"). None when Redis failed: the caller publishes through
    Celery, whose failure the sweeper covers."""
    queue, payload = message
    try:
        key = _KEY.format(queue=queue)
        items = (_SINGLES if single else _LIST).format(queue=queue)
        args = [time.time(), operation_id, payload, "1" if drained else ""]
        way = _script(_ANNOUNCE_OR_PUSH)(keys=[key, items, queue], args=args)
    except Exception:
        log.warning("broker unreachable; publishing through Celery", exc_info=True)
        return None
    return "drained" if int(way) == 1 else "pushed"


@dataclass(frozen=True)
class Taken:
    """One look at a queue's drain lists: up to the limit of quick calls' ids (a batch), the
    oldest call to run alone, and how many calls to run alone stay after it."""

    batch: list[str]
    single: str | None
    singles_left: int


def drain_take(queue: str, limit: int) -> Taken:
    """Take from ``queue``'s drain lists, oldest first, in one round trip (nothing when Redis
    fails: the sweeper announces what the lists held)."""
    try:
        pipe = _redis().pipeline(transaction=False)
        pipe.lpop(_LIST.format(queue=queue), limit)
        pipe.lpop(_SINGLES.format(queue=queue))
        pipe.llen(_SINGLES.format(queue=queue))
        batch, single, left = pipe.execute()
    except Exception:
        log.warning("drain lists unreadable", exc_info=True)
        return Taken([], None, 0)
    return Taken([_text(i) for i in batch or []], _text(single) if single else None, int(left))


def drain_wait(queue: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for an id on either of ``queue``'s drain lists; True when
    one arrived (it is put back at the head of its list, for drain_take). Sleeps out the
    timeout when Redis fails."""
    try:
        client = _redis()
        got = client.blpop([_SINGLES.format(queue=queue), _LIST.format(queue=queue)], timeout)
        if got is None:
            return False
        client.lpush(got[0], got[1])
    except Exception:
        log.warning("drain lists unreadable", exc_info=True)
        time.sleep(timeout)
        return False
    return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def queues_waiting(queues: list[str]) -> dict[str, int]:
    """How many announcements wait for each queue in Redis: its broker list, and its drain
    lists while a drainer is registered to take them (ids a killed drainer left there wait for
    nobody). One round trip; raises what Redis raised."""
    now = time.time()
    pipe = _redis().pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
        pipe.llen(_LIST.format(queue=queue))
        pipe.llen(_SINGLES.format(queue=queue))
        pipe.zcount(_KEY.format(queue=queue), now, "+inf")
    replies = [int(r) for r in pipe.execute()]
    waiting = {}
    for i, queue in enumerate(queues):
        broker, batched, single, drainers = replies[4 * i : 4 * i + 4]
        waiting[queue] = broker + (batched + single if drainers else 0)
    return waiting


def drainer_wanted(queue: str) -> bool:
    """Whether ``queue`` needs one more drainer: DRAIN_BACKLOG or more messages wait for it in
    the broker (the Redis transport keeps a queue's messages in a list named after it) and
    fewer than DRAINERS_PER_QUEUE are registered. One round trip, made after every delivery;
    False when Redis cannot say."""
    try:
        pipe = _redis().pipeline(transaction=False)
        pipe.llen(queue)
        pipe.zcount(_KEY.format(queue=queue), time.time(), "+inf")
        backlog, live = pipe.execute()
    except Exception:
        log.warning("drainer registry unreadable", exc_info=True)
        return False
    return int(backlog) >= int(settings.DRAIN_BACKLOG) and int(live) < int(
        settings.DRAINERS_PER_QUEUE
    )


# KEYS[1] the registry; ARGV: now, the entry's expiry, the member, the cap (-1: none). Lapsed
# entries (killed drainers) are dropped first, so they do not hold places.
_JOIN = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
local cap = tonumber(ARGV[4])
if cap >= 0 and redis.call('zcard', KEYS[1]) >= cap then return 0 end
redis.call('zadd', KEYS[1], ARGV[2], ARGV[3])
return 1
"""


class Registration:
    """One drainer's entry in its queue's set, renewed as it works. ``leave`` must come
    before the drainer's last look for work (see the module's note)."""

    def __init__(self, queue: str) -> None:
        self.key = _KEY.format(queue=queue)
        self.member = f"{os.getpid()}:{uuid.uuid4().hex}"
        self.registered = False
        self.renewed_at = 0.0

    def join(self, cap: int | None) -> bool:
        """Register as one more drainer, unless ``cap`` (None: no cap, a drainer asked for) live
        ones are registered already: the count and the entry in one step on the server (a
        script), so two workers that both saw a backlog cannot both join past the cap. False
        when it did not join, or Redis failed."""
        now = time.time()
        try:
            joined = _redis().eval(
                _JOIN,
                1,
                self.key,
                now,
                now + float(settings.DRAIN_LEASE_SECONDS),
                self.member,
                -1 if cap is None else cap,
            )
        except Exception:
            log.warning("drainer could not register", exc_info=True)
            return False
        self.registered = bool(joined)
        self.renewed_at = now
        return self.registered

    def renew_due(self) -> bool:
        """Renew once a fifth of DRAIN_LEASE_SECONDS passed since the last renewal (a drainer
        looks for work after every call: renewing each time was a round trip per call)."""
        if (
            self.registered
            and time.time() - self.renewed_at < float(settings.DRAIN_LEASE_SECONDS) / 5
        ):
            return True
        return self.renew()

    def renew(self) -> bool:
        """Register (or extend) until DRAIN_LEASE_SECONDS from now; False when Redis failed
        (the drainer then works unregistered: proposals keep publishing)."""
        now = time.time()
        try:
            pipe = _redis().pipeline(transaction=False)
            pipe.zadd(self.key, {self.member: now + float(settings.DRAIN_LEASE_SECONDS)})
            # Lapsed entries of killed drainers are dropped on the way.
            pipe.zremrangebyscore(self.key, "-inf", now)
            pipe.execute()
        except Exception:
            log.warning("drainer could not register", exc_info=True)
            self.registered = False
            return False
        self.registered = True
        self.renewed_at = now
        return True

    def leave(self) -> None:
        if not self.registered:
            return
        self.registered = False
        try:
            _redis().zrem(self.key, self.member)
        except Exception:
            # The entry lapses by itself; until then proposals rely on the sweeper.
            log.warning("drainer could not leave the registry", exc_info=True)
