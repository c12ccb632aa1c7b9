"""What the one-statement forms (PostgreSQL) share: the operation row read back by column name,
the statements' slots (rendered from the rule tables), the journal hint and the announcement
published after the commit, and the exceptions that roll a statement's transaction back.

Each statement (``claim_one`` in ``runtime.transitions.claim``, ``accept_one`` in ``accept``,
``propose_one`` in ``propose``, the drainers' batches in ``claim_batch`` and ``accept_batch``,
``lock_pair`` in ``handover``) covers the common case only and touches nothing otherwise (zero
rows): the caller then runs the general writer (plain ORM statements, which is also what the
embedded SQLite mode always runs), which settles, refuses or records whatever made the common
case not apply. Both paths write the same rows; the statement-count and recovery tests run
against both. The proposal is the exception: it inserts before it can lock the task row (lock
order), so when the task refuses new work it fails the statement instead (``runtime_refuse``,
migration 0012), which undoes the insert; it can therefore run as its own transaction
(autocommit).

What these statements leave to the general writers, because only those carry its side effects,
is one table, ``runtime.rules.general_writer``: each form asks ``general_writer_needed`` before
it acts, and its statement guards with the same rows' SQL (the budget ledger, compensations,
gated work, unresolved calls, endings the possible-effect rule must decide). A task without a
budget keeps the pinned statement counts.

Locks: each CTE chain updates the operation row first and only then the task row (the task CTE
reads the operation CTE's RETURNING, which forces that order): the global lock order. Every
status set written into the SQL is taken from ``runtime.rules.statuses`` when the statements
load, and ``tests/runtime/test_hotpath.py`` checks each guarded source set against
``OPERATION.sources_of(target)``. The statements are SQL files (``runtime/sql/claim.sql``,
``accept.sql``, ``propose.sql``, ``handover.sql``, the journal, outbox and invocation rows in
``journal.sql``), filled from the tables once at import (``runtime.sqlfiles``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from runtime.drainers import announce_or_push, drain_announce, queue_of
from runtime.events import JOURNAL_SLOTS, TaskRow, event_committed, event_hint
from runtime.logcontext import transition_fields, transition_log
from runtime.models import Operation, OutboxMessage
from runtime.outbox import outbox_payload_dict, outbox_publish
from runtime.publish import EXECUTE_OPERATION, message_now
from runtime.rules.admission import admission_refusal_sql
from runtime.rules.claim import (
    CLAIM_SOURCES,
    Settles,
    TaskState,
    claim_guards_sql,
    task_lock_refusal,
)
from runtime.rules.general_writer import general_writer_sql
from runtime.rules.statuses import OperationStatus
from runtime.rules.stop import not_stopping_sql
from runtime.sqlfiles import column_list
from runtime.transitions.status import status_deltas

S = OperationStatus


def in_list(statuses: tuple[str, ...] | list[str]) -> str:
    # Literals from the transition tables' constants only (never from input).
    return "(" + ", ".join(f"'{s}'" for s in statuses) + ")"


# Every column of the operation row, in the model's field order: a statement that returns an
# operation returns all of them, and the model is built from them in that order
# (Model.from_db), not field by field from keywords, which cost a worker more than the
# batch's array parameters.
OP_NAMES = tuple(f.column for f in Operation._meta.concrete_fields)


OP_ATTNAMES = tuple(f.attname for f in Operation._meta.concrete_fields)


_JSON_COLUMNS = ("params", "estimate", "result", "error")


_JSON_INDEXES = tuple(i for i, name in enumerate(OP_NAMES) if name in _JSON_COLUMNS)


# The slots of every one-statement form: the statuses, the claim's sources and guards
# (runtime.rules.claim), what each leaves to the general writer (runtime.rules.general_writer),
# the stop rule, the admission refusals.
SLOTS = {
    **JOURNAL_SLOTS,
    "pending": S.PENDING,
    "running": S.RUNNING,
    "claim_sources": in_list(CLAIM_SOURCES),
    "claim_guards": claim_guards_sql,
    "general_writer_not_needed": general_writer_sql,
    "not_stopping": not_stopping_sql,
    "admission_refusal": admission_refusal_sql,
    "operation_columns": lambda alias: column_list(OP_NAMES, alias),
}


def deltas_params(source: str | None, target: str) -> dict[str, int]:
    a, c, b = status_deltas(source, target)
    return {"d_active": a, "d_claimable": c, "d_blocked": b}


def operation_of_row(row: dict[str, Any]) -> Operation:
    """An operation from a statement's row, by the names of its columns (``OP_NAMES``)."""
    values = [row[name] for name in OP_NAMES]
    for i in _JSON_INDEXES:
        # Django has psycopg hand jsonb over as text (its JSONField decodes it).
        if isinstance(values[i], str):
            values[i] = json.loads(values[i])
    return Operation.from_db(connection.alias, OP_ATTNAMES, values)


def hint_after_commit(
    task: TaskRow, event_type: str, op: Operation, actor: str, data: dict[str, Any] | None = None
) -> None:
    """The event's log line (about ``op`` as the statement left it, by ``actor``) and the live
    readers' hint, once the statement's transaction commits."""
    logged = transition_fields(event_type, task_id=op.task_id, actor=actor, op=op, data=data)
    transaction.on_commit(lambda: event_committed(task.id, task.event_seq, event_type, logged))


def hint_seq_after_commit(task_id: str, seq: int, event_type: str) -> None:
    transaction.on_commit(lambda: event_hint(task_id, seq, event_type))


def log_after_commit(logged: list[dict[str, Any]]) -> None:
    """A batch's events' log lines, one per event, once the batch commits."""

    def lines() -> None:
        for fields in logged:
            transition_log(fields)

    transaction.on_commit(lines)


def announcement(
    outbox_id: int,
    operation_id: str,
    available_at: datetime,
    now: datetime,
    trace: dict[str, str] | None = None,
) -> OutboxMessage:
    """The outbox row a statement wrote (``outbox_announce``), as the relay publishes it
    (``trace``: the payload it was written with, runtime.outbox.outbox_payload_dict)."""
    return OutboxMessage(
        pk=outbox_id,
        topic="operation.execute",
        operation_id=operation_id,
        payload=trace or {},
        created_at=now,
        available_at=available_at,
    )


def publish_after_commit(
    outbox_id: int | None,
    op: Operation,
    available_at: datetime,
    now: datetime,
    *,
    drained: bool = False,
    single: bool = False,
) -> None:
    """Hand the outbox row the statement wrote to the relay once it commits; a call a drainer
    may take (``drained``: in a batch, or ``single``, one at a time) goes to its queue's
    drainer instead when one is registered, asked after the commit (the order
    runtime.drainers depends on). A call due now is announced in one round trip: the drainers'
    look and, failing that, its message's push are one script (drainers.announce_or_push)."""
    if outbox_id is None:
        return
    queue = queue_of(op.tool)
    # What the statement's row keeps (its trace context, its request id): the commit may come
    # after the statement's span.
    trace = outbox_payload_dict()

    def publish() -> None:
        due = available_at <= now
        message = (
            message_now(EXECUTE_OPERATION, op.pk, outbox_id, queue=queue, trace=trace)
            if due
            else None
        )
        if message is None:
            if drained and drain_announce(queue, op.pk, single=single):
                return
        elif announce_or_push(op.pk, message, drained=drained, single=single) is not None:
            return
        # Redis failed the script (not asked again), or no drainer took the call: Celery's
        # publish, whose failure the sweeper covers.
        outbox_publish([announcement(outbox_id, op.pk, available_at, now, trace)], {op.pk: queue})

    transaction.on_commit(publish)


class StoppedUnderLock(Exception):
    """The task's stop committed while the statement waited for the task row: the caller rolls
    the whole transaction back and takes the general path, which settles for the stop."""


class PausedUnderLock(Exception):
    """The task's pause committed while the statement waited for the task row: the caller rolls
    the whole transaction back and refuses the delivery (runtime.control's pause hook)."""


def task_lock_check(task: TaskState, *, cleanup: bool = False) -> None:
    """Apply the claim's rows that are re-read under the task's row lock (runtime.rules.claim
    ``UNDER_TASK_LOCK``): raise StoppedUnderLock or PausedUnderLock as the first that refuses
    settles. ``cleanup``: the claimed work is a compensation, which a stop or pause spares."""
    refused = task_lock_refusal(task, cleanup=cleanup)
    if refused is None:
        return
    raise {Settles.STOP: StoppedUnderLock, Settles.REFUSE_PAUSED: PausedUnderLock}[refused.outcome]


class BatchStopped(Exception):
    """A task of the batch stopped or paused while the batch waited for its row: the caller
    rolls the batch back and runs each of its operations on the one-operation path."""
