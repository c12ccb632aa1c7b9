"""Stopping owned work. Cancellation is persisted intent (requested), acknowledged once admission
and dispatch are stopped (in the same transaction), and quiescent once no covered work is active.
Running operations are asked to stop through their heartbeat; their results are still accepted
and kept (completion can win the race; remote effects are retained, not rolled back)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runtime.actors import SWEEPER, Actor
from runtime.budget_allocations import child_settle_txn
from runtime.children import child_settle_due_txn, children_settle_due_ids
from runtime.crashpoints import crash_point
from runtime.errors import TaskRefused
from runtime.models import Operation, Task
from runtime.policy import can_cancel
from runtime.reactor import parent_rest, task_rest_txn
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition, TaskOutcome
from runtime.selectors.tasks import task_get
from runtime.stoprule import stop_covers, stopping
from runtime.transitions.lease import cancel_requested_txn
from runtime.transitions.settle import operation_stop_txn
from runtime.transitions.status import task_transition_txn

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
    the stop contract keeps running, so they are not covered. Work whose earlier call may have
    had an effect nobody confirmed goes to a person instead of being cancelled
    (runtime.stoprule). Work that appeared after the locks were taken is settled only if nobody
    else holds it (never waiting for a row while holding the task's); a claimant holding it
    re-checks the stop under the task's lock and rolls its claim back."""
    seen = {op.pk for op in locked}
    late = list(
        Operation.objects.select_for_update(skip_locked=True)
        .filter(task=task, status__in=_STOPPABLE, compensates__isnull=True)
        .exclude(pk__in=seen)
        .order_by("id")
    )
    for op in [*locked, *late]:
        if op.status in _STOPPABLE and stop_covers(op.compensates_id):
            operation_stop_txn(op, now=now, actor=actor, reason=reason)
    cancel_requested_txn(task.pk, locked, now=now, actor=actor, reason=reason)


# How often a stop takes its locks again when work appeared between its two lock statements,
# before it goes on with what it holds (what it could not lock re-checks the stop itself).
_LOCK_ROUNDS = 5


class _MoreWork(Exception):
    """Live work appeared between the stop's operation locks and its task lock."""


def _stop_begin_txn(task_id: str) -> tuple[Task, list[Operation]]:
    """Take the stop's locks in the global order (the task's live operations in ascending id,
    then the task) and return the task read under its lock. Work that became live in between
    (proposed and claimed while the stop waited for the task row) is not locked: the locks are
    given back (a savepoint's row locks go with it) and taken again, so the stop never touches
    an operation row it did not lock while it holds the task row."""
    for _ in range(_LOCK_ROUNDS - 1):
        try:
            with transaction.atomic():
                locked, task = _stop_locks_txn(task_id)
                live = _live_ids_txn(task_id)
                if not live - {op.pk for op in locked}:
                    return task, locked
                raise _MoreWork
        except _MoreWork:
            continue
    locked, task = _stop_locks_txn(task_id)
    return task, locked


def _stop_locks_txn(task_id: str) -> tuple[list[Operation], Task]:
    locked = operations_lock_txn(task_id)
    crash_point("cancel.after_lock")
    return locked, Task.objects.select_for_update().get(pk=task_id)


def _live_ids_txn(task_id: str) -> set[str]:
    return set(
        Operation.objects.filter(task_id=task_id)
        .exclude(status__in=S.FINAL)
        .values_list("pk", flat=True)
    )


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
    if stopping(task.cancellation, task.condition):
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
    task_rest_txn(task.pk, now=now, actor=actor)
    _cascade_after_commit(task.pk, actor=actor, reason=reason)
    return True


def _cascade_after_commit(task_id: str, *, actor: str, reason: str) -> None:
    """Children stop with their parent, each in a transaction of its own once the parent's stop
    committed (the sweeper repeats it if this process dies first)."""

    def cascade() -> None:
        if Task.objects.filter(parent_id=task_id).exists():
            children_cancel(task_id, actor=actor, reason=f"parent stopped: {reason}")

    transaction.on_commit(cascade, robust=True)


def task_fail(actor: Actor, task_id: str, reason: str = "") -> Task:
    """The agent gives up: the task ends failed, work not yet started is cancelled, running work
    is asked to stop (and its results kept). A task's first accepted ending stands: once a
    cancel was accepted (even while its running work still settles) the task ends cancelled,
    and the fail is refused (409 ``task_cancelled``), decided on the task read under its lock."""
    task = task_get(actor, task_id)
    can_cancel(actor, task)
    _fail_admissible(task)
    now = timezone.now()
    with transaction.atomic():
        task, locked = _stop_begin_txn(task_id)
        _fail_admissible(task)
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
        task_rest_txn(task.pk, now=now, actor=actor.label)
        _cascade_after_commit(task.pk, actor=actor.label, reason=reason)
    task.refresh_from_db()
    return task


def _fail_admissible(task: Task) -> None:
    if task.cancellation != Cancellation.NONE:
        raise TaskRefused("the task was cancelled", code="task_cancelled")
    if task.condition == TaskCondition.TERMINAL:
        raise TaskRefused("the task has ended", code="task_terminal")


def children_cancel(parent_id: str, *, actor: str, reason: str) -> int:
    """Cancel the parent's children that are still going (each in its own transaction, and
    their own children after them). Safe to repeat."""
    cancelled = 0
    pending = list(
        Task.objects.filter(parent_id=parent_id, cancellation=Cancellation.NONE)
        .exclude(condition=TaskCondition.TERMINAL)
        .values_list("pk", flat=True)
    )
    for child_id in pending:
        with transaction.atomic():
            if task_cancel_txn(child_id, actor=actor, reason=reason or "cancelled with its parent"):
                cancelled += 1
    return cancelled


def children_sweep(now: datetime | None = None, batch: int = 100) -> int:
    """What the after-commit steps may have left undone: children of a stopped parent that were
    not cancelled; ended children whose allocation was not settled in the parent's ledger;
    parents waiting for children that have all ended."""
    now = now or timezone.now()
    done = 0
    stopped_parents = list(
        Task.objects.filter(
            children__cancellation=Cancellation.NONE,
            children__condition__in=[c for c in TaskCondition.ALL if c != TaskCondition.TERMINAL],
        )
        .filter(~Q(cancellation=Cancellation.NONE) | Q(condition=TaskCondition.TERMINAL))
        .values_list("pk", flat=True)
        .distinct()[:batch]
    )
    for parent_id in stopped_parents:
        done += children_cancel(parent_id, actor=SWEEPER, reason="cancelled with its parent")
    for child_id in children_settle_due_ids(batch):
        with transaction.atomic():
            # Decided again under the child's lock, which every writer that could start spending
            # in it (a compensation, a resolution) takes too.
            child = Task.objects.select_for_update(no_key=True).get(pk=child_id)
            if child_settle_due_txn(child.pk):
                child_settle_txn(child=child, now=now)
                done += 1
    waiting = list(
        Task.objects.filter(cancellation=Cancellation.ACKNOWLEDGED, ops_active=0)
        .filter(children__isnull=False)
        .values_list("pk", flat=True)
        .distinct()[:batch]
    )
    for parent_id in waiting:
        parent_rest(parent_id, actor=SWEEPER)
    return done
