"""Durable waits: signal waits (``kind: wait_signal``) and timers (``kind: timer``) are operation
rows with a deadline (``wait_until``), woken by the sweeper or, for a signal, by its arrival;
never by a process-local sleep. A wait past its deadline becomes ``expired``, stays visible and is
never retried: an admin renews it, transforms it (cancels the operation; denies an approval) or
ends the task."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from runtime.actors import SWEEPER, Actor
from runtime.approval_expiry import approval_renew, approval_transform_txn
from runtime.cancellation import task_cancel
from runtime.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    WaitNotExpired,
)
from runtime.models import Approval, Operation, Task
from runtime.policy import can_manage_waits, task_scope
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.tasks import task_renewal_txn
from runtime.transitions.propose_wait import MAX_WAIT_SECONDS, consume_buffered_txn
from runtime.transitions.settle import operation_settle_txn
from runtime.transitions.status import operation_transition_txn

log = logging.getLogger(__name__)
S = OperationStatus


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
        consume_buffered_txn(op, now=now)
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
