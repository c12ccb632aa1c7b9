"""Durable waits: signal waits (``kind: wait_signal``) and timers (``kind: timer``) are operation
rows with a deadline (``wait_until``), woken by the sweeper or, for a signal, by its arrival;
never by a process-local sleep. A wait past its deadline becomes ``expired``, stays visible and is
never retried: an admin renews it, transforms it (cancels the operation; denies an approval) or
ends the task."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from runtime.actors import SWEEPER, Actor
from runtime.approvals import approval_renew, approval_transform_txn
from runtime.attempts import attempt_bound, attempt_unmoved_txn
from runtime.cancellation import task_cancel
from runtime.crashpoints import crash_point
from runtime.errors import (
    Conflict,
    IdempotencyKeyReused,
    InvalidInput,
    NotFound,
    TaskRefused,
    WaitNotExpired,
)
from runtime.events import event_append_txn
from runtime.hashing import params_hash
from runtime.keys import key_step
from runtime.leases import operation_settle_txn
from runtime.models import Approval, Operation, Signal, Task
from runtime.policy import can_manage_waits, can_propose, task_scope
from runtime.publish import WAKE_WAIT, publish
from runtime.rules.admission import task_admission_check
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.specs import OperationSpec
from runtime.statemachine import operation_transition_txn, status_deltas
from runtime.tasks import (
    given_key_validate,
    operation_by_legacy_key,
    operation_key,
    task_renewal_txn,
    within_task_deadline,
)
from runtime.text import name_check

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
    # Like a tool operation's: a new attempt is a new pursuit, so its waits are new waits.
    attempt = task.current_attempt.number if task.current_attempt else 1
    crash_point("wait.attempt_read")
    derived = (
        ""
        if spec.idempotency_key
        else key_step(task.pk, spec.step, spec.kind, spec.intent_version, attempt=attempt)
    )
    key = operation_key(task, spec.idempotency_key or derived)
    intent = {"kind": spec.kind, "signal": spec.signal, "timeout_seconds": seconds}
    digest = params_hash({"params": spec.params, **intent})
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
    if existing is not None:
        return _same_or_conflict(existing, digest), False
    now = timezone.now()
    until = now + timedelta(seconds=seconds)
    if task.deadline is not None and until > task.deadline:
        if spec.kind == Operation.KIND_TIMER:
            # A timer that would fire after the task's deadline could only ever expire.
            raise TaskRefused(
                "the timer would fire after the task's deadline", code="deadline_exceeded"
            )
        until = within_task_deadline(until, task.deadline)  # a wait never outlives its task
    try:
        with transaction.atomic():
            op = Operation.objects.create(
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
                wait_until=until,
                deadline=task.deadline,
            )
            crash_point("wait.before_register")
            # The attempt its key and row were made for, read again under the task's lock (the
            # wait's own row is nobody else's yet, so the lock order holds).
            attempt_unmoved_txn(task.pk, op.attempt_id)
            _, row = event_append_txn(
                task_id=task.pk,
                type="operation.proposed",
                state_version=op.state_version,
                now=now,
                deltas=status_deltas(None, S.WAITING),
                operation_id=op.pk,
                actor=actor.label,
                data={"step": spec.step, "status": S.WAITING, "kind": spec.kind, **intent},
            )
            task_admission_check(
                condition=row.condition,
                cancellation=row.cancellation,
                paused=row.paused,
                deadline=row.deadline,
                now=now,
            )
            if spec.kind == Operation.KIND_WAIT_SIGNAL:
                _consume_buffered_txn(op, now=now)
            if op.status == S.WAITING:
                transaction.on_commit(lambda: wait_hint(op.pk, float(seconds)))
            crash_point("wait.registered")
    except IntegrityError:
        existing = Operation.objects.filter(task=task, idempotency_key=key).first()
        if existing is None:
            raise
        return _same_or_conflict(existing, digest), False
    return op, True


def _same_or_conflict(existing: Operation, digest: str) -> Operation:
    if existing.params_hash != digest:
        raise IdempotencyKeyReused(
            "this idempotency key was used with different parameters", operation=existing.pk
        )
    return existing


def _consume_buffered_txn(op: Operation, *, now: datetime) -> None:
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


def wait_sweep(now: datetime | None = None, batch: int = 200) -> dict[str, int]:
    """Fire due timers and expire signal waits past their deadline (the sweeper)."""
    now = now or timezone.now()
    due = list(
        Operation.objects.filter(status=S.WAITING, wait_until__lte=now)
        .order_by("wait_until")
        .values_list("pk", flat=True)[:batch]
    )
    fired = expired = 0
    for op_id in due:
        woke = wait_wake(op_id)
        fired += woke == "timer.fired"
        expired += woke == "wait.expired"
    return {"timers_fired": fired, "waits_expired": expired}


def wait_wake(operation_id: str) -> str:
    """Wake one wait if it is due: a timer fires, a signal wait expires. Taken under its own lock
    (SKIP LOCKED: a signal delivering to it right now wins) and rechecked, so the sweeper and a
    hint (or two copies of one) wake it once. Returns the event written, or ""."""
    with transaction.atomic():
        op = Operation.objects.select_for_update(skip_locked=True).filter(pk=operation_id).first()
        at = timezone.now()
        if op is None or op.status != S.WAITING or op.wait_until is None:
            return ""
        if op.wait_until > at:
            return ""
        if op.kind == Operation.KIND_TIMER:
            operation_transition_txn(
                op,
                S.SUCCEEDED,
                now=at,
                actor=SWEEPER,
                fields={"result": {"fired_at": at.isoformat()}, "wait_until": None},
                event_type="timer.fired",
            )
            return "timer.fired"
        operation_transition_txn(
            op,
            S.EXPIRED,
            now=at,
            actor=SWEEPER,
            fields={"status_reason": f"no {op.signal!r} signal before the wait's deadline"},
            event_type="wait.expired",
            data={"reason": "the wait expired", "signal": op.signal},
        )
        return "wait.expired"


# --- admin actions on expired waits ---------------------------------------------------------


def expired_waits(actor: Actor, limit: int = 200) -> list[Operation]:
    """Expired waits an admin can act on: expired signal waits and expired approval requests."""
    qs = Operation.objects.filter(task_scope(actor, "task__"), status=S.EXPIRED).filter(
        Q(kind=Operation.KIND_WAIT_SIGNAL) | Q(approvals__status=ApprovalStatus.EXPIRED)
    )
    return list(qs.select_related("task").distinct().order_by("updated_at", "id")[:limit])


@dataclass(frozen=True)
class ExpiredWait:
    operation: Operation
    approval: Approval | None  # the expired approval request; None for a signal wait


def expired_waits_with_approvals(actor: Actor, limit: int = 200) -> list[ExpiredWait]:
    """``expired_waits`` with each one's expired approval, read in one query for the page."""
    ops = expired_waits(actor, limit=limit)
    approvals = {
        a.operation_id: a
        for a in Approval.objects.filter(
            operation_id__in=[op.pk for op in ops if op.approval_required],
            status=ApprovalStatus.EXPIRED,
        )
    }
    return [ExpiredWait(op, approvals.get(op.pk)) for op in ops]


def expired_wait_count() -> int:
    return (
        Operation.objects.filter(status=S.EXPIRED)
        .filter(Q(kind=Operation.KIND_WAIT_SIGNAL) | Q(approvals__status=ApprovalStatus.EXPIRED))
        .distinct()
        .count()
    )


def _expired_approval(op: Operation) -> Approval | None:
    return (
        Approval.objects.select_for_update()
        .filter(operation_id=op.pk, status=ApprovalStatus.EXPIRED)
        .first()
    )


def _admin_op(actor: Actor, operation_id: str) -> Operation:
    op = Operation.objects.filter(task_scope(actor, "task__"), pk=operation_id).first()
    if op is None:
        raise NotFound("no such operation")
    can_manage_waits(actor)
    return op


def wait_renew(
    actor: Actor, operation_id: str, *, expires_in_seconds: int, reason: str
) -> Operation:
    """Give an expired wait a new deadline (an expired approval a new validity period)."""
    op = _admin_op(actor, operation_id)
    if op.approval_required:
        approval = Approval.objects.filter(operation_id=op.pk, status=ApprovalStatus.EXPIRED)
        first = approval.first()
        if first is None:
            raise WaitNotExpired("this operation has no expired approval")
        approval_renew(actor, first.pk, expires_in_seconds=expires_in_seconds, reason=reason)
        return Operation.objects.get(pk=op.pk)
    if not 1 <= expires_in_seconds <= MAX_WAIT_SECONDS:
        raise InvalidInput(f"expires_in_seconds must be between 1 and {MAX_WAIT_SECONDS}")
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=op.pk)
        now = timezone.now()
        if op.status != S.EXPIRED or op.kind != Operation.KIND_WAIT_SIGNAL:
            raise WaitNotExpired(f"the operation is {op.status}, not an expired wait")
        until = task_renewal_txn(op.task_id, now + timedelta(seconds=expires_in_seconds), now)
        operation_transition_txn(
            op,
            S.WAITING,
            now=now,
            actor=actor.label,
            fields={"wait_until": until, "status_reason": ""},
            event_type="wait.renewed",
            data={"wait_until": until.isoformat(), "reason": reason},
        )
        _consume_buffered_txn(op, now=now)
    return op


def _transform_txn(op: Operation, *, actor: Actor, reason: str, now: datetime) -> None:
    if op.status != S.EXPIRED:
        raise WaitNotExpired(f"the operation is {op.status}, not expired")
    approval = _expired_approval(op) if op.approval_required else None
    if approval is not None:
        approval_transform_txn(op, approval, actor=actor, reason=reason, now=now)
    elif op.kind == Operation.KIND_WAIT_SIGNAL:
        operation_settle_txn(
            op, S.CANCELLED, now=now, reason=reason or "expired wait transformed", actor=actor.label
        )
    else:
        raise WaitNotExpired("this operation is not an expired wait")


def wait_transform(actor: Actor, operation_id: str, *, reason: str) -> Operation:
    """Transform an expired wait through its supported path: the operation is cancelled (an
    expired approval becomes a denial)."""
    op = _admin_op(actor, operation_id)
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=op.pk)
        _transform_txn(op, actor=actor, reason=reason, now=timezone.now())
    return op


def wait_end_task(actor: Actor, operation_id: str, *, reason: str) -> Task:
    """End the task an expired wait belongs to: the task is cancelled (its other work stops as
    any cancellation stops it), then the expired wait is transformed (cancelled; an expired
    approval denied).

    In that order for the locks: the cancel locks the task's unsettled operations (the expired
    one among them) before the task row, and the transform then only re-takes rows this
    transaction already holds, so the pair keeps the global order even when one outer
    transaction holds both (an ``Idempotency-Key`` request)."""
    op = _admin_op(actor, operation_id)
    if op.status != S.EXPIRED or not (
        op.kind == Operation.KIND_WAIT_SIGNAL or op.approval_required
    ):
        raise WaitNotExpired(f"the operation is {op.status}, not an expired wait")
    reason = reason or "task ended by an admin after an expired wait"
    # A task that ended already refuses the cancel: its expired wait is still settled below.
    with contextlib.suppress(Conflict):
        task_cancel(actor, op.task_id, reason)
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=op.pk)
        _transform_txn(op, actor=actor, reason=reason, now=timezone.now())
    return Task.objects.get(pk=op.task_id)


def waits_of_task(task_id: str) -> list[dict[str, Any]]:
    """The task's waits (approval, signal, timer) for its page, oldest first."""
    ops = Operation.objects.filter(task_id=task_id).filter(
        Q(kind__in=(Operation.KIND_WAIT_SIGNAL, Operation.KIND_TIMER)) | Q(approval_required=True)
    )
    return [
        {
            "op": op,
            "kind": "approval" if op.approval_required else op.kind,
            "until": op.wait_until,
        }
        for op in ops.order_by("created_at", "id")
    ]
