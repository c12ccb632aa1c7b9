"""The one insert of a new operation, whoever proposes it (a tool's proposal, a wait or a
timer, a saga's compensation): the row, and its ``operation.proposed`` event with the task's
counters moved for its status, in the caller's transaction."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from runtime.events import TaskRow, event_append_txn
from runtime.models import Operation
from runtime.transitions.status import status_deltas


def operation_insert_txn(
    op: Operation,
    *,
    actor: str,
    now: datetime,
    data: dict[str, Any],
    registered: Callable[[], None] | None = None,
) -> TaskRow:
    """Insert ``op`` (built, unsaved, in its first status) and journal its proposal (``data``
    beside it); returns the task row as the journal statement locked and left it (the caller
    checks admission on it). ``registered`` runs between the insert and the journal (a wait's
    crash point and attempt check).

    Preconditions: inside a transaction; the new row is nobody else's yet, so taking the task's
    lock after it (through the journal) keeps the global order."""
    op.save(force_insert=True)
    if registered is not None:
        registered()
    _, row = event_append_txn(
        task_id=op.task_id,
        type="operation.proposed",
        state_version=op.state_version,
        now=now,
        deltas=status_deltas(None, op.status),
        op=op,
        actor=actor,
        data=data,
    )
    return row
