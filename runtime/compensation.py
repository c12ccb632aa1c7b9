"""Sagas: a compensation is a new operation with its own identity, key domain (compensation),
bounded attempts and its own unresolved disposition. It never erases the original's history: the
original moves succeeded -> compensating -> compensated, and both stay in the journal."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction

from runtime.actors import SAGA
from runtime.budgets import budget_reserve_txn, task_budget
from runtime.errors import BudgetExhausted, Conflict
from runtime.events import event_append_txn
from runtime.hashing import params_hash
from runtime.keys import key_compensation
from runtime.models import Event, Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn
from runtime.rules.statuses import OperationStatus
from runtime.tools import adapters
from runtime.transitions.insert import operation_insert_txn
from runtime.transitions.status import operation_transition_txn

S = OperationStatus
log = logging.getLogger(__name__)


class CompensationNotPossible(Conflict):
    """This operation has no compensating tool, or no known effect to compensate."""

    code = "compensation_not_possible"


def compensable(op: Operation) -> bool:
    """An original (not itself a compensation) whose tool names a compensating tool and whose
    effect is known (its result), so the compensation's parameters can be made from it. A
    success a person asserted without the receiver's result (``resolved_succeeded``: only the
    evidence) is not: its compensation cannot be derived, and is a person's to make."""
    adapter = adapters().get(op.tool)
    if not (
        adapter is not None
        and adapter.compensation_tool
        and op.compensates_id is None
        and isinstance(op.result, dict)
    ):
        return False
    try:
        adapter.compensation_params(op.result)
    except (KeyError, TypeError, ValueError):
        return False
    return True


def compensation_start_txn(original: Operation, *, actor: str, now: datetime) -> Operation:
    """Create the compensation of ``original`` and move the original to compensating.

    Preconditions: inside a transaction; ``original`` carries the status and state version the
    caller observed (succeeded, or unresolved with a known result)."""
    if not compensable(original):
        raise CompensationNotPossible(
            f"{original.tool} registers no compensating tool, or its effect is not known"
        )
    adapter = adapters()[original.tool]
    tool = adapters()[adapter.compensation_tool or ""]
    params: dict[str, Any] = adapter.compensation_params(original.result)
    operation_transition_txn(
        original, S.COMPENSATING, now=now, actor=actor, data={"reason": "compensation started"}
    )
    compensation = Operation(
        task_id=original.task_id,
        attempt_id=original.attempt_id,
        tool=tool.name,
        tool_version=tool.version,
        step=f"{original.step}:compensate"[:200],
        params=params,
        params_hash=params_hash(params),
        idempotency_key=key_compensation(
            original.idempotency_key, tool.name, original.compensations.count() + 1
        ),
        executor=Operation.EXECUTOR_WORKER,
        status=S.PENDING,
        max_attempts=tool.max_attempts,
        compensates=original,
        # Undoing costs about what doing did; the hold below is taken on this estimate.
        estimate=dict(original.estimate or {}),
    )
    operation_insert_txn(
        compensation,
        actor=actor,
        now=now,
        data={"tool": tool.name, "step": compensation.step, "compensates": original.pk},
    )
    _cleanup_hold_txn(compensation, now=now)
    outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=compensation.pk, now=now)
    return compensation


def _cleanup_hold_txn(compensation: Operation, *, now: datetime) -> None:
    """Hold the compensation's estimate, drawing on the cleanup reserve ordinary work may not
    touch (that is what the reserve is kept for). Cleanup is never refused for money: when even
    the reserve cannot cover it, it runs without a hold (in a savepoint, so nothing of the
    refused hold remains) and its observed usage is posted when it settles."""
    try:
        with transaction.atomic():
            budget_reserve_txn(
                budget=task_budget(compensation.task_id),
                op=compensation,
                number=0,
                now=now,
                cleanup=True,
            )
    except BudgetExhausted:
        log.warning("compensation %s runs without a hold: the budget is spent", compensation.pk)


def saga_next_txn(task_id: str, *, now: datetime) -> Operation | None:
    """Start the next compensation of a task being unwound, one at a time, newest effect first.
    Returns None when one is already under way or nothing is left to undo."""
    live = [s for s in S.ALL if s not in S.FINAL]
    if Operation.objects.filter(
        task_id=task_id, compensates__isnull=False, status__in=live
    ).exists():
        return None
    candidates = Operation.objects.filter(
        task_id=task_id, status=S.SUCCEEDED, compensates__isnull=True
    ).order_by("-updated_at", "-created_at")
    for op in candidates:
        if compensable(op):
            return compensation_start_txn(op, actor=SAGA, now=now)
    _undo_left_to_people_txn(task_id, candidates, now=now)
    return None


# The journal event that points people at an effect the saga cannot undo by itself.
UNDO_LEFT_TO_PERSON_EVENT = "operation.undo_left_to_person"


def _undo_left_to_people_txn(
    task_id: str, candidates: Iterable[Operation], *, now: datetime
) -> None:
    """The saga is done with what it can undo; a success whose tool names a compensation but
    whose result the saga cannot derive it from (a person asserted it with evidence only) is an
    effect nobody will undo unless told: say so once, in the task's journal, on the operation."""
    told = set(
        Event.objects.filter(task_id=task_id, type=UNDO_LEFT_TO_PERSON_EVENT).values_list(
            "operation_id", flat=True
        )
    )
    for op in candidates:
        adapter = adapters().get(op.tool)
        if op.pk in told or adapter is None or not adapter.compensation_tool:
            continue
        event_append_txn(
            task_id=task_id,
            type=UNDO_LEFT_TO_PERSON_EVENT,
            state_version=op.state_version,
            now=now,
            op=op,
            actor=SAGA,
            data={
                "compensation_tool": adapter.compensation_tool,
                "reason": "its success was asserted without the receiver's result, so its "
                "compensation cannot be made from it: undo it by hand",
            },
        )


def operation_and_original_lock_txn(op_id: str, original_id: str | None) -> None:
    """Lock a compensation together with the original it settles, in ascending id, before any
    task row: settling a compensation also moves its original."""
    if original_id:
        list(
            Operation.objects.select_for_update()
            .filter(pk__in=[op_id, original_id])
            .order_by("id")
            .values_list("pk", flat=True)
        )


def saga_wanted(task: Task) -> bool:
    return bool(task.outcome and task.outcome in (task.compensate_on or []))
