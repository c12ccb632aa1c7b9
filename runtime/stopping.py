"""Stopping what does not listen. Cancellation is cooperative first (running work learns of it
from its heartbeat); a worker-run call that has not stopped ``CANCEL_GRACE_SECONDS`` after the
request is ended by its worker: the operation is settled for the receiver's contract (a pure
call is cancelled; a call that may have had an effect stays unresolved, for a person) and then
the worker's child process is terminated (a call in one of its slots is left to end, its report
refused, and the process goes on: runtime.slots). A completion that committed first wins: the
settling is fenced on the claim (generation, token, state version) like any acceptance."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from runtime.actors import execution_actor
from runtime.budgets import budget_mark_unknown_txn
from runtime.errors import StaleLease, TransitionRejected
from runtime.models import Invocation, Operation
from runtime.reactor import operation_settled_txn
from runtime.rules.statuses import OperationStatus
from runtime.stoprule import stop_asked, stop_covers, stop_target
from runtime.transitions.lease import lease_token_digest
from runtime.transitions.status import operation_transition_txn

S = OperationStatus
log = logging.getLogger(__name__)

OUTCOME_TERMINATED = "terminated"


def cancel_seen(operation_id: str, lease_generation: int) -> bool:
    """Whether the running call was asked to stop (read only: it extends no lease), by the rule
    the heartbeat answers with (``stoprule.stop_asked``): a compensation outlives its task's
    stop, so the watch never ends one for it."""
    row = (
        Operation.objects.filter(pk=operation_id, lease_generation=lease_generation)
        .values(
            "status", "cancel_requested", "compensates_id", "task__cancellation", "task__condition"
        )
        .first()
    )
    if row is None or row["status"] != S.RUNNING:
        return False
    return stop_asked(
        cancel_requested=bool(row["cancel_requested"]),
        covered=stop_covers(row["compensates_id"]),
        cancellation=row["task__cancellation"],
        condition=row["task__condition"],
    )


def operation_terminate(
    operation_id: str,
    *,
    lease_generation: int,
    lease_token: str,
    state_version: int,
    grace: float,
    now: datetime | None = None,
) -> bool:
    """Settle a running call that ignored its cancel; False when anything else came first (its
    own result, a takeover). Preconditions: the caller holds the claim; no transaction open."""
    now = now or timezone.now()
    with transaction.atomic():
        op = Operation.objects.select_related("task").filter(pk=operation_id).first()
        if op is None or op.status != S.RUNNING or op.state_version != state_version:
            return False
        # The call being ended is unconfirmed: the stop rule decides what it becomes.
        target = stop_target(op.tool, unconfirmed=True)
        pure = target == S.CANCELLED
        reason = f"ended by its worker: still running {grace:g}s after the cancel request" + (
            "" if pure else "; whether the receiver acted is unconfirmed"
        )
        try:
            transitioned = operation_transition_txn(
                op,
                target,
                now=now,
                fields={
                    "lease_expires_at": None,
                    "status_reason": reason,
                    "error": {"kind": "terminated", "message": reason},
                },
                lease_generation=lease_generation,
                where={"lease_token_digest": lease_token_digest(lease_token)},
                actor=execution_actor(op.execution_id),
                data={"reason": reason, "lease_generation": lease_generation},
                event_type="operation.terminated",
            )
        except (TransitionRejected, StaleLease):
            return False
        Invocation.objects.filter(
            operation=op, lease_generation=lease_generation, outcome__isnull=True
        ).update(outcome=OUTCOME_TERMINATED, finished_at=now)
        actor = execution_actor(op.execution_id)
        budget_mark_unknown_txn(budget=op.task.budget, op=op, actor=actor, now=now)
        operation_settled_txn(op, transitioned.task, now=now, actor=actor)
    return True


class CancelWatch:
    """Beside a worker-run call: polls (read only) for a cancel request; once the grace period
    passed since it saw one, settles the operation and terminates this process (``terminate``:
    a call in a slot is abandoned instead, runtime.slots).

    The polling is done by one thread per process (``_Watcher``), kept from call to call: a
    thread started for every call and joined after it cost two waits for the scheduler per
    operation (a quarter of a short call's time in the worker, under load). Leaving the block
    returns at once unless the watcher is acting (a poll or the settling) at that
    moment; then it waits for that act to end, as the join did, and the call is never acted
    for afterwards."""

    def __init__(
        self,
        *,
        operation_id: str,
        lease_generation: int,
        lease_token: str,
        state_version: int,
        terminate: Callable[[], None] | None = None,
    ) -> None:
        self.operation_id = operation_id
        self.lease_generation = lease_generation
        self.lease_token = lease_token
        self.state_version = state_version
        self.grace = float(settings.CANCEL_GRACE_SECONDS)
        self.poll = max(0.1, min(1.0, self.grace / 4))
        self._terminate = terminate or _terminate_this_process
        self.next_at = 0.0  # monotonic time of the next look (set on entry)
        self.seen_at: float | None = None
        self.left = False  # the call's block was left: nothing more is done for it

    def __enter__(self) -> CancelWatch:
        _watcher().begin(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _watcher().end(self)

    def act(self) -> bool:
        """One look, made by the watcher when ``next_at`` came: False once nothing is left to
        do for this call (it was settled, or the look failed)."""
        now = time.monotonic()
        if self.seen_at is None:
            if cancel_seen(self.operation_id, self.lease_generation):
                self.seen_at = now
            self.next_at = now + self.poll
            return True
        if now - self.seen_at < self.grace:
            self.next_at = now + self.poll
            return True
        ended = operation_terminate(
            self.operation_id,
            lease_generation=self.lease_generation,
            lease_token=self.lease_token,
            state_version=self.state_version,
            grace=self.grace,
        )
        if ended:
            log.warning(
                "operation %s ignored its cancel for %ss: settled by its worker",
                self.operation_id,
                self.grace,
            )
            connections.close_all()
            self._terminate()
        return False


class _Watcher:
    """The thread that makes every CancelWatch's looks in this process. The lock is held while
    it acts, so ``end`` waits for an act in flight and no act starts for a call whose block was
    left."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._watches: set[CancelWatch] = set()
        self._thread = threading.Thread(target=self._run, name="cancel-watch", daemon=True)
        self._thread.start()

    def begin(self, watch: CancelWatch) -> None:
        with self._lock:
            watch.next_at = time.monotonic() + watch.poll
            self._watches.add(watch)
            self._changed.notify()

    def end(self, watch: CancelWatch) -> None:
        # Marked first: no act starts for it from now on, even if the lock is not had in time
        # (a look stuck in the database: the call's thread goes on after 5 s, as the join did).
        watch.left = True
        if self._lock.acquire(timeout=5):
            try:
                self._watches.discard(watch)
            finally:
                self._lock.release()

    def _run(self) -> None:
        used = False  # whether this thread holds database connections to close
        with self._lock:
            while True:
                if not self._watches:
                    if used:
                        connections.close_all()
                        used = False
                    self._changed.wait()
                    continue
                self._watches -= {w for w in self._watches if w.left}
                if not self._watches:
                    continue
                watch = min(self._watches, key=lambda w: w.next_at)
                wait = watch.next_at - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                used = True
                try:
                    going = watch.act()
                except Exception:
                    log.exception("cancel watch of %s failed", watch.operation_id)
                    going = False
                if not going:
                    self._watches.discard(watch)


_watchers: dict[int, _Watcher] = {}
_watchers_lock = threading.Lock()


def _watcher() -> _Watcher:
    """This process's watcher (a forked child starts its own: threads do not survive a fork)."""
    pid = os.getpid()
    found = _watchers.get(pid)
    if found is None:
        with _watchers_lock:
            found = _watchers.get(pid)
            if found is None:
                _watchers.clear()
                found = _watchers[pid] = _Watcher()
    return found


def _terminate_this_process() -> None:
    # The call runs in this process's main thread and cannot be interrupted safely: the process
    # ends. Celery (acks_late + reject_on_worker_lost) redelivers the message, and the claim
    # finds the operation settled. (A call in a slot is left instead: runtime.slots.)
    log.warning("ending this worker process")
    os.kill(os.getpid(), signal.SIGKILL)
