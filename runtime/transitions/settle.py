"""Settling work that is not running: cancelled, expired, refused or exhausted
(``operation_settle_txn``), or stopped with its task (``operation_stop_txn``), with what the
settling sets in motion (runtime.reactor)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.budgets import budget_release_txn, task_budget
from runtime.models import Operation
from runtime.outbox import outbox_consume_txn
from runtime.reactor import operation_settled_txn
from runtime.rules.statuses import OperationStatus
from runtime.stoprule import STOPPED_UNCONFIRMED_EVENT, stop_target, unconfirmed_calls_txn
from runtime.transitions.status import operation_transition_txn

S = OperationStatus


def operation_settle_txn(
    op: Operation,
    target: str,
    *,
    now: datetime,
    reason: str,
    actor: str,
    fields: dict[str, Any] | None = None,
    event_type: str | None = None,
) -> None:
    """Settle work that is not running (cancelled, expired, refused, exhausted): the guarded
    transition, its announcements consumed, and whatever the settling sets in motion (a
    stopping task may now be quiescent). Inside the caller's transaction. An ending over a call
    whose outcome is unconfirmed is written ``unresolved`` by the writer (its possible-effect
    rule); the holds released here are only those still held, so what a lost call held stays
    ``unknown`` for the person who resolves it."""
    transitioned = operation_transition_txn(
        op,
        target,
        now=now,
        actor=actor,
        fields={"status_reason": reason, **(fields or {})},
        data={"reason": reason},
        event_type=event_type,
    )
    outbox_consume_txn(op.pk)
    # Limits: work settled without a call gives its hold back.
    budget_release_txn(budget=task_budget(op.task_id), op=op, actor=actor, now=now)
    operation_settled_txn(op, transitioned.task, now=now, actor=actor)


def operation_stop_txn(op: Operation, *, now: datetime, actor: str, reason: str) -> str:
    """Settle covered work that is not running for its task's stop (runtime.stoprule): cancelled,
    or unresolved, for a person, when a call of it may have had an effect nobody confirmed; its
    unknown budget amounts then stay unknown until that person resolves it. Returns the status.

    Preconditions: inside the caller's transaction, which has seen the task's stop (a stop is
    final); ``op`` carries the status and state version it was read with (the guarded UPDATE
    refuses otherwise: TransitionRejected)."""
    target = stop_target(op.tool, unconfirmed=op.pk in unconfirmed_calls_txn([op.pk]))
    if target == S.UNRESOLVED:
        reason = f"{reason}; an earlier call's outcome is unconfirmed"
        operation_settle_txn(
            op,
            target,
            now=now,
            actor=actor,
            reason=reason,
            fields={"error": {"kind": "unknown", "message": reason}, "next_attempt_at": None},
            event_type=STOPPED_UNCONFIRMED_EVENT,
        )
    else:
        operation_settle_txn(op, target, now=now, actor=actor, reason=reason)
    return target
