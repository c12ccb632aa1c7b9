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

The budget ledger is not in these statements: a task with a budget declines proposal and
acceptance to the general path (``ledger_needed``; its guarded meter UPDATEs hold and settle
in the same transaction, so concurrent admissions never pass a limit), and the claim statement
covers a budgeted task's first dispatch only (a re-dispatch may have to hold again). A task
without a budget keeps the pinned statement counts.

Locks: each CTE chain updates the operation row first and only then the task row (the task
CTE reads the operation CTE's RETURNING, which forces that order): the global lock order.
The transition tables stay the one description of what is allowed: every status set written
into the SQL is taken from ``runtime.transitions`` when this module loads, and
``tests/runtime/test_hotpath.py`` checks each guarded source set against
``OPERATION.sources_of(target)``.

People in the loop: the claim statement takes no work that needs an approval
(``approval_required``: the general claim rechecks and releases the covering approval) and no
work of a paused task (the general claim refuses and spends the announcement; a pause that
commits while the statement waits for the task row raises ``PausedUnderLock``). A proposal the
tool's policy gates never uses the proposal statement: ``runtime.operations`` creates it
``waiting_approval`` with its pending approval and no outbox row on the general path.
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
from runtime.db import prepared_cursor, refusal_code
from runtime.drainers import (
    announce_or_push,
    call_drained_singly,
    call_quick,
    drain_announce,
    queue_of,
)
from runtime.events import TaskRow, condition_case_sql, event_hint, task_touch_sql
from runtime.models import Operation, OutboxMessage
from runtime.outbox import outbox_publish
from runtime.publish import EXECUTE_OPERATION, message_now
from runtime.statemachine import status_deltas
from runtime.stoprule import not_stopping_sql, stopping
from runtime.tasks import admission_refusal_sql, admission_refused
from runtime.transitions import OPERATION, OperationStatus

S = OperationStatus


def _in(statuses: tuple[str, ...] | list[str]) -> str:
    # Literals from the transition tables' constants only (never from input).
    return "(" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _unindexed(condition: str) -> str:
    """``condition`` in a form no index can serve (a boolean test is not an index qualification).
    The statements that are handed their operations' ids guard status and compensation with it,
    so that their rows are found by id whatever the statistics say: a queue is often analysed
    while it holds no work, and the planner, believing few rows pending or running, would pick
    a status index for the prepared statement's generic plan and read every pending row on
    every claim (a burst's cost then grows with its square)."""
    return f"({condition}) IS TRUE"


# The guarded sources of each statement, from the tables.
CLAIM_SOURCES = tuple(sorted(OPERATION.sources_of(S.RUNNING) & set(S.CLAIMABLE)))

_TASK_TOUCH = task_touch_sql("(SELECT task_id FROM op)")

_EVENT = """
  INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
  SELECT task.id, task.event_seq, %(event_type)s, %(now)s, op.state_version, op.id, %(actor)s,
    %(event_data)s::jsonb || jsonb_build_object(
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM op, task
"""

# Every column of the operation row, in the model's field order: a statement that returns an
# operation returns all of them, and the model is built from them positionally (Model.from_db),
# not field by field from keywords, which cost a worker more than the batch's array parameters.
_OP_NAMES = tuple(f.column for f in Operation._meta.concrete_fields)
_OP_ATTNAMES = tuple(f.attname for f in Operation._meta.concrete_fields)
# The outbox row a statement writes for worker-run work (when %(announce)s), due at {available}.
_ANNOUNCE = """
  INSERT INTO runtime_outboxmessage
    (topic, operation_id, payload, created_at, available_at, publish_count)
  SELECT 'operation.execute', op.id, '{{}}'::jsonb, %(now)s, {available}, 0
  FROM op WHERE %(announce)s
  RETURNING id"""

_JSON_COLUMNS = ("params", "estimate", "result", "error")
_JSON_INDEXES = tuple(i for i, name in enumerate(_OP_NAMES) if name in _JSON_COLUMNS)
_TASK_NAMES = (
    "id",
    "event_seq",
    "condition",
    "outcome",
    "state_version",
    "cancellation",
    "paused",
    "deadline",
    "ops_active",
)


def enabled() -> bool:
    """``dialect.one_statement_forms()``, under the name the simulation still calls it by
    (runtime/simulation/world.py); the runtime asks the dialect."""
    return dialect.one_statement_forms()


def ledger_needed(budget: dict[str, Any] | None) -> bool:
    """Whether the task's budget makes the ledger part of a proposal or an acceptance. These
    statements carry no ledger: for a task with a budget the caller declines to the general
    path, whose guarded meter UPDATEs hold and settle in the same transaction
    (``runtime.budgets``). The claim statement declines by itself (see ``_CLAIM_SQL``)."""
    return bool(budget)


def _deltas(source: str | None, target: str) -> dict[str, int]:
    a, c, b = status_deltas(source, target)
    return {"d_active": a, "d_claimable": c, "d_blocked": b}


def _operation(values: tuple[Any, ...]) -> Operation:
    """An operation from a statement's RETURNING columns (``_OP_NAMES``, in that order)."""
    row = list(values)
    for i in _JSON_INDEXES:
        # Django has psycopg hand jsonb over as text (its JSONField decodes it).
        if isinstance(row[i], str):
            row[i] = json.loads(row[i])
    return Operation.from_db(connection.alias, _OP_ATTNAMES, row)


def _task_row(values: tuple[Any, ...]) -> TaskRow:
    row = dict(zip(_TASK_NAMES, values, strict=True))
    return TaskRow(**{**row, "paused": bool(row["paused"]), "ops_active": int(row["ops_active"])})


def _stopping(task: TaskRow) -> bool:
    return stopping(task.cancellation, task.condition)


def _hint_after_commit(task: TaskRow, event_type: str) -> None:
    transaction.on_commit(lambda: event_hint(task.id, task.event_seq, event_type))


def _announcement(
    outbox_id: int, operation_id: str, available_at: datetime, now: datetime
) -> OutboxMessage:
    """The outbox row a statement wrote (``_ANNOUNCE``), as the relay publishes it."""
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

# A claim's writes and guards, shared by the one-operation and the batch statements: the
# operation moves to running under its next lease generation, if it is due, unstopped,
# unpaused, ungated and in its deadline (``o`` the operation, ``t`` its task). The lease runs
# on the database's clock, the one the sweeper's takeover compares with (hosts' clocks differ).
_CLAIM_SET = f"""
    status = '{S.RUNNING}',
    state_version = o.state_version + 1,
    lease_generation = o.lease_generation + 1,
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease_seconds)s::float8),
    lease_token_digest = %(digest)s,
    execution_id = %(execution)s,
    attempts_used = o.attempts_used + 1,
    first_attempt_at = COALESCE(o.first_attempt_at, %(now)s),
    next_attempt_at = NULL,
    status_reason = '',
    cancel_requested = false,
    updated_at = %(now)s"""
_CLAIM_GUARDS = f"""{_unindexed(f"o.status IN {_in(CLAIM_SOURCES)}")}
    AND {_unindexed("o.compensates_id IS NULL")}
    AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= %(now)s)
    AND o.attempts_used < o.max_attempts
    AND {not_stopping_sql("t")}
    AND NOT o.approval_required AND NOT t.paused
    AND (COALESCE(o.deadline, t.deadline) IS NULL OR COALESCE(o.deadline, t.deadline) > %(now)s)"""

_CLAIM_SQL = f"""
WITH prev AS (
  -- The status the claim leaves, for the journal's "from" (as the general path writes it):
  -- read under the row's lock, so it is the version the UPDATE below replaces. Only a row the
  -- claim can take is locked (a duplicate delivery of running work locks nothing, so a batch
  -- claimer's SKIP LOCKED never skips a row for it), and with the UPDATE's own strength: FOR
  -- UPDATE would also block the key-share locks that rows inserted for the operation by
  -- other transactions take (events, invocations).
  SELECT id, status FROM runtime_operation
  WHERE id = %(id)s AND {_unindexed(f"status IN {_in(CLAIM_SOURCES)}")}
  FOR NO KEY UPDATE
), op AS (
  UPDATE runtime_operation o SET
{_CLAIM_SET}
  FROM runtime_task t, prev
  WHERE o.id = prev.id AND t.id = o.task_id
    AND o.executor = %(executor)s
    AND {_CLAIM_GUARDS}
    AND (%(executor)s <> 'worker' OR (o.tool || ':' || o.tool_version) = ANY(%(supported)s))
    AND (o.attempts_used = 0 OR t.budget = '{{}}'::jsonb)
  RETURNING {", ".join("o." + c for c in _OP_NAMES)}, t.budget AS task_budget,
    prev.status AS from_status
), task AS ({_TASK_TOUCH}
), ev AS (
  INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
  SELECT task.id, task.event_seq, %(event_type)s, %(now)s, op.state_version, op.id, %(actor)s,
    %(event_data)s::jsonb || jsonb_build_object(
      'from', op.from_status, 'lease_generation', op.lease_generation,
      'attempt', op.attempts_used,
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM op, task
), inv AS (
  INSERT INTO runtime_invocation
    (operation_id, number, lease_generation, execution_id, started_at, provider_handle)
  SELECT op.id, op.attempts_used, op.lease_generation, %(execution)s, %(now)s, '' FROM op
), spent AS (
  DELETE FROM runtime_outboxmessage WHERE operation_id = (SELECT id FROM op)
)
SELECT {", ".join("op." + c for c in _OP_NAMES)}, {", ".join("task." + c for c in _TASK_NAMES)},
  op.task_budget
FROM op, task
"""  # noqa: S608 (only constants are formatted in; every value is a bound parameter)


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
        cur.execute(_CLAIM_SQL, params)  # type: ignore[arg-type]
        row = cur.fetchone()
    if row is None:
        return None
    op = _operation(row[: len(_OP_NAMES)])
    task = _task_row(row[len(_OP_NAMES) : len(_OP_NAMES) + len(_TASK_NAMES)])
    # Limits: the task's (immutable) budget rides along, so settling needs no statement.
    budget = row[-1]
    budget_remember(op.task_id, json.loads(budget) if isinstance(budget, str) else budget)
    if _stopping(task):
        raise StoppedUnderLock
    if task.paused:
        raise PausedUnderLock
    _hint_after_commit(task, "operation.claimed")
    return op


# --- hand-over (a drainer's acceptance and next claim in one transaction) ---------------------

# Both operation rows in ascending id, then their tasks in ascending id: the global lock order
# for a transaction that accepts one operation and claims another (runtime.operations.
# operation_report_and_claim). The writers that follow re-lock what this holds. The join reads
# the whole locked CTE before the first task row is locked (a task row comes out of a join
# only once the operations are all read), and the tasks are locked in the order they come out.
_LOCK_PAIR_SQL = """
WITH o AS MATERIALIZED (
  SELECT id, task_id FROM runtime_operation WHERE id = ANY(%(ids)s::varchar[])
  ORDER BY id FOR NO KEY UPDATE
)
SELECT t.id FROM o JOIN runtime_task t ON t.id = o.task_id
ORDER BY t.id
FOR NO KEY UPDATE OF t
"""


def lock_pair_txn(operation_ids: list[str]) -> None:
    """Lock ``operation_ids`` and their tasks in the global order (operations in ascending id,
    then tasks in ascending id), inside the caller's transaction: what a transaction that runs
    two writers over different operations takes first, so neither writer locks out of order
    (two drainers handing over across two tasks in opposite directions would deadlock)."""
    with prepared_cursor() as cur:
        cur.execute(_LOCK_PAIR_SQL, {"ids": operation_ids})  # type: ignore[arg-type]
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


_ACCEPT_SQL = f"""
WITH op AS (
  UPDATE runtime_operation o SET
    status = %(target)s,
    state_version = o.state_version + 1,
    result = %(result)s,
    error = %(error)s,
    next_attempt_at = %(next_at)s,
    lease_expires_at = NULL,
    updated_at = %(now)s
  WHERE o.id = %(id)s AND {_unindexed(f"o.status = '{S.RUNNING}'")}
    AND o.lease_generation = %(generation)s AND o.state_version = %(state_version)s
    AND o.lease_token_digest = %(digest)s AND {_unindexed("o.compensates_id IS NULL")}
    AND EXISTS (
      SELECT 1 FROM runtime_task t WHERE t.id = o.task_id AND {not_stopping_sql("t")})
  RETURNING o.id, o.task_id, o.state_version
), task AS ({_TASK_TOUCH}
), ev AS ({_EVENT}
), inv AS (
  UPDATE runtime_invocation SET outcome = %(inv_outcome)s, finished_at = %(now)s,
    receipt = %(receipt)s, provider_handle = %(handle)s
  WHERE operation_id = (SELECT id FROM op) AND lease_generation = %(generation)s
), announce AS ({_ANNOUNCE.format(available="%(next_at)s")}
)
SELECT {", ".join("task." + c for c in _TASK_NAMES)}, (SELECT id FROM announce)
FROM op, task
"""  # noqa: S608


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
        cur.execute(_ACCEPT_SQL, params)  # type: ignore[arg-type]
        row = cur.fetchone()
    if row is None:
        return None
    task = _task_row(row[: len(_TASK_NAMES)])
    if _stopping(task):
        raise StoppedUnderLock
    _hint_after_commit(task, f"operation.{acceptance.edge}")
    _publish_after_commit(row[len(_TASK_NAMES)], op, acceptance.next_attempt_at or now, now)
    return task


# --- proposal ----------------------------------------------------------------------------------

# The proposal binds to the attempt read under the task's lock: ``cur`` locks the task row first
# (the new operation row is invisible to everyone else, so no lock order is at stake) and, read
# under that lock, inserts nothing when the current attempt is no longer the one the caller
# derived the key from (a new attempt committed meanwhile): the statement returns a row of NULLs
# instead, without failing, and the caller proposes again in the same transaction.
_PROPOSE_SQL = f"""
WITH cur AS (
  SELECT t.current_attempt_id = %(attempt_id)s AS same
  FROM runtime_task t WHERE t.id = %(task_id)s FOR NO KEY UPDATE
), op AS (
  INSERT INTO runtime_operation (
    id, task_id, attempt_id, kind, tool, tool_version, step, intent_version, params, params_hash,
    idempotency_key, executor, status, state_version, lease_generation, lease_token_digest,
    attempts_used, max_attempts, deadline, cancel_requested, estimate, signal, timeout_seconds,
    status_reason, approval_required, created_at, updated_at)
  SELECT
    %(id)s, %(task_id)s, %(attempt_id)s, %(kind)s, %(tool)s, %(tool_version)s,
    %(step)s, %(intent_version)s, %(params)s, %(params_hash)s, %(key)s, %(executor)s,
    '{S.PENDING}', 1, 0, '', 0, %(max_attempts)s, %(deadline)s, false, %(estimate)s,
    %(signal)s, %(timeout_seconds)s, '', false, %(now)s, %(now)s
  FROM cur WHERE cur.same
  ON CONFLICT ON CONSTRAINT operation_key_unique_per_task DO NOTHING
  RETURNING id, task_id, state_version
), task AS ({_TASK_TOUCH}
), ev AS ({_EVENT}
), announce AS ({_ANNOUNCE.format(available="%(now)s")}
)
SELECT {", ".join("task." + c for c in _TASK_NAMES)}, (SELECT id FROM announce),
  {admission_refusal_sql("task", "%(now)s")}
FROM op, task
UNION ALL
SELECT {", ".join("NULL" for _ in _TASK_NAMES)}, NULL, NULL FROM cur WHERE cur.same IS NOT TRUE
"""  # noqa: S608


def propose_txn(op: Operation, *, actor: str, now: datetime) -> TaskRow | None:
    """Insert a new pending operation (built, unsaved, by the caller) with its event and, for
    worker-run work, its outbox row, in one statement, which checks admission on the task row
    it locked (tasks.ADMISSION_REFUSALS) and fails, writing nothing, when the task refuses:
    TaskRefused; AttemptMoved when the task's current attempt is no longer ``op.attempt_id``
    under the lock (the statement wrote nothing but did not fail). None when an operation with
    the same key exists already (nothing written: the caller compares parameter hashes). Runs
    inside the caller's transaction, or as its own (autocommit); its announcement goes out after
    that commit."""
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
            cur.execute(_PROPOSE_SQL, params)  # type: ignore[arg-type]
            row = cur.fetchone()
    except DatabaseError as exc:
        code = refusal_code(exc)
        if code is None:
            raise
        raise admission_refused(code) from None
    if row is None:
        return None
    if row[0] is None:
        # The attempt moved: the statement wrote nothing and did not fail, so the caller's
        # transaction stays usable for the proposal made again under the new attempt.
        raise AttemptMoved
    task = _task_row(row[: len(_TASK_NAMES)])
    op.state_version = 1
    op.created_at = op.updated_at = now
    _hint_after_commit(task, "operation.proposed")
    _publish_after_commit(
        row[len(_TASK_NAMES)], op, now, now, drained=quick or single, single=single
    )
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

_BATCH_TASK_TOUCH = f"""
  UPDATE runtime_task SET
    event_seq = event_seq + d.n,
    ops_active = ops_active + d.d_active,
    ops_claimable = ops_claimable + d.d_claimable,
    ops_blocked = ops_blocked + d.d_blocked,
    state_version = state_version + CASE WHEN condition <> {condition_case_sql("d.d_{}")}
      THEN 1 ELSE 0 END,
    condition = {condition_case_sql("d.d_{}")},
    updated_at = %(now)s
  FROM d WHERE runtime_task.id = d.task_id
  RETURNING runtime_task.id, runtime_task.event_seq, runtime_task.condition,
    runtime_task.state_version, d.n"""  # noqa: S608


def _batch_events(event_type: str, data: str) -> str:
    """The journal rows of a batch statement: one per operation row of ``c``, numbered after
    its task's earlier events (``task`` returned each task's new last seq and its count ``n``),
    with ``data`` (SQL over ``c``) and the task's condition after the statement."""
    return f"""
  INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
  SELECT task.id,
    task.event_seq - task.n + row_number() OVER (PARTITION BY c.task_id ORDER BY c.id),
    {event_type}, %(now)s, c.state_version, c.id, %(actor)s,
    {data} || jsonb_build_object(
      'task_condition', task.condition, 'task_state_version', task.state_version)
  FROM c JOIN task ON task.id = c.task_id"""  # noqa: S608


_BATCH_CLAIM_SQL = f"""
WITH pick AS (
  SELECT o.id, o.status AS from_status FROM runtime_operation o
    JOIN runtime_task t ON t.id = o.task_id
  WHERE o.id = ANY(%(ids)b::varchar[])
    AND o.executor = 'worker'
    AND {_CLAIM_GUARDS}
    AND (o.tool || ':' || o.tool_version) = ANY(%(tools)b)
    AND t.budget = '{{}}'::jsonb
  ORDER BY o.id
  FOR UPDATE OF o SKIP LOCKED
), op AS (
  UPDATE runtime_operation o SET
{_CLAIM_SET}
  FROM pick WHERE o.id = pick.id AND {_unindexed(f"o.status IN {_in(CLAIM_SOURCES)}")}
  RETURNING {", ".join("o." + c for c in _OP_NAMES)}, pick.from_status
)
SELECT {", ".join("op." + c for c in _OP_NAMES)}, t.cancellation, t.condition, t.paused,
  op.from_status
FROM op JOIN runtime_task t ON t.id = op.task_id
ORDER BY t.id, op.id
FOR UPDATE OF t
"""  # noqa: S608

_BATCH_CLAIMED_SQL = f"""
WITH c AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(tasks)b::varchar[], %(versions)b::int[],
    %(generations)b::int[], %(attempts)b::int[], %(froms)b::varchar[])
    AS c(id, task_id, state_version, lease_generation, attempt, from_status)
), d AS (
  SELECT task_id, count(*)::int AS n, count(*)::int * %(d_active)s AS d_active,
    count(*)::int * %(d_claimable)s AS d_claimable, count(*)::int * %(d_blocked)s AS d_blocked
  FROM c GROUP BY task_id
), task AS ({_BATCH_TASK_TOUCH}
), ev AS ({
    _batch_events(
        "'operation.claimed'",
        "%(event_data)s::jsonb || jsonb_build_object('from', c.from_status, "
        "'lease_generation', c.lease_generation, 'attempt', c.attempt)",
    )
}
), inv AS (
  INSERT INTO runtime_invocation
    (operation_id, number, lease_generation, execution_id, started_at, provider_handle)
  SELECT c.id, c.attempt, c.lease_generation, %(execution)s, %(now)s, '' FROM c
), spent AS (
  DELETE FROM runtime_outboxmessage WHERE operation_id = ANY(%(ids)b::varchar[])
)
SELECT id, event_seq FROM task
"""  # noqa: S608


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
        "tools": tools,
        "execution": execution_id,
        "lease_seconds": lease_seconds,
        "digest": token_digest,
        "now": now,
    }
    with prepared_cursor() as cur:
        cur.execute(_BATCH_CLAIM_SQL, claim)  # type: ignore[arg-type]
        rows = cur.fetchall()
        if not rows:
            return []
        n = len(_OP_NAMES)
        ops = [_operation(row[:n]) for row in rows]
        if any(stopping(row[n], row[n + 1]) or row[n + 2] for row in rows):
            raise BatchStopped
        froms = [row[n + 3] for row in rows]
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
        cur.execute(_BATCH_CLAIMED_SQL, claimed)  # type: ignore[arg-type]
        touched = cur.fetchall()
    for op in ops:
        budget_remember(op.task_id, {})
    for task_id, seq in touched:
        _hint_seq_after_commit(task_id, seq, "operation.claimed")
    return ops


def _hint_seq_after_commit(task_id: str, seq: int, event_type: str) -> None:
    transaction.on_commit(lambda: event_hint(task_id, seq, event_type))


_BATCH_ACCEPT_SQL = f"""
WITH r AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(targets)b::varchar[], %(results)b::jsonb[],
    %(errors)b::jsonb[], %(next_ats)b::timestamptz[], %(generations)b::int[],
    %(versions)b::int[]) AS r(id, target, result, error, next_at, generation, state_version)
), locked AS (
  SELECT o.id FROM runtime_operation o WHERE o.id = ANY(%(ids)b::varchar[])
  ORDER BY o.id FOR UPDATE
), op AS (
  UPDATE runtime_operation o SET
    status = r.target,
    state_version = o.state_version + 1,
    result = r.result,
    error = r.error,
    next_attempt_at = r.next_at,
    lease_expires_at = NULL,
    updated_at = %(now)s
  FROM r, locked WHERE o.id = r.id AND locked.id = r.id
    AND {_unindexed(f"o.status = '{S.RUNNING}'")}
    AND o.lease_generation = r.generation AND o.state_version = r.state_version
    AND o.lease_token_digest = %(digest)s AND {_unindexed("o.compensates_id IS NULL")}
  RETURNING o.id, o.task_id
)
SELECT op.id, t.cancellation, t.condition FROM op JOIN runtime_task t ON t.id = op.task_id
ORDER BY t.id, op.id
FOR UPDATE OF t
"""  # noqa: S608

_BATCH_ACCEPTED_SQL = f"""
WITH c AS (
  SELECT * FROM unnest(%(ids)b::varchar[], %(tasks)b::varchar[], %(versions)b::int[],
    %(generations)b::int[], %(d_actives)b::int[], %(d_claimables)b::int[],
    %(d_blockeds)b::int[], %(event_types)b::varchar[], %(event_datas)b::jsonb[],
    %(inv_outcomes)b::varchar[], %(receipts)b::jsonb[], %(handles)b::varchar[],
    %(announce_ats)b::timestamptz[])
    AS c(id, task_id, state_version, generation, d_active, d_claimable, d_blocked, event_type,
      event_data, inv_outcome, receipt, handle, announce_at)
), d AS (
  SELECT task_id, count(*)::int AS n, sum(d_active)::int AS d_active,
    sum(d_claimable)::int AS d_claimable, sum(d_blocked)::int AS d_blocked
  FROM c GROUP BY task_id
), task AS ({_BATCH_TASK_TOUCH}
), ev AS ({_batch_events("c.event_type", "c.event_data")}
), inv AS (
  UPDATE runtime_invocation i SET outcome = c.inv_outcome, finished_at = %(now)s,
    receipt = c.receipt, provider_handle = c.handle
  FROM c WHERE i.operation_id = ANY(%(ids)b::varchar[])
    AND i.operation_id = c.id AND i.lease_generation = c.generation
), announce AS (
  INSERT INTO runtime_outboxmessage
    (topic, operation_id, payload, created_at, available_at, publish_count)
  SELECT 'operation.execute', c.id, '{{}}'::jsonb, %(now)s, c.announce_at, 0
  FROM c WHERE c.announce_at IS NOT NULL
  RETURNING id, operation_id, available_at
)
SELECT 'task', id, event_seq::bigint, NULL::timestamptz FROM task
UNION ALL SELECT 'outbox', operation_id, id, available_at FROM announce
"""  # noqa: S608


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
            _BATCH_ACCEPT_SQL,
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
        rows = cur.fetchall()
        if any(stopping(cancellation, cond) for _, cancellation, cond in rows):
            raise BatchStopped
        done = {row[0] for row in rows}
        batch = [(op, a) for op, a in accepted if op.pk in done]
        if not batch:
            return []
        deltas = [status_deltas(S.RUNNING, a.target) for _, a in batch]
        cur.execute(
            _BATCH_ACCEPTED_SQL,
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
        out = cur.fetchall()
    edges = {op.task_id: f"operation.{a.edge}" for op, a in batch}
    announced = []
    for kind, key, number, available_at in out:
        if kind == "task":
            _hint_seq_after_commit(key, number, edges[key])
        else:
            announced.append(_announcement(number, key, available_at, now))
    if announced:
        queues = {op.pk: queue_of(op.tool) for op, _ in batch}
        transaction.on_commit(lambda: outbox_publish(announced, queues))
    return [op.pk for op, _ in batch]
