"""Stopping owned work. Cancellation is persisted intent (requested), acknowledged once admission
and dispatch are stopped (in the same transaction), and quiescent once no covered work is active.
Running operations are asked to stop through their heartbeat; their results are still accepted
and kept (completion can win the race; remote effects are retained, not rolled back)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.budgets import child_settle_txn
from runtime.children import children_live_txn
from runtime.crashpoints import crash_point
from runtime.errors import TaskRefused
from runtime.leases import cancel_requested_txn, operation_settle_txn
from runtime.models import Operation, Task
from runtime.policy import can_cancel
from runtime.statemachine import task_transition_txn
from runtime.tasks import task_get
from runtime.transitions import Cancellation, OperationStatus, TaskCondition, TaskOutcome

S = OperationStatus
_STOPPABLE = (S.PENDING, S.WAITING_APPROVAL, S.WAITING, S.RETRY_SCHEDULED, S.MANUAL_INTERVENTION)


def operations_lock_txn(task_id: str) -> list[Operation]:
    """Lock the task's unsettled operations in ascending id, before the task row: the global
    lock order every transition follows (operation row, then task row), so a stop racing a
    claim, a report or a takeover waits instead of deadlocking."""
    return list(
        Operation.objects.select_for_update()
        .filter(task_id=task_id)
        .exclude(status__in=S.FINAL)
        .order_by("id")
    )


def _stop_covered_work_txn(
    task: Task, locked: list[Operation], *, now: datetime, actor: str, reason: str
) -> None:
    """Settle what has not started and ask what is running to stop. Compensations are cleanup
    the stop contract keeps running, so they are not covered. Work proposed after the locks
    were taken is settled only if nobody else holds it; a claimant holding it re-checks the
    stop under the task's lock and rolls its claim back."""
    seen = {op.pk for op in locked}
    late = list(
        Operation.objects.select_for_update(skip_locked=True)
        .filter(task=task, status__in=_STOPPABLE, compensates__isnull=True)
        .exclude(pk__in=seen)
        .order_by("id")
    )
    for op in [*locked, *late]:
        if op.status in _STOPPABLE and op.compensates_id is None:
            operation_settle_txn(op, S.CANCELLED, now=now, reason=reason, actor=actor)
    cancel_requested_txn(task.pk, now=now, actor=actor, reason=reason)


def _stop_begin_txn(task_id: str) -> tuple[Task, list[Operation]]:
    """Take the stop's locks in the global order and return the task read under its lock."""
    locked = operations_lock_txn(task_id)
    crash_point("cancel.after_lock")
    task = Task.objects.select_for_update().get(pk=task_id)
    return task, locked


def task_cancel(actor: Actor, task_id: str, reason: str = "") -> Task:
    """Request cancellation; acknowledged at once (no new work is admitted or dispatched), and
    quiescent when nothing covered is still running. Repeating it is harmless.

    Preconditions: none; NotAuthorized unless policy.can_cancel."""
    task = task_get(actor, task_id)
    can_cancel(actor, task)
    if task.cancellation != Cancellation.NONE:
        return task
    if task.condition == TaskCondition.TERMINAL:
        raise TaskRefused("the task has ended", code="task_terminal")
    with transaction.atomic():
        if not task_cancel_txn(task_id, actor=actor.label, reason=reason):
            task.refresh_from_db()
            if task.condition == TaskCondition.TERMINAL and task.cancellation == Cancellation.NONE:
                raise TaskRefused("the task has ended", code="task_terminal")
    task.refresh_from_db()
    return task


def task_cancel_txn(task_id: str, *, actor: str, reason: str) -> bool:
    """Request and acknowledge the cancellation inside the caller's transaction; False when the
    task was already stopping or ended. Its children are cancelled after this commits.

    Preconditions: the caller authorised ``actor`` (or is the runtime cascading a parent's
    stop)."""
    now = timezone.now()
    task, locked = _stop_begin_txn(task_id)
    if task.cancellation != Cancellation.NONE or task.condition == TaskCondition.TERMINAL:
        return False
    reason = reason or "cancelled"
    task_transition_txn(
        task,
        now=now,
        fields={"cancellation": Cancellation.REQUESTED, "terminal_reason": reason[:2000]},
        event_type="task.cancel_requested",
        actor=actor,
        data={"reason": reason},
    )
    _stop_covered_work_txn(task, locked, now=now, actor=actor, reason=reason)
    task.refresh_from_db()
    task_transition_txn(
        task,
        now=now,
        fields={"cancellation": Cancellation.ACKNOWLEDGED},
        event_type="task.cancel_acknowledged",
        actor=actor,
    )
    task_quiesce_txn(task.pk, now=now, actor=actor)
    _cascade_after_commit(task.pk, actor=actor, reason=reason)
    return True


def _cascade_after_commit(task_id: str, *, actor: str, reason: str) -> None:
    """Children stop with their parent, each in a transaction of its own once the parent's stop
    committed (the sweeper repeats it if this process dies first)."""
    from runtime.children import children_cancel

    def cascade() -> None:
        if Task.objects.filter(parent_id=task_id).exists():
            children_cancel(task_id, actor=actor, reason=f"parent stopped: {reason}")

    transaction.on_commit(cascade, robust=True)


def task_fail(actor: Actor, task_id: str, reason: str = "") -> Task:
    """The agent gives up: the task ends failed, work not yet started is cancelled, running work
    is asked to stop (and its results kept)."""
    task = task_get(actor, task_id)
    can_cancel(actor, task)
    if task.condition == TaskCondition.TERMINAL:
        raise TaskRefused("the task has ended", code="task_terminal")
    now = timezone.now()
    with transaction.atomic():
        task, locked = _stop_begin_txn(task_id)
        if task.condition == TaskCondition.TERMINAL:
            raise TaskRefused("the task has ended", code="task_terminal")
        reason = reason or "failed"
        _stop_covered_work_txn(task, locked, now=now, actor=actor.label, reason=reason)
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
        task_quiesce_txn(task.pk, now=now, actor=actor.label)
        _cascade_after_commit(task.pk, actor=actor.label, reason=reason)
    task.refresh_from_db()
    return task


def task_quiesce_txn(task_id: str, *, now: datetime, actor: str) -> None:
    """Inside the caller's transaction, after any settling: a cancelled task with nothing active
    (and no live child) becomes quiescent and terminal; an ended task that asked for
    compensation unwinds. ``actor`` is whoever's change let the task come to rest."""
    from runtime.compensation import saga_next_txn, saga_wanted

    task = Task.objects.get(pk=task_id)
    if task.ops_active:
        return
    if task.parent_id is not None and task.condition == TaskCondition.TERMINAL:
        _child_ended_txn(task, now=now, actor=actor)
    if task.cancellation == Cancellation.ACKNOWLEDGED:
        if children_live_txn(task.pk):
            # Structured concurrency: a parent is quiescent only once its children are.
            return
        task_transition_txn(
            task,
            now=now,
            fields={"cancellation": Cancellation.QUIESCENT, "outcome": TaskOutcome.CANCELLED},
            target_condition=TaskCondition.TERMINAL,
            event_type="task.cancelled",
            actor=actor,
            data={"reason": task.terminal_reason},
        )
        task.refresh_from_db()
        if task.parent_id is not None:
            _child_ended_txn(task, now=now, actor=actor)
    if task.condition == TaskCondition.TERMINAL and saga_wanted(task):
        saga_next_txn(task.pk, now=now)


def _child_ended_txn(task: Task, *, now: datetime, actor: str) -> None:
    """A child with nothing active ended: its consumption replaces its allocation's hold in the
    parent's ledger, and the parent (maybe waiting for it) is looked at after commit."""
    child_settle_txn(child=task, now=now)
    parent_id = task.parent_id
    if parent_id is None:
        return
    from runtime.children import parent_quiesce

    transaction.on_commit(lambda: parent_quiesce(parent_id, actor=actor), robust=True)
