"""Stopping owned work. Cancellation is persisted intent (requested), acknowledged once admission
and dispatch are stopped (in the same transaction), and quiescent once no covered work is active.
Running operations are asked to stop through their heartbeat; their results are still accepted
and kept (completion can win the race; remote effects are retained, not rolled back)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from runtime.actors import ROLE_ADMIN, Actor
from runtime.errors import NotAuthorized, TaskRefused
from runtime.leases import operation_settle_txn
from runtime.models import Operation, Task
from runtime.statemachine import task_transition_txn
from runtime.tasks import task_get
from runtime.transitions import Cancellation, OperationStatus, TaskCondition, TaskOutcome

S = OperationStatus
_STOPPABLE = (S.PENDING, S.WAITING_APPROVAL, S.WAITING, S.RETRY_SCHEDULED, S.MANUAL_INTERVENTION)


def _authorize(actor: Actor, task: Task) -> None:
    if actor.kind == "agent" and task.agent_id == actor.agent_id:
        return
    if actor.has_role(ROLE_ADMIN):
        return
    raise NotAuthorized("only the task's agent or an admin may stop it")


def _stop_covered_work_txn(task: Task, *, now: datetime, actor: str, reason: str) -> None:
    """Settle what has not started and ask what is running to stop. Compensations are cleanup
    the stop contract keeps running, so they are not covered."""
    for op in Operation.objects.filter(
        task=task, status__in=_STOPPABLE, compensates__isnull=True
    ).order_by("created_at"):
        operation_settle_txn(op, S.CANCELLED, now=now, reason=reason, actor=actor)
    Operation.objects.filter(task=task, status=S.RUNNING, compensates__isnull=True).update(
        cancel_requested=True
    )


def task_cancel(actor: Actor, task_id: str, reason: str = "") -> Task:
    """Request cancellation; acknowledged at once (no new work is admitted or dispatched), and
    quiescent when nothing covered is still running. Repeating it is harmless.

    Preconditions: the actor is the task's agent or an admin."""
    task = task_get(actor, task_id)
    _authorize(actor, task)
    now = timezone.now()
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if task.cancellation != Cancellation.NONE:
            return task
        if task.condition == TaskCondition.TERMINAL:
            raise TaskRefused("the task has ended", code="task_terminal")
        reason = reason or "cancelled"
        task_transition_txn(
            task,
            now=now,
            fields={"cancellation": Cancellation.REQUESTED, "terminal_reason": reason[:2000]},
            event_type="task.cancel_requested",
            actor=actor.label,
            data={"reason": reason},
        )
        _stop_covered_work_txn(task, now=now, actor=actor.label, reason=reason)
        task.refresh_from_db()
        task_transition_txn(
            task,
            now=now,
            fields={"cancellation": Cancellation.ACKNOWLEDGED},
            event_type="task.cancel_acknowledged",
            actor=actor.label,
        )
        task_quiesce_txn(task.pk, now=now)
    task.refresh_from_db()
    return task


def task_fail(actor: Actor, task_id: str, reason: str = "") -> Task:
    """The agent gives up: the task ends failed, work not yet started is cancelled, running work
    is asked to stop (and its results kept)."""
    task = task_get(actor, task_id)
    _authorize(actor, task)
    now = timezone.now()
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if task.condition == TaskCondition.TERMINAL:
            raise TaskRefused("the task has ended", code="task_terminal")
        reason = reason or "failed"
        _stop_covered_work_txn(task, now=now, actor=actor.label, reason=reason)
        task.refresh_from_db()
        task_transition_txn(
            task,
            now=now,
            fields={"outcome": TaskOutcome.FAILED, "terminal_reason": reason[:2000]},
            target_condition=TaskCondition.TERMINAL,
            event_type="task.failed",
            actor=actor.label,
            data={"reason": reason},
        )
        task_quiesce_txn(task.pk, now=now)
    task.refresh_from_db()
    return task


def task_quiesce_txn(task_id: str, *, now: datetime) -> None:
    """Inside the caller's transaction, after any settling: a cancelled task with nothing active
    becomes quiescent and terminal; an ended task that asked for compensation unwinds."""
    from runtime.compensation import saga_next_txn, saga_wanted

    task = Task.objects.get(pk=task_id)
    if task.ops_active:
        return
    if task.cancellation == Cancellation.ACKNOWLEDGED:
        task_transition_txn(
            task,
            now=now,
            fields={"cancellation": Cancellation.QUIESCENT, "outcome": TaskOutcome.CANCELLED},
            target_condition=TaskCondition.TERMINAL,
            event_type="task.cancelled",
            data={"reason": task.terminal_reason},
        )
    if task.condition == TaskCondition.TERMINAL and saga_wanted(task):
        saga_next_txn(task.pk, now=now)
