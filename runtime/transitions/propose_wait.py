"""The proposal of a durable wait: a signal wait (``kind: wait_signal``) or a timer
(``kind: timer``), an operation row with a deadline (``wait_until``), inserted through
``operation_insert_txn`` (runtime.transitions.insert) and woken by the sweeper or, for a signal,
by its arrival (``wait_satisfy_txn``); never by a process-local sleep. The services on waits
(waking, renewing, transforming) are ``runtime.waits``'s."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.attempts import attempt_bound, attempt_unmoved_txn
from runtime.crashpoints import crash_point
from runtime.errors import (
    IdempotencyKeyReused,
    InvalidInput,
    NotFound,
    TaskRefused,
)
from runtime.hashing import params_hash
from runtime.keys import key_step
from runtime.models import Operation, Signal, Task
from runtime.policy import can_propose, task_scope
from runtime.publish import WAKE_WAIT, publish
from runtime.rules.admission import task_admission_check
from runtime.rules.statuses import OperationStatus
from runtime.specs import OperationSpec
from runtime.tasks import (
    given_key_validate,
    operation_by_legacy_key,
    operation_key,
    within_task_deadline,
)
from runtime.text import name_check
from runtime.transitions.insert import operation_insert_txn
from runtime.transitions.status import operation_transition_txn

log = logging.getLogger(__name__)
S = OperationStatus
MAX_WAIT_SECONDS = 366 * 24 * 3600
DEFAULT_SIGNAL_WAIT_SECONDS = 24 * 3600


def _validate(spec: OperationSpec) -> int:
    if spec.tool:
        raise InvalidInput(f"a {spec.kind} operation takes no tool")
    if not spec.step or len(spec.step) > 200:
        raise InvalidInput("step is required (at most 200 characters)")
    name_check(spec.step, "step")
    if spec.intent_version < 1:
        raise InvalidInput("intent_version must be at least 1")
    if spec.executor != Operation.EXECUTOR_WORKER:
        raise InvalidInput("waits are kept by the runtime, not executed by an agent")
    if spec.idempotency_key is not None and not (0 < len(spec.idempotency_key) <= 300):
        raise InvalidInput("idempotency_key must have 1 to 300 characters")
    given_key_validate(spec.idempotency_key)
    if spec.kind == Operation.KIND_WAIT_SIGNAL and not spec.signal:
        raise InvalidInput("a wait_signal operation needs signal (the name it waits for)")
    if spec.kind == Operation.KIND_TIMER and spec.timeout_seconds is None:
        raise InvalidInput("a timer needs timeout_seconds")
    seconds = spec.timeout_seconds or DEFAULT_SIGNAL_WAIT_SECONDS
    if not 1 <= seconds <= MAX_WAIT_SECONDS:
        raise InvalidInput(f"timeout_seconds must be between 1 and {MAX_WAIT_SECONDS}")
    return seconds


def wait_propose(actor: Actor, task_id: str, spec: OperationSpec) -> tuple[Operation, bool]:
    """Register a durable wait; returns (operation, created) with the proposal's idempotency rules.
    A signal wait consumes, in the same transaction, the oldest buffered signal of its name.

    Both this and ``runtime.signals.signal_send`` read the other's rows only after taking the
    task's row lock, so a signal that arrives while the wait is being registered is either seen
    here (buffered) or sees the wait there (delivered), never neither. Like a tool operation, the
    wait binds to the attempt read under that lock (runtime.attempts): a new attempt committed
    meanwhile makes the proposal start over under it, so the wait is the new attempt's, under its
    key, and a repeated request finds it.
    """
    seconds = _validate(spec)
    return attempt_bound(lambda: _propose(actor, task_id, spec, seconds))


def _propose(
    actor: Actor, task_id: str, spec: OperationSpec, seconds: int
) -> tuple[Operation, bool]:
    """One try of ``wait_propose``; raises AttemptMoved, having written nothing, when the task's
    current attempt, read under its lock, is not the one read before it."""
    task = (
        Task.objects.filter(task_scope(actor), pk=task_id).select_related("current_attempt").first()
    )
    if task is None:
        raise NotFound("no such task")
    can_propose(actor, task)
    key, digest, existing = _keyed(task, spec, seconds)
    if existing is not None:
        return _same_or_conflict(existing, digest), False
    now = timezone.now()
    op = Operation(
        task=task,
        attempt_id=task.current_attempt_id or "",
        kind=spec.kind,
        step=spec.step,
        intent_version=spec.intent_version,
        params=spec.params,
        params_hash=digest,
        idempotency_key=key,
        status=S.WAITING,
        signal=spec.signal,
        timeout_seconds=seconds,
        wait_until=_until(task, spec, seconds, now),
        deadline=task.deadline,
    )
    try:
        with transaction.atomic():
            _register_txn(op, task, spec, actor=actor, seconds=seconds, now=now)
    except IntegrityError:
        existing = Operation.objects.filter(task=task, idempotency_key=key).first()
        if existing is None:
            raise
        return _same_or_conflict(existing, digest), False
    return op, True


def _keyed(task: Task, spec: OperationSpec, seconds: int) -> tuple[str, str, Operation | None]:
    """The wait's idempotency key, its intent's hash, and the wait already proposed under it."""
    # Like a tool operation's: a new attempt is a new pursuit, so its waits are new waits.
    attempt = task.current_attempt.number if task.current_attempt else 1
    crash_point("wait.attempt_read")
    derived = (
        ""
        if spec.idempotency_key
        else key_step(task.pk, spec.step, spec.kind, spec.intent_version, attempt=attempt)
    )
    key = operation_key(task, spec.idempotency_key or derived)
    digest = params_hash({"params": spec.params, **_intent(spec, seconds)})
    existing = Operation.objects.filter(task=task, idempotency_key=key).first()
    if existing is None and derived:
        # Stored before parts were escaped (runtime.keys): found under its legacy key.
        existing = operation_by_legacy_key(
            task,
            derived,
            kind=spec.kind,
            tool="",
            step=spec.step,
            intent_version=spec.intent_version,
        )
    return key, digest, existing


def _intent(spec: OperationSpec, seconds: int) -> dict[str, Any]:
    return {"kind": spec.kind, "signal": spec.signal, "timeout_seconds": seconds}


def _until(task: Task, spec: OperationSpec, seconds: int, now: datetime) -> datetime:
    """The wait's deadline: never after its task's (a timer that would fire after it is
    refused: it could only ever expire)."""
    until = now + timedelta(seconds=seconds)
    if task.deadline is not None and until > task.deadline:
        if spec.kind == Operation.KIND_TIMER:
            raise TaskRefused(
                "the timer would fire after the task's deadline", code="deadline_exceeded"
            )
        until = within_task_deadline(until, task.deadline)  # a wait never outlives its task
    return until


def _register_txn(
    op: Operation, task: Task, spec: OperationSpec, *, actor: Actor, seconds: int, now: datetime
) -> None:
    """Insert the wait, admitted on the task row the journal locked; a signal wait consumes a
    buffered signal of its name at once; a wait still waiting is hinted to a worker."""

    def registered() -> None:
        crash_point("wait.before_register")
        # The attempt its key and row were made for, read again under the task's lock (the
        # wait's own row is nobody else's yet, so the lock order holds).
        attempt_unmoved_txn(task.pk, op.attempt_id)

    data = {"step": spec.step, "status": S.WAITING, "kind": spec.kind, **_intent(spec, seconds)}
    row = operation_insert_txn(op, actor=actor.label, now=now, data=data, registered=registered)
    task_admission_check(
        condition=row.condition,
        cancellation=row.cancellation,
        paused=row.paused,
        deadline=row.deadline,
        now=now,
    )
    if spec.kind == Operation.KIND_WAIT_SIGNAL:
        consume_buffered_txn(op, now=now)
    if op.status == S.WAITING:
        transaction.on_commit(lambda: wait_hint(op.pk, float(seconds)))
    crash_point("wait.registered")


def _same_or_conflict(existing: Operation, digest: str) -> Operation:
    if existing.params_hash != digest:
        raise IdempotencyKeyReused(
            "this idempotency key was used with different parameters", operation=existing.pk
        )
    return existing


def consume_buffered_txn(op: Operation, *, now: datetime) -> None:
    """Inside the registering transaction, after the task lock: a buffered signal of this name
    satisfies the new wait at once."""
    buffered = Signal.objects.filter(
        task_id=op.task_id, name=op.signal, disposition=Signal.BUFFERED, consumed_at__isnull=True
    ).order_by("received_at", "id")
    for signal in buffered:
        if Signal.objects.filter(pk=signal.pk, consumed_at__isnull=True).update(
            consumed_at=now, operation=op
        ):
            wait_satisfy_txn(op, signal, now=now, actor=signal.sent_by)
            return


def wait_satisfy_txn(op: Operation, signal: Signal, *, now: datetime, actor: str) -> None:
    """A signal satisfies a waiting signal wait: its payload becomes the operation's result."""
    operation_transition_txn(
        op,
        S.SUCCEEDED,
        now=now,
        actor=actor,
        fields={
            "result": {
                "signal": signal.name,
                "event_id": signal.event_id,
                "payload": signal.payload,
            },
            "wait_until": None,
        },
        event_type="wait.satisfied",
        data={"signal": signal.pk, "event_id": signal.event_id, "name": signal.name},
    )


# A wake-up hint rides the broker only when it is due this soon (as the outbox's countdowns do):
# nothing sits in Redis long enough to meet its visibility timeout. Later waits are the sweeper's.
_HINT_LIMIT_SECONDS = 60.0


def wait_hint(operation_id: str, seconds: float) -> None:
    """After commit: ask a worker to wake this wait when it is due, ahead of the sweeper. Lossy
    by design; the sweeper is the record."""
    if seconds > _HINT_LIMIT_SECONDS:
        return
    try:
        publish(WAKE_WAIT, operation_id, countdown=max(0.0, seconds))
    except Exception:
        log.debug("wait hint for %s not sent; the sweeper will wake it", operation_id)
