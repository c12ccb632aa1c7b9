"""Allocations drawn from a ledger: a child task's (reserved in its parent's ledger, never a fresh
allowance, and settled there once the child's spending is over) and a new attempt's (what the
task's allowance still leaves). Each runs inside the caller's transaction, under the row locks
its docstring names."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.db.models import F, Sum

from runtime.budgets import amount, ledger_open_txn, ledger_reserve_txn, record_usage_txn
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


def child_settle_txn(*, child: Task, now: datetime) -> None:
    """The child ended: its parent's hold is replaced by what the child consumed (posted as
    posted, unknown as unknown), all of it even beyond its allocation (an overrun is money
    spent: the parent's meter shows posted above its limit and admits nothing more), and the
    rest is released. Idempotent (the usage record's key and the hold's guarded status).

    Preconditions: inside the caller's transaction; the child is terminal with nothing active."""
    holds = list(
        BudgetHold.objects.filter(child_task=child, status=BudgetHold.HELD).select_related("meter")
    )
    if not holds:
        return
    totals = (
        BudgetMeter.objects.filter(task=child)
        .values("meter")
        .annotate(p=Sum("posted"), u=Sum("unknown"))
        .order_by()
    )
    spent = {row["meter"]: row["p"] for row in totals}
    lost = {row["meter"]: row["u"] for row in totals}
    actor = f"task:{child.pk}"
    for hold in sorted(holds, key=lambda h: h.meter_id):
        posted = int(spent.get(hold.meter.meter) or 0)
        unknown = int(lost.get(hold.meter.meter) or 0)
        if posted:
            record_usage_txn(
                meter_id=hold.meter_id,
                op=None,
                child=child,
                number=0,
                value=posted,
                source="child",
                actor=actor,
                now=now,
            )
        target = BudgetHold.UNKNOWN if unknown else BudgetHold.SETTLED
        moved = BudgetHold.objects.filter(pk=hold.pk, status=BudgetHold.HELD).update(
            status=target, amount=unknown if unknown else hold.amount, settled_by=actor
        )
        if moved == 1:
            BudgetMeter.objects.filter(pk=hold.meter_id).update(
                reserved=F("reserved") - hold.amount, unknown=F("unknown") + unknown
            )
