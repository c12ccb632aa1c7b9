"""Allocations drawn from a ledger: a child task's (reserved in its parent's ledger, never a fresh
allowance) and a new attempt's (what the task's allowance still leaves). Each runs inside the
caller's transaction, under the row locks its docstring names."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.db.models import F

from runtime.budgets import amount, ledger_open_txn, ledger_reserve_txn
from runtime.errors import BudgetExhausted, InvalidInput
from runtime.models import Attempt, BudgetHold, BudgetMeter, Task


def child_allocate_txn(
    *, parent: Task, child: Task, attempt: Attempt, requested: Mapping[str, int], now: datetime
) -> dict[str, int]:
    """Reserve a child's allocation in its parent's ledger (never a fresh allowance) and open
    the child's ledger with exactly that. Raises BudgetExhausted when the parent cannot cover
    it. Returns the child's limits.

    Preconditions: inside the caller's transaction, after the parent's row lock."""
    if not parent.budget:
        limits = dict(requested)
    else:
        missing = sorted(set(parent.budget) - set(requested))
        if missing:
            raise InvalidInput(
                "a child of a budgeted task draws its allowance from its parent: declare its "
                f"allocation for {', '.join(missing)}",
                field="budget",
            )
        limits = {name: value for name, value in requested.items() if name in parent.budget}
        if parent.current_attempt_id is None:  # pragma: no cover - every task has one
            raise BudgetExhausted("the parent has no attempt to draw from")
        amounts = {name: v for name, v in limits.items() if v > 0}
        ids = ledger_reserve_txn(
            attempt_id=parent.current_attempt_id,
            amounts=amounts,
            cleanup=False,
            what=f"child task {child.pk}",
        )
        BudgetHold.objects.bulk_create(
            BudgetHold(meter_id=meter_id, child_task=child, amount=amounts[name], created_at=now)
            for name, meter_id in ids.items()
        )
    if limits:
        ledger_open_txn(task=child, attempt=attempt, limits=limits)
    return limits


def attempt_allocate_txn(*, task: Task, previous: Attempt | None, attempt: Attempt) -> None:
    """A new attempt's own allocation: what the task's allowance still leaves after everything
    earlier attempts posted, hold and may owe (unknown). The earlier attempt's limit shrinks to
    what it has committed, so it can admit nothing new but keeps its open holds visible.

    Preconditions: inside the caller's transaction, under the task's row lock."""
    if not task.budget:
        return
    committed: dict[str, int] = {}
    for meter in BudgetMeter.objects.filter(task=task).order_by("id"):
        used = meter.reserved + meter.posted + meter.unknown
        committed[meter.meter] = committed.get(meter.meter, 0) + used
        if previous is not None and meter.attempt_id == previous.pk:
            BudgetMeter.objects.filter(pk=meter.pk).update(
                limit=F("reserved") + F("posted") + F("unknown"), reserve=0
            )
    limits = {
        name: max(0, amount(total) - committed.get(name, 0)) for name, total in task.budget.items()
    }
    ledger_open_txn(task=task, attempt=attempt, limits=limits)
