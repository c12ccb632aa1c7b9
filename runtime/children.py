"""Child tasks (structured concurrency, made durable): a child draws its allocation from its
parent's ledger (runtime.budgets.child_allocate_txn), inherits its deadline or a shorter one,
is cancelled with its parent, and the parent becomes quiescent only after its children are.

The cascade runs after the parent's stop commits, one child per transaction: a child's rows are
never locked while its parent's are held, so the lock order (operations, then task) holds for
each task. Because an after-commit step can be lost with its process, the sweeper repeats what
is still owed (``cancellation.children_sweep``). The cascade lives in ``runtime.cancellation``,
a parent's rest in ``runtime.reactor``; this module answers what both ask."""

from __future__ import annotations

import logging

from django.db.models import Q, QuerySet

from runtime.models import Task
from runtime.transitions import TaskCondition

log = logging.getLogger(__name__)


def _children_live(task_id: str) -> QuerySet[Task]:
    """The task's children that still run or may still run something."""
    return Task.objects.filter(parent_id=task_id).filter(
        ~Q(condition=TaskCondition.TERMINAL) | Q(ops_active__gt=0)
    )


def children_live_txn(task_id: str) -> bool:
    """Whether any child of the task still runs or may still run something."""
    return _children_live(task_id).exists()


def children_live_ids(task_id: str) -> list[str]:
    """The live children's ids, for a refusal that names them."""
    return list(_children_live(task_id).order_by("id").values_list("id", flat=True))
