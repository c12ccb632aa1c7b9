"""The hot path on PostgreSQL: propose, claim and accept each as ONE guarded statement (a
data-modifying CTE), carrying the operation's transition, the task's counters and condition,
the journal event, the invocation and the outbox row in one round trip.

Each statement covers the common case only and touches nothing otherwise (zero rows): the
caller then runs the general path (``runtime.leases`` / ``runtime.operations``, plain ORM
statements, which is also what the embedded SQLite mode always runs), which settles, refuses
or records whatever made the common case not apply. Both paths write the same rows; the
statement-count and recovery tests run against both. The proposal is the exception: it
inserts before it can lock the task row (lock order), so when the task refuses new work it
fails the statement instead (``runtime_refuse``, migration 0012), which undoes the insert; it
can therefore run as its own transaction (autocommit).

What these statements leave to the general writers, because only those carry its side
effects, is one table, ``runtime.rules.general_writer``: each form asks
``general_writer_needed`` before it acts, and its statement guards with the same rows' SQL. The
budget ledger is one such case: a task with a budget declines proposal and acceptance to the
general path (its guarded meter UPDATEs hold and settle in the same transaction, so concurrent
admissions never pass a limit), and the claim statement covers a budgeted task's first
dispatch only (a re-dispatch may have to hold again). A task without a budget keeps the pinned
statement counts. Compensations, unresolved calls and endings the possible-effect rule must
decide are the others.

Locks: each CTE chain updates the operation row first and only then the task row (the task
CTE reads the operation CTE's RETURNING, which forces that order): the global lock order.
The transition tables stay the one description of what is allowed: every status set written
into the SQL is taken from ``runtime.rules.statuses`` when this module loads, and
``tests/runtime/test_hotpath.py`` checks each guarded source set against
``OPERATION.sources_of(target)``.

People in the loop: the claim statement takes no work that needs an approval
(``approval_required``: the general claim rechecks and releases the covering approval) and no
work of a paused task (the general claim refuses and spends the announcement; a pause that
commits while the statement waits for the task row raises ``PausedUnderLock``). A proposal the
tool's policy gates never uses the proposal statement: ``runtime.operations`` creates it
``waiting_approval`` with its pending approval and no outbox row on the general path.

The statements are SQL files (``runtime/sql/claim.sql``, ``accept.sql``, ``propose.sql``,
``handover.sql``, with the journal, outbox and invocation rows in ``journal.sql``), filled
from the tables once at import (``runtime.sqlfiles``); their rows are read by column name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from psycopg.types.json import Jsonb

from runtime import dialect
from runtime.attempts import AttemptMoved
from runtime.budgets import budget_remember
from runtime.db import fetchall_named, fetchone_named, prepared_cursor, refusal_code
from runtime.drainers import (
    announce_or_push,
    call_drained_singly,
    call_quick,
    drain_announce,
    queue_of,
)
from runtime.events import JOURNAL_SLOTS, TaskRow, event_hint, task_row
from runtime.models import Operation, OutboxMessage
from runtime.outbox import outbox_publish
from runtime.publish import EXECUTE_OPERATION, message_now
from runtime.rules.admission import admission_refusal_sql, admission_refused
from runtime.rules.claim import CLAIM_SOURCES, claim_guards_sql
from runtime.rules.general_writer import general_writer_sql
from runtime.rules.statuses import OperationStatus
from runtime.rules.stop import not_stopping_sql, stopping
from runtime.sqlfiles import column_list, queries
from runtime.statemachine import status_deltas

S = OperationStatus


def _in(statuses: tuple[str, ...] | list[str]) -> str:
    # Literals from the transition tables' constants only (never from input).
    return "(" + ", ".join(f"'{s}'" for s in statuses) + ")"


# Every column of the operation row, in the model's field order: a statement that returns an
# operation returns all of them, and the model is built from them in that order
# (Model.from_db), not field by field from keywords, which cost a worker more than the
# batch's array parameters.
_OP_NAMES = tuple(f.column for f in Operation._meta.concrete_fields)
_OP_ATTNAMES = tuple(f.attname for f in Operation._meta.concrete_fields)
_JSON_COLUMNS = ("params", "estimate", "result", "error")
_JSON_INDEXES = tuple(i for i, name in enumerate(_OP_NAMES) if name in _JSON_COLUMNS)

# The statements (runtime/sql/claim.sql, accept.sql, propose.sql, handover.sql), filled once
# from the tables: the statuses, the claim's sources and guards (runtime.rules.claim), what
# each leaves to the general writer (runtime.rules.general_writer), the stop rule, the
# admission refusals.
_SQL = queries(
    "claim_one",
    "claim_batch_pick",
    "claim_batch_journal",
    "lock_pair",
    "accept_one",
    "accept_batch_pick",
    "accept_batch_journal",
    "propose_one",
    slots={
        **JOURNAL_SLOTS,
        "pending": S.PENDING,
        "running": S.RUNNING,
        "claim_sources": _in(CLAIM_SOURCES),
        "claim_guards": claim_guards_sql,
        "general_writer_not_needed": general_writer_sql,
        "not_stopping": not_stopping_sql,
        "admission_refusal": admission_refusal_sql,
        "operation_columns": lambda alias: column_list(_OP_NAMES, alias),
    },
)


def enabled() -> bool:
    """``dialect.one_statement_forms()``, under the name the simulation still calls it by
    (runtime/simulation/world.py); the runtime asks the dialect."""
    return dialect.one_statement_forms()


def _deltas(source: str | None, target: str) -> dict[str, int]:
    a, c, b = status_deltas(source, target)
    return {"d_active": a, "d_claimable": c, "d_blocked": b}


def _operation(row: dict[str, Any]) -> Operation:
    """An operation from a statement's row, by the names of its columns (``_OP_NAMES``)."""
    values = [row[name] for name in _OP_NAMES]
    for i in _JSON_INDEXES:
        # Django has psycopg hand jsonb over as text (its JSONField decodes it).
        if isinstance(values[i], str):
            values[i] = json.loads(values[i])
    return Operation.from_db(connection.alias, _OP_ATTNAMES, values)


def _stopping(task: TaskRow) -> bool:
    return stopping(task.cancellation, task.condition)


def _hint_after_commit(task: TaskRow, event_type: str) -> None:
    transaction.on_commit(lambda: event_hint(task.id, task.event_seq, event_type))


def _announcement(
    outbox_id: int, operation_id: str, available_at: datetime, now: datetime
) -> OutboxMessage:
    """The outbox row a statement wrote (``outbox_announce``), as the relay publishes it."""
    return OutboxMessage(
        pk=outbox_id,
        topic="operation.execute",
        operation_id=operation_id,
        created_at=now,
        available_at=available_at,
    )


def _publish_after_commit(
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

    def publish() -> None:
        due = available_at <= now
        message = message_now(EXECUTE_OPERATION, op.pk, outbox_id, queue=queue) if due else None
        if message is None:
            if drained and drain_announce(queue, op.pk, single=single):
                return
        elif announce_or_push(op.pk, message, drained=drained, single=single) is not None:
            return
        # Redis failed the script (not asked again), or no drainer took the call: Celery's
        # publish, whose failure the sweeper covers.
        outbox_publish([_announcement(outbox_id, op.pk, available_at, now)], {op.pk: queue})

    transaction.on_commit(publish)


class StoppedUnderLock(Exception):
    """The task's stop committed while the statement waited for the task row: the caller rolls
    the whole transaction back and takes the general path, which settles for the stop."""


class PausedUnderLock(Exception):
    """The task's pause committed while the statement waited for the task row: the caller rolls
    the whole transaction back and refuses the delivery (runtime.control's pause hook)."""


# --- claim ------------------------------------------------------------------------------------


def claim_txn(
    operation_id: str,
    *,
    execution_id: str,
    executor: str,
    lease_seconds: int,
    token_digest: str,
    supported: list[str],
    actor: str,
    now: datetime,
) -> Operation | None:
    """The common claim in one statement: a due, unstopped, unpaused, ungated, in-deadline,
    supported operation with
    attempts left moves to running under the next generation, with its event, its invocation and
    its outbox rows consumed. A re-dispatch of a budgeted task's operation is not covered (it may
    have to hold its estimate again after a lost call: the general path's ledger check). Returns
    the claimed operation as it now is, or None when the common case does not apply (nothing was
    written). Inside the caller's transaction; raises
    StoppedUnderLock when the task's stop won the race for the task row."""
    params = {
        "id": operation_id,
        "executor": executor,
        "execution": execution_id,
        "lease_seconds": lease_seconds,
        "digest": token_digest,
        "supported": supported,
        "now": now,
        "event_type": "operation.claimed",
        "actor": actor,
        **_deltas(S.PENDING, S.RUNNING),
    }
    params["event_data"] = Jsonb({"to": S.RUNNING, "status": S.RUNNING, "execution": execution_id})
    with prepared_cursor() as cur:
        cur.execute(_SQL["claim_one"], params)  # type: ignore[arg-type]
        row = fetchone_named(cur)
    if row is None:
        return None
    op = _operation(row)
    task = task_row(row, "task__")
    # Limits: the task's (immutable) budget rides along, so settling needs no statement.
    budget = row["task_budget"]
    budget_remember(op.task_id, json.loads(budget) if isinstance(budget, str) else budget)
    if _stopping(task):
        raise StoppedUnderLock
    if task.paused:
        raise PausedUnderLock
    _hint_after_commit(task, "operation.claimed")
    return op


# --- hand-over (a drainer's acceptance and next claim in one transaction) ---------------------


def lock_pair_txn(operation_ids: list[str]) -> None:
    """Lock ``operation_ids`` and their tasks in the global order (operations in ascending id,
    then tasks in ascending id), inside the caller's transaction: what a transaction that runs
    two writers over different operations takes first, so neither writer locks out of order
    (two drainers handing over across two tasks in opposite directions would deadlock)."""
    with prepared_cursor() as cur:
        cur.execute(_SQL["lock_pair"], {"ids": operation_ids})  # type: ignore[arg-type]
        cur.fetchall()


# --- acceptance --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Acceptance:
    """What one report does to a running operation, decided in Python from the claim's snapshot
    (``runtime.operations.report_decision``) and written by one statement."""

    target: str
    edge: str
    result: Any
    error: Any
    next_attempt_at: datetime | None
    invocation_outcome: str
    receipt: Any
    provider_handle: str
    data: dict[str, Any]
    status_reason: str | None = None


def accept_txn(
    op: Operation,
    *,
    lease_token_digest: str,
    acceptance: Acceptance,
    actor: str,
    now: datetime,
) -> TaskRow | None:
    """Accept a report on a covered operation of an unstopped task in one statement. ``op`` is
    the claim's snapshot (status running at its generation and state version). Returns the
    task as the statement left it, or None when the row moved on, the task is stopping, or the
    operation is a compensation (or the decision needs a reason recorded, which only a stopping
    task gives): nothing was written and the caller takes the general path.
    Raises StoppedUnderLock when a stop committed while the statement waited for the task."""
    announce = acceptance.target == S.RETRY_SCHEDULED and op.executor == Operation.EXECUTOR_WORKER
    params = {
        "id": op.pk,
        "target": acceptance.target,
        "generation": op.lease_generation,
        "state_version": op.state_version,
        "digest": lease_token_digest,
        "result": None if acceptance.result is None else Jsonb(acceptance.result),
        "error": None if acceptance.error is None else Jsonb(acceptance.error),
        "next_at": acceptance.next_attempt_at,
        "inv_outcome": acceptance.invocation_outcome,
        "receipt": None if acceptance.receipt is None else Jsonb(acceptance.receipt),
        "handle": acceptance.provider_handle[:300],
        "announce": announce,
        "now": now,
        "event_type": f"operation.{acceptance.edge}",
        "actor": actor,
        "event_data": Jsonb(
            {"from": S.RUNNING, "to": acceptance.target, "status": acceptance.target}
            | acceptance.data
        ),
        **_deltas(S.RUNNING, acceptance.target),
    }
    with prepared_cursor() as cur:
        cur.execute(_SQL["accept_one"], params)  # type: ignore[arg-type]
        row = fetchone_named(cur)
    if row is None:
        return None
    task = task_row(row)
    if _stopping(task):
        raise StoppedUnderLock
    _hint_after_commit(task, f"operation.{acceptance.edge}")
    _publish_after_commit(row["outbox_id"], op, acceptance.next_attempt_at or now, now)
    return task


# --- proposal ----------------------------------------------------------------------------------


def propose_txn(op: Operation, *, actor: str, now: datetime) -> TaskRow | None:
    """Insert a new pending operation (built, unsaved, by the caller) with its event and, for
    worker-run work, its outbox row, in one statement, which checks admission on the task row it
    locked (rules.admission.ADMISSION_REFUSALS) and fails, writing nothing, when the task
    refuses: TaskRefused; AttemptMoved when the task's current attempt is no longer
    ``op.attempt_id`` under the lock (the statement wrote nothing but did not fail). None when
    an operation with the same key exists already (nothing written: the caller compares
    parameter hashes). Runs inside the caller's transaction, or as its own (autocommit); its
    announcement goes out after that commit."""
    announce = op.executor == Operation.EXECUTOR_WORKER
    # A call goes to its queue's drainer when one is registered (runtime.drainers): a quick one
    # to be claimed in a batch, another to be run one at a time.
    quick = announce and call_quick(op.tool, op.params)
    single = announce and not quick and call_drained_singly(op.tool, op.kind)
    params = {
        "id": op.pk,
        "task_id": op.task_id,
        "attempt_id": op.attempt_id,
        "kind": op.kind,
        "tool": op.tool,
        "tool_version": op.tool_version,
        "step": op.step,
        "intent_version": op.intent_version,
        "params": Jsonb(op.params),
        "params_hash": op.params_hash,
        "key": op.idempotency_key,
        "executor": op.executor,
        "max_attempts": op.max_attempts,
        "deadline": op.deadline,
        "estimate": Jsonb(op.estimate),
        "signal": op.signal,
        "timeout_seconds": op.timeout_seconds,
        "announce": announce,
        "now": now,
        "event_type": "operation.proposed",
        "actor": actor,
        "event_data": Jsonb(
            {"tool": op.tool, "step": op.step, "status": S.PENDING, "kind": op.kind}
        ),
        **_deltas(None, S.PENDING),
    }
    try:
        with prepared_cursor() as cur:
            cur.execute(_SQL["propose_one"], params)  # type: ignore[arg-type]
            row = fetchone_named(cur)
    except DatabaseError as exc:
        code = refusal_code(exc)
        if code is None:
            raise
        raise admission_refused(code) from None
    if row is None:
        return None
    if row["id"] is None:
        # The attempt moved: the statement wrote nothing and did not fail, so the caller's
        # transaction stays usable for the proposal made again under the new attempt.
        raise AttemptMoved
    task = task_row(row)
    op.state_version = 1
    op.created_at = op.updated_at = now
    _hint_after_commit(task, "operation.proposed")
    _publish_after_commit(row["outbox_id"], op, now, now, drained=quick or single, single=single)
    return task


# --- batches (drainers) --------------------------------------------------------------------
#
# A drainer (runtime.drainers) claims several quick calls in one transaction and accepts
# their reports in one more, so a burst costs two commits per batch instead of two per
# operation. Each batch is two statements: the operations' guarded UPDATE, whose result is
# joined to the task rows locked in ascending id (``ORDER BY t.id FOR UPDATE``: the rows are
# locked in that order, after the operation rows, which keeps the global lock order); then one
# statement for the tasks' counters and journal positions, the events, the invocations and the
# outbox rows. Anything a batch statement does not cover is left untouched and handed back to
# the caller, which runs the one-operation path for it.


class BatchStopped(Exception):
    """A task of the batch stopped or paused while the batch waited for its row: the caller
    rolls the batch back and runs each of its operations on the one-operation path."""


def claim_batch_txn(
    operation_ids: list[str],
    *,
    tools: list[str],
    execution_id: str,
    lease_seconds: int,
    token_digest: str,
    actor: str,
    now: datetime,
) -> list[Operation]:
    """Claim those of ``operation_ids`` that are due, claimable, of a tool:version in ``tools``,
    of unstopped, unpaused, unbudgeted tasks, each under its next lease generation with
    ``token_digest``, skipping rows another claimant holds. Inside the caller's
    transaction; returns the claimed operations as they now are. Raises BatchStopped (the
    caller rolls back) when a task stopped or paused while the batch waited for its row."""
    claim: dict[str, Any] = {
        "ids": operation_ids,
        "executor": Operation.EXECUTOR_WORKER,
        "tools": tools,
        "execution": execution_id,
        "lease_seconds": lease_seconds,
        "digest": token_digest,
        "now": now,
    }
    with prepared_cursor() as cur:
        cur.execute(_SQL["claim_batch_pick"], claim)  # type: ignore[arg-type]
        rows = fetchall_named(cur)
        if not rows:
            return []
        ops = [_operation(row) for row in rows]
        if any(stopping(row["cancellation"], row["condition"]) or row["paused"] for row in rows):
            raise BatchStopped
        froms = [row["from_status"] for row in rows]
        claimed: dict[str, Any] = {
            "ids": [op.pk for op in ops],
            "tasks": [op.task_id for op in ops],
            "versions": [op.state_version for op in ops],
            "generations": [op.lease_generation for op in ops],
            "attempts": [op.attempts_used for op in ops],
            "froms": froms,
            "now": now,
            "actor": actor,
            "execution": execution_id,
            "event_data": Jsonb({"to": S.RUNNING, "status": S.RUNNING, "execution": execution_id}),
            **_deltas(S.PENDING, S.RUNNING),
        }
        cur.execute(_SQL["claim_batch_journal"], claimed)  # type: ignore[arg-type]
        touched = fetchall_named(cur)
    for op in ops:
        budget_remember(op.task_id, {})
    for task in touched:
        _hint_seq_after_commit(task["id"], task["event_seq"], "operation.claimed")
    return ops


def _hint_seq_after_commit(task_id: str, seq: int, event_type: str) -> None:
    transaction.on_commit(lambda: event_hint(task_id, seq, event_type))


def accept_batch_txn(
    accepted: list[tuple[Operation, Acceptance]],
    *,
    lease_token_digest: str,
    actor: str,
    now: datetime,
) -> list[str]:
    """Accept a batch's reports, each decided from its claim's snapshot, on covered operations
    of unstopped tasks. Inside the caller's transaction; returns the ids accepted (the rest
    moved on: nothing was written for them, and the caller runs the one-operation path).
    Raises BatchStopped (the caller rolls back) when a task of the batch is stopping."""
    if not accepted:
        return []
    with prepared_cursor() as cur:
        cur.execute(
            _SQL["accept_batch_pick"],
            {
                "ids": [op.pk for op, _ in accepted],
                "targets": [a.target for _, a in accepted],
                "results": [None if a.result is None else Jsonb(a.result) for _, a in accepted],
                "errors": [None if a.error is None else Jsonb(a.error) for _, a in accepted],
                "next_ats": [a.next_attempt_at for _, a in accepted],
                "generations": [op.lease_generation for op, _ in accepted],
                "versions": [op.state_version for op, _ in accepted],
                "digest": lease_token_digest,
                "now": now,
            },
        )
        rows = fetchall_named(cur)
        if any(stopping(row["cancellation"], row["condition"]) for row in rows):
            raise BatchStopped
        done = {row["id"] for row in rows}
        batch = [(op, a) for op, a in accepted if op.pk in done]
        if not batch:
            return []
        deltas = [status_deltas(S.RUNNING, a.target) for _, a in batch]
        cur.execute(
            _SQL["accept_batch_journal"],
            {
                "ids": [op.pk for op, _ in batch],
                "tasks": [op.task_id for op, _ in batch],
                "versions": [op.state_version + 1 for op, _ in batch],
                "generations": [op.lease_generation for op, _ in batch],
                "d_actives": [d[0] for d in deltas],
                "d_claimables": [d[1] for d in deltas],
                "d_blockeds": [d[2] for d in deltas],
                "event_types": [f"operation.{a.edge}" for _, a in batch],
                "event_datas": [
                    Jsonb({"from": S.RUNNING, "to": a.target, "status": a.target} | a.data)
                    for _, a in batch
                ],
                "inv_outcomes": [a.invocation_outcome for _, a in batch],
                "receipts": [None if a.receipt is None else Jsonb(a.receipt) for _, a in batch],
                "handles": [a.provider_handle[:300] for _, a in batch],
                # (A batch holds worker-run calls only: a retry is announced again.)
                "announce_ats": [
                    (a.next_attempt_at or now) if a.target == S.RETRY_SCHEDULED else None
                    for _, a in batch
                ],
                "now": now,
                "actor": actor,
            },
        )
        out = fetchall_named(cur)
    edges = {op.task_id: f"operation.{a.edge}" for op, a in batch}
    announced = []
    for row in out:
        if row["kind"] == "task":
            _hint_seq_after_commit(row["key"], row["number"], edges[row["key"]])
        else:
            announced.append(_announcement(row["number"], row["key"], row["available_at"], now))
    if announced:
        queues = {op.pk: queue_of(op.tool) for op, _ in batch}
        transaction.on_commit(lambda: outbox_publish(announced, queues))
    return [op.pk for op, _ in batch]
