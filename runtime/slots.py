"""Slots: a worker process runs up to TOOL_SLOTS calls of tools that wait (``io_bound``, or an
``async def`` invoke: runtime.tools.base.waits) side by side, each under its own lease. A call
that waits on the network for a second held a whole process for that second; in a slot it
holds a thread, and the process takes the next message at once.

Why this design (the fewest new paths): the Celery task claims the call exactly as every
delivery does (runtime.executor: admission, the version check, the dedupe and the fencing token
are the claim's), and only then hands the claimed call to a slot, which makes it and reports it
through the delivery's own functions (the cancel watch, the heartbeat, the fenced acceptance).
The Celery task returns once the claim has committed, so its message is acknowledged then: the
database is the record of the claim, and a process killed with calls in its slots loses their
leases, which the sweeper takes over as it takes over any killed worker's (a redelivered
message would only find the call running and refuse it: recovery never relied on it). The
alternative, a thread in each worker process claiming slow calls from the database or from the
drainers' lists, would be a second way to announce, claim and dedupe work.

- Threads: the standard library's ThreadPoolExecutor, TOOL_SLOTS threads at most, started as
  calls come. An ``async def`` tool runs in an event loop of its slot's own (``awaited``): the
  slot is its thread either way, and one kind of slot keeps one way of cancelling and counting.
- Back-pressure: ``slot_reserve`` never waits. With every slot taken, the call is made in the
  Celery task as before, so the process takes no other message until it ends.
- Database connections: PostgreSQL's max_connections is shared by every process, and a slot
  waits far longer than it writes. A slot thread's connection comes from a small pool of the
  process's (TOOL_SLOT_DB_POOL connections, psycopg_pool through Django's pooling) and goes
  back after each step that wrote (the report; ``connection_release`` for a tool's own
  statements), so a slot holds one only while it writes. A heartbeat takes one from that pool
  for its statement from whatever thread calls it (``db_step``: a tool may heartbeat from a
  thread of its own while its request blocks). (The embedded mode's SQLite connection is a
  file: closed after each step likewise.)
- Heartbeats are the tool's, as for any call (``ctx.heartbeat()``): a process-wide loop that
  kept every slot's lease alive would also keep a hung call's lease for ever, where a lapsed
  lease hands the call to the sweeper and its attempts run out.
- Cancellation: the process's one cancel watch covers every slot (a CancelWatch per call, as
  for any call). A call that ignores its cancel past CANCEL_GRACE_SECONDS is settled by the
  same fenced writer as any other; then an async call is cancelled in its loop, while a
  thread's call, which nothing interrupts safely, is left to end: its report is refused by
  fencing (the state version moved) and its slot stays taken until then. The process is not
  ended for it, as a call made outside a slot ends its process: that would end every other
  slot's call with it.
- Only worker processes have slots (``slots_start`` at worker_process_init): in any other
  process (a test, a script) a delivery makes its call in the calling thread."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

from runtime import dialect
from runtime.db import outside_transaction
from runtime.tools.base import ToolFailure
from runtime.tracing import tracing_enabled

log = logging.getLogger(__name__)

T = TypeVar("T")

# The alias of the slot threads' pooled connections (Django keeps one pool per alias).
SLOT_ALIAS = "tool-slots"


class Slot:
    """One place in the process's pool, reserved by ``slot_reserve``: ``run`` hands it a call.
    The place is given back when the call's function returns (or raises)."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.abandoned = False

    def run(self, fn: Callable[..., object], *args: object) -> bool:
        """Make ``fn(*args)`` in this slot's thread; returns at once. False when the pool
        cannot take it (stopped meanwhile, or broken): the place is given back, and the caller
        makes the call itself."""
        try:
            if tracing_enabled():
                # The call's spans continue its delivery's trace (context variables stay in
                # the thread that set them).
                self.pool.executor.submit(contextvars.copy_context().run, self._body, fn, args)
            else:
                self.pool.executor.submit(self._body, fn, args)
        except RuntimeError:
            log.warning("the slots took no call", exc_info=True)
            self.pool.release(self)
            return False
        return True

    def _body(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        _local.slot = self
        try:
            fn(*args)
        except Exception:
            # The call's lease lapses and the sweeper takes it over, as for a killed worker.
            log.exception("a call in a slot failed before its report")
        finally:
            _local.slot = None
            connections.close_all()  # nothing held between calls
            self.pool.release(self)

    def abandon(self) -> None:
        """The cancel watch settled this call after its grace period (runtime.stopping): an
        async call is cancelled in its loop; a thread's call is left to end on its own (its
        report will be refused)."""
        with self._lock:
            self.abandoned = True
            loop, task = self._loop, self._task
        self.pool.abandoned(self)
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)
            log.warning("a call in a slot ignored its cancel: its coroutine is cancelled")
        else:
            log.warning(
                "a call in a slot ignored its cancel: it was settled, and its thread's late "
                "report will be refused"
            )

    def _running(self, loop: asyncio.AbstractEventLoop | None, task: Any) -> bool:
        """Record the coroutine in flight; False when the call was abandoned already."""
        with self._lock:
            self._loop, self._task = loop, task
            return not self.abandoned


class _Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.executor = ThreadPoolExecutor(
            max_workers=size, thread_name_prefix="tool-slot", initializer=_thread_started
        )
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.busy = 0
        # Calls settled by the cancel watch that go on in their threads: nothing waits for them.
        self.left: set[Slot] = set()

    def reserve(self) -> Slot | None:
        with self._lock:
            if self.busy >= self.size:
                return None
            self.busy += 1
        return Slot(self)

    def release(self, slot: Slot) -> None:
        with self._lock:
            self.busy -= 1
            self.left.discard(slot)
            self._idle.notify_all()

    def abandoned(self, slot: Slot) -> None:
        with self._lock:
            self.left.add(slot)
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no slot holds a call that is still to be reported (an abandoned call's
        report would be refused: nothing waits for it)."""
        with self._lock:
            return self._idle.wait_for(lambda: self.busy - len(self.left) <= 0, timeout)


_local = threading.local()
_pools: dict[int, _Pool] = {}
_pools_lock = threading.Lock()


def slots_start() -> None:
    """Give this process its slots (a worker process, at start; TOOL_SLOTS=0: none)."""
    size = int(settings.TOOL_SLOTS)
    with _pools_lock:
        _pools.clear()  # a forked child never uses its parent's threads
        if size > 0:
            _pools[os.getpid()] = _Pool(size)


def slot_reserve() -> Slot | None:
    """A free slot of this process, or None: no slots here (not a worker process), or every
    one is taken. Never waits."""
    pool = _pools.get(os.getpid())
    return pool.reserve() if pool is not None else None


def slots_busy() -> int:
    """How many of this process's slots hold a call."""
    pool = _pools.get(os.getpid())
    return pool.busy if pool is not None else 0


def slots_stop(timeout: float) -> bool:
    """The process is going away: wait up to ``timeout`` seconds for the calls in its slots to
    be reported (a call still running then loses its lease to the sweeper; a call the cancel
    watch settled and left is not waited for), then close the slots' database pool. True when
    no call was left to report."""
    with _pools_lock:
        pool = _pools.pop(os.getpid(), None)
    if pool is None:
        return True
    idle = pool.wait_idle(timeout)
    if not idle:
        log.warning("%d call(s) still in slots at shutdown: their leases will lapse", pool.busy)
    pool.executor.shutdown(wait=False, cancel_futures=True)
    if idle:
        _database_pool_close()
    return idle


def in_slot() -> bool:
    """Whether this thread is making a slot's call."""
    return getattr(_local, "slot", None) is not None


def connection_release() -> None:
    """In a slot's thread: give its database connection back (to the slots' pool), so the slot
    holds none while its call waits. Elsewhere: nothing (a Celery thread keeps its persistent
    connection). A tool whose receiver it reaches through the console's database (the demo
    tools) calls it before it waits. Preconditions: no transaction is open, as for any tool's
    call (TransactionOpen otherwise)."""
    if in_slot():
        outside_transaction("giving a slot's connection back")
        connections[DEFAULT_DB_ALIAS].close()


@contextmanager
def db_step() -> Iterator[None]:
    """One database step of a call made in this process's slots (a heartbeat), from whatever
    thread makes it: a slot's own, or one its tool started to heartbeat while it waits. Its
    connection comes from the slots' pool and goes back at the end, so no thread of a slot's
    call holds a connection while the call waits. The Celery thread (a call made outside the
    slots), and a process without slots, keep their own connection."""
    if in_slot():
        try:
            yield
        finally:
            connection_release()
        return
    outside = threading.current_thread() is threading.main_thread() or not slots_busy()
    pooled = None if outside else _pooled_wrapper()
    if pooled is None:
        yield
        return
    own = connections[DEFAULT_DB_ALIAS]
    connections[DEFAULT_DB_ALIAS] = pooled
    try:
        yield
    finally:
        pooled.close()
        connections[DEFAULT_DB_ALIAS] = own


def awaited(value: T | Awaitable[T]) -> T:
    """``value``, or what it resolves to when it is awaitable (an ``async def`` tool's call),
    run to its end in an event loop of this thread's own. In a slot, a cancel that the call
    ignored past its grace period cancels it there: the call then ends as ToolFailure unknown
    (it was settled already; its report is refused)."""
    if not inspect.isawaitable(value):
        return value
    slot: Slot | None = getattr(_local, "slot", None)
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(_resolved(value))
        if slot is not None and not slot._running(loop, task):
            task.cancel()
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise ToolFailure(ToolFailure.UNKNOWN, "cancelled by its worker") from None
    finally:
        if slot is not None:
            slot._running(None, None)
        loop.close()


async def _resolved(value: Awaitable[T]) -> T:
    return await value


def _thread_started() -> None:
    """A slot thread's default database connection is a pooled one (PostgreSQL)."""
    pooled = _pooled_wrapper()
    if pooled is not None:
        connections[DEFAULT_DB_ALIAS] = pooled


def _pooled_wrapper() -> BaseDatabaseWrapper | None:
    """A database wrapper whose connections come from the slots' pool (Django keeps one pool
    per alias and process); None where the database has no pooling (SQLite)."""
    if not dialect.connection_pool(connections[DEFAULT_DB_ALIAS]):
        return None
    conf = dict(connections.settings[DEFAULT_DB_ALIAS])
    conf["CONN_MAX_AGE"] = 0  # Django's pooling requires it
    conf["OPTIONS"] = {
        **conf.get("OPTIONS", {}),
        "pool": {
            "min_size": 1,
            "max_size": max(1, int(settings.TOOL_SLOT_DB_POOL)),
            "timeout": 30,
            "name": SLOT_ALIAS,
        },
    }
    wrapper: BaseDatabaseWrapper = load_backend(conf["ENGINE"]).DatabaseWrapper(conf, SLOT_ALIAS)
    return wrapper


def _database_pool_close() -> None:
    backend = load_backend(connections.settings[DEFAULT_DB_ALIAS]["ENGINE"])
    pools = getattr(backend.DatabaseWrapper, "_connection_pools", {})
    pool = pools.pop(SLOT_ALIAS, None)
    if pool is not None:
        pool.close()
