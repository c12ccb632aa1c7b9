"""Real concurrency for race tests: threads with their own database connections, gates that
stop one thread exactly at a named crash point, and PostgreSQL's own view of who waits for a
lock (pg_stat_activity), as Absurd's lock-order tests do. Never a sleep to order events."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from django.db import connection, connections

from runtime.crashpoints import crash_point_installed
from tests.conftest import wait_for


def in_thread(fn: Callable[[], Any], name: str = "racer") -> tuple[threading.Thread, Future[Any]]:
    """Run ``fn`` in a new thread (its own database connection, closed at the end); the future
    carries its result or its exception."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, future


class Gate:
    """Stops the threads it is told to stop (by name) when they reach a crash point, until
    released; every other thread passes."""

    def __init__(self, *thread_names: str) -> None:
        self.names = set(thread_names)
        self.reached = threading.Event()
        self.released = threading.Event()

    def __call__(self) -> None:
        if threading.current_thread().name in self.names:
            self.reached.set()
            if not self.released.wait(timeout=60):
                raise AssertionError("a gate was never released")

    def release(self) -> None:
        self.released.set()


@contextmanager
def gate_at(point: str, *thread_names: str) -> Iterator[Gate]:
    gate = Gate(*thread_names)
    with crash_point_installed(point, gate):
        try:
            yield gate
        finally:
            gate.release()


@contextmanager
def barrier_at(point: str, parties: int) -> Iterator[threading.Barrier]:
    """Every thread reaching ``point`` waits there until ``parties`` threads have, so they all
    go on into the window together. Fails the test when, by the end of the block, fewer than
    ``parties`` threads crossed the barrier: the window was then never forced (a renamed or
    unreached point would otherwise pass silently). Threads started in the block must be joined
    in it."""
    barrier = threading.Barrier(parties, timeout=30)
    crossed: list[str] = []
    reached: list[str] = []
    lock = threading.Lock()

    def meet() -> None:
        if threading.current_thread() is not threading.main_thread():
            with lock:
                reached.append(threading.current_thread().name)
            barrier.wait()
            with lock:
                crossed.append(threading.current_thread().name)

    with crash_point_installed(point, meet):
        yield barrier
    if len(crossed) < parties:
        # Which threads got to the point tells a renamed point (none) from a thread that failed
        # or blocked before it (the others waited out the barrier's timeout).
        raise AssertionError(
            f"{len(crossed)} of {parties} threads crossed the barrier at {point!r} "
            f"(reached by {sorted(reached) or 'none'}): the window was never forced"
        )


def lock_waiters() -> int:
    """Backends of this database now waiting for a lock (a row lock shows as a transaction or
    tuple lock)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


def wait_until_blocked_on_a_lock(what: str) -> None:
    wait_for(lambda: lock_waiters() >= 1, timeout=30, what=what)
