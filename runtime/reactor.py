"""What follows a settled operation, at the task level: the one place that decides what an
operation's settling sets in motion, above compensation, cancellation and child tasks.

- A compensation that succeeded marks its original ``compensated``.
- A task that is stopping (or has ended) and has nothing active comes to rest: a cancelled task
  becomes quiescent and terminal once its children are; a task whose outcome asks for
  compensation unwinds, one compensation at a time; an ended child whose spending is over (its
  saga included) has its consumption replace its allocation in the parent's ledger, and the
  parent is looked at.

Every entry point that settles an operation (acceptance, the sweeper's takeover, a person's
resolution, the stop watchdog) calls ``operation_settled_txn`` inside its transaction; a stop
calls ``task_rest_txn``. This module imports the concepts it coordinates and none of them
imports it back, so no function-level import holds a cycle apart."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from runtime.actors import RUNTIME
from runtime.budget_allocations import child_settle_txn
from runtime.children import child_settle_due_txn, children_live_txn
from runtime.compensation import saga_next_txn, saga_wanted
from runtime.crashpoints import crash_point
from runtime.events import TaskRow
from runtime.models import Operation, Task
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition, TaskOutcome
from runtime.rules.stop import rest_due
from runtime.transitions.status import operation_transition_txn, task_transition_txn

S = OperationStatus


def operation_settled_txn(op: Operation, task: TaskRow, *, now: datetime, actor: str) -> None:
    """Inside the settling transaction, after ``op`` reached a final status; ``task`` is the task
    row that transition returned. Preconditions: a compensation's original was locked with it
    (ascending id, before the task: ``compensation.operation_and_original_lock_txn``)."""
    if op.compensates_id and op.status == S.SUCCEEDED:
        original = Operation.objects.get(pk=op.compensates_id)
        if original.status == S.COMPENSATING:
            task = operation_transition_txn(
                original, S.COMPENSATED, now=now, actor=actor, data={"compensation": op.pk}
            ).task
    if rest_due(task):
        task_rest_txn(task.id, now=now, actor=actor)


def task_rest_txn(task_id: str, *, now: datetime, actor: str) -> None:
    """Inside the caller's transaction, after any settling: a cancelled task with nothing active
    (and no live child) becomes quiescent and terminal; an ended task that asked for
    compensation unwinds; an ended child whose spending is over settles in its parent's ledger.
    ``actor`` is whoever's change let the task come to rest."""
    # Read under the task's lock (a no-op for callers that already hold it): two rests racing,
    # such as two children's endings both looking at their parent, serialise here and the
    # second finds the first's result instead of a stale version.
    task = Task.objects.select_for_update(no_key=True).get(pk=task_id)
    crash_point("rest.after_read")
    if task.ops_active:
        return
    if task.cancellation == Cancellation.ACKNOWLEDGED:
        if children_live_txn(task.pk):
            # Structured concurrency: a parent is quiescent only once its children are.
            return
        # A task's first accepted ending stands: an outcome already set is never replaced.
        task_transition_txn(
            task,
            now=now,
            fields={
                "cancellation": Cancellation.QUIESCENT,
                "outcome": task.outcome or TaskOutcome.CANCELLED,
            },
            target_condition=TaskCondition.TERMINAL,
            event_type="task.cancelled",
            actor=actor,
            data={"reason": task.terminal_reason},
        )
        task.refresh_from_db()
    if task.condition != TaskCondition.TERMINAL:
        return
    # The saga first: a compensation it starts spends from this task's ledger, so an ended
    # child settles in its parent's only after it (this runs again as the compensation settles).
    if saga_wanted(task) and saga_next_txn(task.pk, now=now) is not None:
        return
    if task.parent_id is not None:
        child_ended_txn(task, now=now, actor=actor)


def parent_rest(parent_id: str, *, actor: str = RUNTIME) -> None:
    """After a child ended: the parent may now come to rest (its own transaction; ``actor`` is
    who let the last child come to rest). Idempotent: it takes the locks in the global order
    (the parent's unsettled operations in ascending id, then its task row) and decides on the
    task read under them, so two children ending at once bring their parent to rest once, and
    the second finds nothing left to do instead of a rejected transition."""
    with transaction.atomic():
        list(
            Operation.objects.select_for_update(no_key=True)
            .filter(task_id=parent_id)
            .exclude(status__in=S.FINAL)
            .order_by("id")
            .values_list("pk", flat=True)
        )
        task_rest_txn(parent_id, now=timezone.now(), actor=actor)


def child_ended_txn(task: Task, *, now: datetime, actor: str) -> None:
    """A child with nothing active ended: once nothing in it can spend any more (its saga done,
    nothing left unresolved, its own children settled: ``children.child_settle_due_txn``) its
    consumption replaces its allocation's hold in the parent's ledger; the parent (maybe waiting
    for it) is looked at after commit either way. A settlement put off here is made by the rest
    that follows whatever ends the spending (a compensation's or a resolution's settling, a
    grandchild's rest).
    Preconditions: inside the transaction that ended it (or found it ended), under its lock,
    after anything this transaction started in it."""
    if child_settle_due_txn(task.pk):
        child_settle_txn(child=task, now=now)
    parent_id = task.parent_id
    if parent_id is None:
        return
    transaction.on_commit(lambda: parent_rest(parent_id, actor=actor), robust=True)
