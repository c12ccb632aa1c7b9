"""The hot path on PostgreSQL: propose, claim and accept each as ONE guarded statement (a
data-modifying CTE), carrying the operation's transition, the task's counters and condition,
the journal event, the invocation and the outbox row in one round trip.

Each statement covers the common case only and touches nothing otherwise (zero rows): the
caller then runs the general path (``runtime.leases`` / ``runtime.operations``, plain ORM
statements, which is also what the embedded SQLite mode always runs), which settles, refuses
or records whatever made the common case not apply. Both paths write the same rows; the
statement-count and recovery tests run against both.

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

from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from runtime.budgets import budget_remember
from runtime.events import TaskRow, event_hint, task_touch_sql
from runtime.models import Operation, OutboxMessage
from runtime.outbox import outbox_publish
from runtime.statemachine import status_deltas
from runtime.transitions import OPERATION, Cancellation, OperationStatus, TaskCondition

S = OperationStatus


def _in(statuses: tuple[str, ...] | list[str]) -> str:
    # Literals from the transition tables' constants only (never from input).
    return "(" + ", ".join(f"'{s}'" for s in statuses) + ")"


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

_OP_COLUMNS = (
    "id, task_id, attempt_id, kind, tool, tool_version, step, intent_version, params, "
    "params_hash, idempotency_key, executor, status, state_version, lease_generation, "
    "lease_expires_at, lease_token_digest, execution_id, attempts_used, max_attempts, "
    "first_attempt_at, next_attempt_at, deadline, cancel_requested, estimate, signal, "
    "timeout_seconds, result, error, status_reason, compensates_id, created_at, updated_at"
)
_OP_NAMES = tuple(c.strip() for c in _OP_COLUMNS.split(","))
# The outbox row a statement writes for worker-run work (when %(announce)s), due at {available}.
_ANNOUNCE = """
  INSERT INTO runtime_outboxmessage
    (topic, operation_id, payload, created_at, available_at, publish_count)
  SELECT 'operation.execute', op.id, '{{}}'::jsonb, %(now)s, {available}, 0
  FROM op WHERE %(announce)s
  RETURNING id"""

_JSON_COLUMNS = ("params", "estimate", "result", "error")
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
    """On PostgreSQL, unless switched off (``HOTPATH = False``: tests of the general path)."""
    return connection.vendor == "postgresql" and getattr(settings, "HOTPATH", True)


def ledger_needed(budget: dict[str, Any] | None) -> bool:
    """Whether the task's budget makes the ledger part of a proposal or an acceptance. These
    statements carry no ledger: for a task with a budget the caller declines to the general
    path, whose guarded meter UPDATEs hold and settle in the same transaction
    (``runtime.budgets``). The claim statement declines by itself (see ``_CLAIM_SQL``)."""
    return bool(budget)


def _deltas(source: str | None, target: str) -> dict[str, int]:
    a, c, b = status_deltas(source, target)
    return {"d_active": a, "d_claimable": c, "d_blocked": b}


def _task_row(values: tuple[Any, ...]) -> TaskRow:
    row = dict(zip(_TASK_NAMES, values, strict=True))
    return TaskRow(**{**row, "paused": bool(row["paused"]), "ops_active": int(row["ops_active"])})


def _stopping(task: TaskRow) -> bool:
    return task.cancellation != Cancellation.NONE or task.condition == TaskCondition.TERMINAL


def _hint_after_commit(task: TaskRow, event_type: str) -> None:
    transaction.on_commit(lambda: event_hint(task.id, task.event_seq, event_type))


def _publish_after_commit(
    outbox_id: int | None, operation_id: str, available_at: datetime, now: datetime
) -> None:
    """Hand the outbox row the statement wrote to the relay once it commits."""
    if outbox_id is None:
        return
    message = OutboxMessage(
        pk=outbox_id,
        topic="operation.execute",
        operation_id=operation_id,
        created_at=now,
        available_at=available_at,
    )
    transaction.on_commit(lambda: outbox_publish([message]))


class StoppedUnderLock(Exception):
    """The task's stop committed while the statement waited for the task row: the caller rolls
    the whole transaction back and takes the general path, which settles for the stop."""


class PausedUnderLock(Exception):
    """The task's pause committed while the statement waited for the task row: the caller rolls
    the whole transaction back and refuses the delivery (runtime.control's pause hook)."""


# --- claim ------------------------------------------------------------------------------------

_CLAIM_SQL = f"""
WITH op AS (
  UPDATE runtime_operation o SET
    status = '{S.RUNNING}',
    state_version = o.state_version + 1,
    lease_generation = o.lease_generation + 1,
    lease_expires_at = %(expires)s,
    lease_token_digest = %(digest)s,
    execution_id = %(execution)s,
    attempts_used = o.attempts_used + 1,
    first_attempt_at = COALESCE(o.first_attempt_at, %(now)s),
    next_attempt_at = NULL,
    status_reason = '',
    cancel_requested = false,
    updated_at = %(now)s
  FROM runtime_task t
  WHERE o.id = %(id)s AND t.id = o.task_id
    AND o.status IN {_in(CLAIM_SOURCES)}
    AND o.executor = %(executor)s
    AND o.compensates_id IS NULL
    AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= %(now)s)
    AND o.attempts_used < o.max_attempts
    AND t.cancellation = '{Cancellation.NONE}' AND t.condition <> '{TaskCondition.TERMINAL}'
    AND NOT o.approval_required AND NOT t.paused
    AND (COALESCE(o.deadline, t.deadline) IS NULL OR COALESCE(o.deadline, t.deadline) > %(now)s)
    AND (%(executor)s <> 'worker' OR (o.tool || ':' || o.tool_version) = ANY(%(supported)s))
    AND (o.attempts_used = 0 OR t.budget = '{{}}'::jsonb)
  RETURNING {", ".join("o." + c for c in _OP_NAMES)}, t.budget AS task_budget
), task AS ({_TASK_TOUCH}
), ev AS (
  INSERT INTO runtime_event (task_id, seq, type, at, state_version, operation_id, actor, data)
  SELECT task.id, task.event_seq, %(event_type)s, %(now)s, op.state_version, op.id, %(actor)s,
    %(event_data)s::jsonb || jsonb_build_object(
      'lease_generation', op.lease_generation, 'attempt', op.attempts_used,
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
    expires: datetime,
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
        "expires": expires,
        "digest": token_digest,
        "supported": supported,
        "now": now,
        "event_type": "operation.claimed",
        "actor": actor,
        **_deltas(S.PENDING, S.RUNNING),
    }
    params["event_data"] = Jsonb({"to": S.RUNNING, "status": S.RUNNING, "execution": execution_id})
    with connection.cursor() as cur:
        cur.execute(_CLAIM_SQL, params)  # type: ignore[arg-type]
        row = cur.fetchone()
    if row is None:
        return None
    values = dict(zip(_OP_NAMES, row[: len(_OP_NAMES)], strict=True))
    for name in _JSON_COLUMNS:
        # Django has psycopg hand jsonb over as text (its JSONField decodes it).
        if isinstance(values[name], str):
            values[name] = json.loads(values[name])
    op = Operation(**values)
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
  WHERE o.id = %(id)s AND o.status = '{S.RUNNING}'
    AND o.lease_generation = %(generation)s AND o.state_version = %(state_version)s
    AND o.lease_token_digest = %(digest)s AND o.compensates_id IS NULL
    AND EXISTS (
      SELECT 1 FROM runtime_task t WHERE t.id = o.task_id
        AND t.cancellation = '{Cancellation.NONE}' AND t.condition <> '{TaskCondition.TERMINAL}')
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
    with connection.cursor() as cur:
        cur.execute(_ACCEPT_SQL, params)  # type: ignore[arg-type]
        row = cur.fetchone()
    if row is None:
        return None
    task = _task_row(row[: len(_TASK_NAMES)])
    if _stopping(task):
        raise StoppedUnderLock
    _hint_after_commit(task, f"operation.{acceptance.edge}")
    _publish_after_commit(row[len(_TASK_NAMES)], op.pk, acceptance.next_attempt_at or now, now)
    return task


# --- proposal ----------------------------------------------------------------------------------

_PROPOSE_SQL = f"""
WITH op AS (
  INSERT INTO runtime_operation (
    id, task_id, attempt_id, kind, tool, tool_version, step, intent_version, params, params_hash,
    idempotency_key, executor, status, state_version, lease_generation, lease_token_digest,
    attempts_used, max_attempts, deadline, cancel_requested, estimate, signal, timeout_seconds,
    status_reason, approval_required, created_at, updated_at)
  VALUES (
    %(id)s, %(task_id)s, %(attempt_id)s, %(kind)s, %(tool)s, %(tool_version)s, %(step)s,
    %(intent_version)s, %(params)s, %(params_hash)s, %(key)s, %(executor)s, '{S.PENDING}', 1, 0,
    '', 0, %(max_attempts)s, %(deadline)s, false, %(estimate)s, %(signal)s, %(timeout_seconds)s,
    '', false, %(now)s, %(now)s)
  ON CONFLICT ON CONSTRAINT operation_key_unique_per_task DO NOTHING
  RETURNING id, task_id, state_version
), task AS ({_TASK_TOUCH}
), ev AS ({_EVENT}
), announce AS ({_ANNOUNCE.format(available="%(now)s")}
)
SELECT {", ".join("task." + c for c in _TASK_NAMES)}, (SELECT id FROM announce)
FROM op, task
"""  # noqa: S608


def propose_txn(op: Operation, *, actor: str, now: datetime) -> TaskRow | None:
    """Insert a new pending operation (built, unsaved, by the caller) with its event and, for
    worker-run work, its outbox row, in one statement. None when an operation with the same key
    exists already (nothing written: the caller compares parameter hashes). The caller checks
    admission on the returned task row, read under its lock, and raises to roll back."""
    announce = op.executor == Operation.EXECUTOR_WORKER
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
    with connection.cursor() as cur:
        cur.execute(_PROPOSE_SQL, params)  # type: ignore[arg-type]
        row = cur.fetchone()
    if row is None:
        return None
    task = _task_row(row[: len(_TASK_NAMES)])
    op.state_version = 1
    op.created_at = op.updated_at = now
    _hint_after_commit(task, "operation.proposed")
    _publish_after_commit(row[len(_TASK_NAMES)], op.pk, now, now)
    return task
