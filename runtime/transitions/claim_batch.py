"""A drainer's batch claim (PostgreSQL): several quick calls claimed in one transaction, so a
burst costs one commit per batch instead of one per operation. Two statements
(``claim_batch_pick``, ``claim_batch_journal`` in ``runtime/sql/claim.sql``): the operations'
guarded UPDATE, joined to the task rows locked in ascending id (after the operation rows: the
global lock order), then the tasks' counters, the events, the invocations and the outbox rows.
What the batch does not cover is left untouched and handed back to the one-operation claim."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime.actors import execution_actor
from runtime.budgets import budget_remember
from runtime.crashpoints import crash_point
from runtime.db import fetchall_named, prepared_cursor
from runtime.lease_tokens import lease_token_mint
from runtime.logcontext import transition_fields
from runtime.models import Operation
from runtime.rules.claim import task_lock_refusal
from runtime.rules.statuses import OperationStatus
from runtime.sqlfiles import queries
from runtime.transitions.fast import (
    SLOTS,
    BatchStopped,
    deltas_params,
    hint_seq_after_commit,
    log_after_commit,
    operation_of_row,
)
from runtime.transitions.lease import Lease, lease_expiry, lease_seconds, lease_token_digest

S = OperationStatus

_SQL = queries("claim_batch_pick", "claim_batch_journal", slots=SLOTS)


@dataclass(frozen=True)
class _TaskFlags:
    """The task columns of a batch row that the claim re-reads under the task's lock."""

    cancellation: str
    condition: str
    paused: bool

    @classmethod
    def of(cls, row: dict[str, Any]) -> _TaskFlags:
        return cls(row["cancellation"], row["condition"], bool(row["paused"]))


@dataclass(frozen=True)
class Batch:
    """What one batch claim took: ``leases`` (all under one token), and ``handed_back``, the
    operations it did not claim (not covered by the batch statement, held by another claimant,
    or rolled back because their task stopped or paused under the claim): each to be run on the
    one-operation path, which claims, settles or refuses it."""

    leases: list[Lease]
    handed_back: list[str]


def operations_claim_batch(
    operation_ids: list[str],
    tools: list[str],
    *,
    execution_id: str,
    now: datetime | None = None,
) -> Batch:
    """Claim those of ``operation_ids`` (quick calls of ``tools``, the ``tool:version`` this
    worker runs: ``drainers.drainable_tools``) that the common case covers, for
    ``execution_id``, each under its next lease generation, in one
    transaction (PostgreSQL). The rest are neither claimed nor touched.

    Preconditions: no transaction is open; the caller runs every lease it gets, and runs the
    one-operation path for every id it did not get. Concurrent batch and single claims never
    take one operation twice (rows another claimant holds are skipped; each guard is
    re-checked under the row lock)."""
    if not operation_ids:
        return Batch([], [])
    now = now or timezone.now()
    token = lease_token_mint("", execution_id)  # one token for the whole batch
    try:
        with transaction.atomic(durable=True):
            ops = claim_batch_txn(
                operation_ids,
                tools=tools,
                execution_id=execution_id,
                lease_seconds=lease_seconds(),
                token_digest=lease_token_digest(token),
                actor=execution_actor(execution_id),
                now=now,
            )
            crash_point("claim.batch_before_commit")
    except BatchStopped:
        return Batch([], list(operation_ids))
    claimed = {op.pk for op in ops}
    return Batch(
        [
            Lease(
                op.pk,
                op.lease_generation,
                op.state_version,
                lease_expiry(op),
                op.attempts_used,
                op,
                token,
            )
            for op in ops
        ],
        [i for i in dict.fromkeys(operation_ids) if i not in claimed],
    )


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
        ops = [operation_of_row(row) for row in rows]
        if any(task_lock_refusal(_TaskFlags.of(row), cleanup=False) for row in rows):
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
            **deltas_params(S.PENDING, S.RUNNING),
        }
        cur.execute(_SQL["claim_batch_journal"], claimed)  # type: ignore[arg-type]
        touched = fetchall_named(cur)
    for op in ops:
        budget_remember(op.task_id, {})
    for task in touched:
        hint_seq_after_commit(task["id"], task["event_seq"], "operation.claimed")
    log_after_commit(
        [
            transition_fields("operation.claimed", task_id=op.task_id, actor=actor, op=op)
            for op in ops
        ]
    )
    return ops
