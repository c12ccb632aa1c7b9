"""Budgets as ledgers, per attempt and meter (TigerBeetle's pending/posted distinction).

Admission reserves an operation's estimate with one guarded UPDATE per meter (its predicate is
re-evaluated by PostgreSQL after a concurrent update, so concurrent admissions can never together
pass the limit); settlement replaces the hold with observed usage and releases the rest; a hold
whose dispatched call's usage was lost becomes *unknown* (a possible liability kept apart from
posted usage) until a person or a lookup settles it. Nothing here ever frees an expired hold.

Every function ending in ``_txn`` runs inside the caller's transaction and never opens one.
Lock order: ledger rows are taken last (after the operation rows and the task row), meters in
ascending name. Tasks without a budget cost nothing: every entry returns before any statement.
A child's and a new attempt's allocations are in runtime.budget_allocations, the meters' reads
in runtime.selectors.budgets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum

from runtime.errors import BudgetExhausted, InvalidInput
from runtime.models import Attempt, BudgetHold, BudgetMeter, Operation, Task, UsageRecord

BUILTIN_METERS = ("cost_cents", "model_tokens", "tool_calls")


MAX_METERS = 16


MAX_AMOUNT = 2**53 - 1


def amount(value: Any) -> int:
    """Ledger amounts are whole units; a fractional estimate or usage rounds up (never under)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidInput("amounts must be non-negative numbers")
    if value > MAX_AMOUNT:
        raise InvalidInput(f"amounts must be at most {MAX_AMOUNT}")
    return math.ceil(value)


def budget_validate(budget: Mapping[str, Any] | None) -> dict[str, int]:
    """The declared limits, checked: builtin meters plus any the task names. Pure."""
    if not budget:
        return {}
    if len(budget) > MAX_METERS:
        raise InvalidInput(f"a budget has at most {MAX_METERS} meters")
    limits: dict[str, int] = {}
    for name, value in budget.items():
        if not isinstance(name, str) or not (0 < len(name) <= 64) or not name.isidentifier():
            raise InvalidInput("budget meter names are identifiers of at most 64 characters")
        limits[name] = amount(value)
    return limits


_BUDGETS: dict[str, dict[str, Any]] = {}


_BUDGETS_MAX = 20000


def task_budget(task_id: str) -> dict[str, Any]:
    """A task's declared limits. They are written in the task's creating transaction and never
    change, so a process keeps them once read: the hot path asks for them with no statement
    after the first operation of a task."""
    cached = _BUDGETS.get(task_id)
    if cached is None:
        cached = Task.objects.filter(pk=task_id).values_list("budget", flat=True).first() or {}
        if len(_BUDGETS) >= _BUDGETS_MAX:
            _BUDGETS.clear()
        _BUDGETS[task_id] = cached
    return cached


def budget_remember(task_id: str, budget: dict[str, Any] | None) -> None:
    """Keep a task's limits read by a statement that had them anyway (claim, proposal)."""
    if len(_BUDGETS) >= _BUDGETS_MAX:
        _BUDGETS.clear()
    _BUDGETS[task_id] = budget or {}


def cleanup_reserve(limit: int) -> int:
    return limit * int(settings.BUDGET_RESERVE_PERCENT) // 100


def ledger_open_txn(*, task: Task, attempt: Attempt, limits: Mapping[str, int]) -> None:
    """Create the attempt's meters. Inside the caller's transaction."""
    BudgetMeter.objects.bulk_create(
        BudgetMeter(
            attempt=attempt,
            task=task,
            meter=name,
            limit=limit,
            reserve=cleanup_reserve(limit),
        )
        for name, limit in sorted(limits.items())
    )


def effective_estimate(
    budget: Mapping[str, Any], estimate: Mapping[str, Any], *, kind: str
) -> dict[str, int]:
    """What a proposal holds: its estimate on the meters the task limits, and one tool call for a
    tool operation when the task limits tool calls. Pure."""
    held = {name: amount(v) for name, v in estimate.items() if name in budget}
    if kind == Operation.KIND_TOOL and "tool_calls" in budget:
        held.setdefault("tool_calls", 1)
    return {name: v for name, v in held.items() if v > 0}


def ledger_reserve_txn(
    *, attempt_id: str, amounts: Mapping[str, int], cleanup: bool, what: str
) -> dict[str, int]:
    """One guarded UPDATE per meter (ascending name): the hold is taken only if the meter can
    cover it, counting outstanding holds and unknown usage as spent. Ordinary work must leave
    the cleanup reserve untouched. Raises BudgetExhausted (the caller's transaction then rolls
    back everything it wrote). Returns {meter: meter id}."""
    ids: dict[str, int] = {}
    rows = dict(
        BudgetMeter.objects.filter(attempt_id=attempt_id, meter__in=list(amounts)).values_list(
            "meter", "id"
        )
    )
    for name in sorted(amounts):
        need = amounts[name]
        meter_id = rows.get(name)
        if meter_id is None:
            continue  # not a meter this attempt limits
        ceiling = F("limit") if cleanup else F("limit") - F("reserve")
        # reserved + posted + unknown + need <= ceiling, evaluated on the row as it is when the
        # UPDATE takes it (after any concurrent admission committed).
        touched = BudgetMeter.objects.filter(
            Q(pk=meter_id) & Q(reserved__lte=ceiling - F("posted") - F("unknown") - need)
        ).update(reserved=F("reserved") + need)
        if touched != 1:
            raise BudgetExhausted(
                f"the budget cannot cover {what}: {name} needs {need}", meter=name, field=name
            )
        ids[name] = meter_id
    return ids


def budget_reserve_txn(
    *,
    budget: Mapping[str, Any],
    op: Operation,
    number: int,
    now: datetime,
    cleanup: bool = False,
) -> None:
    """Hold the operation's estimate for invocation ``number`` (0 at proposal).

    Preconditions: inside the caller's transaction, after the operation row and the task row
    were written (lock order). No statement at all for a task without a budget."""
    if not budget:
        return
    amounts = effective_estimate(budget, op.estimate or {}, kind=op.kind)
    if not amounts:
        return
    ids = ledger_reserve_txn(
        attempt_id=op.attempt_id, amounts=amounts, cleanup=cleanup, what=f"operation {op.pk}"
    )
    BudgetHold.objects.bulk_create(
        BudgetHold(
            meter_id=meter_id, operation=op, number=number, amount=amounts[name], created_at=now
        )
        for name, meter_id in ids.items()
    )


def budget_rehold_needed(budget: Mapping[str, Any], op: Operation) -> bool:
    """A re-dispatch needs a fresh hold when nothing is held any more: the earlier call's hold
    was settled with its usage (a retry) or turned unknown (a lost call). One indexed read,
    only for budgeted tasks."""
    if not budget or not effective_estimate(budget, op.estimate or {}, kind=op.kind):
        return False
    return not BudgetHold.objects.filter(operation=op, status=BudgetHold.HELD).exists()


def record_usage_txn(
    *,
    meter_id: int,
    op: Operation | None,
    child: Task | None,
    number: int,
    value: int,
    source: str,
    actor: str,
    now: datetime,
) -> bool:
    """Post usage once: the unique key of the record refuses a second posting of the same
    invocation (a replayed report, a restarted worker), and only a new record moves the meter."""
    try:
        with transaction.atomic():  # a savepoint, so a refused duplicate leaves the caller intact
            UsageRecord.objects.create(
                meter_id=meter_id,
                operation=op,
                child_task=child,
                number=number,
                amount=value,
                source=source,
                actor=actor,
                at=now,
            )
    except IntegrityError:
        return False
    BudgetMeter.objects.filter(pk=meter_id).update(posted=F("posted") + value)
    if op is not None:
        _child_overrun_txn(meter_id)
    return True


def _child_overrun_txn(meter_id: int) -> None:
    """A child that spends past its allocation (a compensation is never refused for money, and
    a call may report more than it held) has spent its parent's money: the parent's hold for
    the child grows to what the child has spent (posted and unknown) as soon as it is posted,
    not when the child settles, so the parent admits nothing on money already gone. (What the
    child still holds is within its allocation: its reservations never pass its limit.) One
    read by primary key when the meter stays within its limit, the common case."""
    meter = (
        BudgetMeter.objects.filter(pk=meter_id)
        .values_list("task_id", "meter", "limit", "posted", "unknown")
        .first()
    )
    if meter is None:  # pragma: no cover - the caller just updated it
        return
    task_id, name, limit, posted, unknown = meter
    if posted + unknown <= limit:
        return
    hold = (
        BudgetHold.objects.select_for_update()
        .filter(child_task_id=task_id, status=BudgetHold.HELD, meter__meter=name)
        .values_list("pk", "meter_id", "amount")
        .first()
    )
    if hold is None:
        return  # not a child, or its allocation is already settled in the parent
    spent = (
        BudgetMeter.objects.filter(task_id=task_id, meter=name).aggregate(
            total=Sum(F("posted") + F("unknown"))
        )["total"]
        or 0
    )
    grow = spent - hold[2]
    if grow <= 0:
        return
    BudgetHold.objects.filter(pk=hold[0], status=BudgetHold.HELD).update(amount=spent)
    BudgetMeter.objects.filter(pk=hold[1]).update(reserved=F("reserved") + grow)


def budget_settle_txn(
    *,
    budget: Mapping[str, Any],
    op: Operation,
    number: int,
    usage: Mapping[str, Any],
    outcome: str,
    final: bool,
    source: str,
    actor: str,
    now: datetime,
    repeats_lost_call: bool = False,
) -> None:
    """Settle one accepted report of invocation ``number``.

    Observed usage is posted (idempotently). ``outcome`` ``unknown`` turns the held amounts into
    unknown (the call may have cost anything up to its hold); otherwise the hold is released:
    the call it covered is over and its usage posted. A retry's next call holds anew when it is
    dispatched, under the same guard as any admission (runtime.leases), so a retry can never
    spend past its attempt's limit, not even in an attempt a newer one replaced (whose limit
    shrank to what it had committed). A final settlement that confirms an effect whose earlier
    call was lost (replay, lookup: ``repeats_lost_call``) also settles those unknown amounts; a
    pure call repeated is a second execution, so what the lost one may have cost stays unknown.

    Preconditions: inside the caller's transaction, after the operation's transition."""
    if not budget:
        return
    observed = {name: amount(v) for name, v in usage.items() if name in budget}
    if "tool_calls" in budget and outcome != "unknown":
        observed.setdefault("tool_calls", 1)
    meters = dict(BudgetMeter.objects.filter(attempt_id=op.attempt_id).values_list("meter", "id"))
    for name in sorted(observed):
        if name in meters and observed[name] > 0:
            record_usage_txn(
                meter_id=meters[name],
                op=op,
                child=None,
                number=number,
                value=observed[name],
                source=source,
                actor=actor,
                now=now,
            )
    if outcome == "unknown":
        _holds_move_txn(op, BudgetHold.HELD, BudgetHold.UNKNOWN, actor=actor, now=now)
    else:
        _holds_move_txn(op, BudgetHold.HELD, BudgetHold.SETTLED, actor=actor, now=now)
        if final and outcome == "succeeded" and number > 1 and repeats_lost_call:
            # The effect is now confirmed with its usage posted: what a lost call might have cost
            # is the same effect (replayed or looked up), not a second liability.
            _holds_move_txn(op, BudgetHold.UNKNOWN, BudgetHold.SETTLED, actor=actor, now=now)


def budget_release_txn(
    *, budget: Mapping[str, Any], op: Operation, actor: str, now: datetime
) -> None:
    """Release the holds of work settled without a call (cancelled, expired, refused)."""
    if not budget:
        return
    _holds_move_txn(op, BudgetHold.HELD, BudgetHold.SETTLED, actor=actor, now=now)


def budget_mark_unknown_txn(
    *, budget: Mapping[str, Any], op: Operation, actor: str, now: datetime
) -> None:
    """A dispatched call's usage was lost (the lease expired without a report): what it held
    becomes unknown, never free."""
    if not budget:
        return
    _holds_move_txn(op, BudgetHold.HELD, BudgetHold.UNKNOWN, actor=actor, now=now)


def budget_resolve_txn(
    *, budget: Mapping[str, Any], op: Operation, effect: bool | None, actor: str, now: datetime
) -> None:
    """A person settled the operation: with an effect (``True``) its unknown amounts are posted
    as usage at their held value; without one (``False``) they are released; ``None`` (the
    outcome is still open, e.g. a retry under the same key) leaves them unknown."""
    if not budget or effect is None:
        return
    unknown = list(
        BudgetHold.objects.filter(operation=op, status=BudgetHold.UNKNOWN).order_by("meter_id")
    )
    for hold in unknown:
        if effect and hold.amount:
            record_usage_txn(
                meter_id=hold.meter_id,
                op=op,
                child=None,
                number=hold.number,
                value=hold.amount,
                source="person",
                actor=actor,
                now=now,
            )
    _holds_move_txn(op, BudgetHold.UNKNOWN, BudgetHold.SETTLED, actor=actor, now=now)


def _holds_move_txn(op: Operation, source: str, target: str, *, actor: str, now: datetime) -> None:
    """Move the operation's holds from one status to another, adjusting their meters. Each hold
    moves with a guarded UPDATE on its status, so a hold is counted out exactly once."""
    holds = list(
        BudgetHold.objects.filter(operation=op, status=source)
        .order_by("meter_id")
        .values_list("pk", "meter_id", "amount")
    )
    _move(holds, source, target, actor=actor, now=now)


def _move(
    holds: list[tuple[int, int, int]], source: str, target: str, *, actor: str, now: datetime
) -> None:
    column = {BudgetHold.HELD: "reserved", BudgetHold.UNKNOWN: "unknown"}
    for pk, meter_id, value in holds:
        moved = BudgetHold.objects.filter(pk=pk, status=source).update(
            status=target,
            settled_at=now if target == BudgetHold.SETTLED else None,
            settled_by=actor[:200],
        )
        if moved != 1 or not value:
            continue
        change: dict[str, Any] = {column[source]: F(column[source]) - value}
        if target in column:
            change[column[target]] = F(column[target]) + value
        BudgetMeter.objects.filter(pk=meter_id).update(**change)
