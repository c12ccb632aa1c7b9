"""Child tasks (structured concurrency, made durable): a child draws its allocation from its
parent's ledger (runtime.budgets.child_allocate_txn), inherits its deadline or a shorter one,
is cancelled with its parent, and the parent becomes quiescent only after its children are.

The cascade runs after the parent's stop commits, one child per transaction: a child's rows are
never locked while its parent's are held, so the lock order (operations, then task) holds for
each task. Because an after-commit step can be lost with its process, the sweeper repeats what
is still owed (``children_sweep``)."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runtime.actors import RUNTIME, SWEEPER
from runtime.models import BudgetHold, Task
from runtime.transitions import Cancellation, TaskCondition

log = logging.getLogger(__name__)


def children_live_txn(task_id: str) -> bool:
    """Whether any child of the task still runs or may still run something."""
    return (
        Task.objects.filter(parent_id=task_id)
        .filter(~Q(condition=TaskCondition.TERMINAL) | Q(ops_active__gt=0))
        .exists()
    )


def children_cancel(parent_id: str, *, actor: str, reason: str) -> int:
    """Cancel the parent's children that are still going (each in its own transaction, and
    their own children after them). Safe to repeat."""
    from runtime.cancellation import task_cancel_txn

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


def parent_quiesce(parent_id: str, *, actor: str = RUNTIME) -> None:
    """After a child ended: the parent may now be quiescent (its own transaction; ``actor`` is
    who let the last child come to rest)."""
    from runtime.cancellation import task_quiesce_txn

    with transaction.atomic():
        task_quiesce_txn(parent_id, now=timezone.now(), actor=actor)


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
    unsettled = list(
        BudgetHold.objects.filter(
            status=BudgetHold.HELD,
            child_task__condition=TaskCondition.TERMINAL,
            child_task__ops_active=0,
        )
        .values_list("child_task_id", flat=True)
        .distinct()[:batch]
    )
    from runtime.budgets import child_settle_txn

    for child_id in unsettled:
        with transaction.atomic():
            child_settle_txn(child=Task.objects.get(pk=child_id), now=now)
        done += 1
    waiting = list(
        Task.objects.filter(cancellation=Cancellation.ACKNOWLEDGED, ops_active=0)
        .filter(children__isnull=False)
        .values_list("pk", flat=True)
        .distinct()[:batch]
    )
    for parent_id in waiting:
        parent_quiesce(parent_id, actor=SWEEPER)
    return done
