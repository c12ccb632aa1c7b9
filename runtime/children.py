"""Child tasks (structured concurrency, made durable): a child draws its allocation from its
parent's ledger (runtime.budget_allocations.child_allocate_txn), inherits its deadline or a
shorter one, is cancelled with its parent, and the parent becomes quiescent only after its
children are.

The cascade runs after the parent's stop commits, one child per transaction: a child's rows are
never locked while its parent's are held, so the lock order (operations, then task) holds for
each task. Because an after-commit step can be lost with its process, the sweeper repeats what
is still owed (``cancellation.children_sweep``). The cascade lives in ``runtime.cancellation``,
a parent's rest in ``runtime.reactor``; this module answers what both ask.

An ended child settles its allocation in its parent's ledger only once nothing in it can spend
any more (``child_settle_due_txn``): a compensation, a child of its own and a person's resolution
of what it left unresolved (which may start a compensation) all spend from its ledger after it
ended, and a hold settled before them would leave that spending unbooked in the parent."""

from __future__ import annotations

import logging

from django.db.models import Exists, OuterRef, Q, QuerySet

from runtime.models import BudgetHold, Operation, Task
from runtime.rules.statuses import OperationStatus, TaskCondition

log = logging.getLogger(__name__)


def _live() -> Q:
    """A task that still runs or may still run something."""
    return ~Q(condition=TaskCondition.TERMINAL) | Q(ops_active__gt=0)


def _children_live(task_id: str) -> QuerySet[Task]:
    """The task's children that still run or may still run something."""
    return Task.objects.filter(parent_id=task_id).filter(_live())


def children_live_txn(task_id: str) -> bool:
    """Whether any child of the task still runs or may still run something."""
    return _children_live(task_id).exists()


def children_live_ids(task_id: str) -> list[str]:
    """The live children's ids, for a refusal that names them."""
    return list(_children_live(task_id).order_by("id").values_list("id", flat=True))


def _settle_due(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """Those of ``tasks`` that ended and in which nothing can spend any more: nothing active (a
    compensation under way keeps its original ``compensating``, which counts), nothing left with
    a person as ``unresolved`` (resolving it may start a compensation), no child of its own still
    going, and none whose allocation its ledger still holds (a grandchild settles there first)."""
    return (
        tasks.filter(condition=TaskCondition.TERMINAL, ops_active=0)
        .exclude(
            Exists(
                Operation.objects.filter(task_id=OuterRef("pk"), status=OperationStatus.UNRESOLVED)
            )
        )
        .exclude(Exists(Task.objects.filter(parent_id=OuterRef("pk")).filter(_live())))
        .exclude(
            Exists(
                BudgetHold.objects.filter(
                    meter__task_id=OuterRef("pk"),
                    child_task__isnull=False,
                    status=BudgetHold.HELD,
                )
            )
        )
    )


def child_settle_due_txn(task_id: str) -> bool:
    """Whether the task, a child that ended, may now settle its allocation in its parent's
    ledger (one statement). Preconditions: under the task's row lock, after anything this
    transaction set in motion in it (a compensation started), so no writer can start spending
    in it before the settlement commits."""
    return _settle_due(Task.objects.filter(pk=task_id)).exists()


def children_settle_due_ids(limit: int) -> list[str]:
    """Ended children whose allocation their parent still holds although nothing in them can
    spend any more: what an after-commit step lost left for the sweeper (which decides each one
    again under its row lock)."""
    held = BudgetHold.objects.filter(child_task_id=OuterRef("pk"), status=BudgetHold.HELD)
    due = _settle_due(Task.objects.filter(Exists(held)))
    return list(due.order_by("id").values_list("pk", flat=True)[:limit])
