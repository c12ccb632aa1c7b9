"""The claim: a claimable operation becomes running under the next lease generation, for one
execution (``operation_claim``; an agent's ``agent_claim``). The general writer (``_claim_txn``)
walks the claim rule's rows in order (runtime.rules.claim); the one-statement form
(``claim_txn``, ``claim_one`` in ``runtime/sql/claim.sql``) guards with the same rows' SQL.
Work whose task no longer admits it is settled instead of claimed (runtime.transitions.
claim_refusals); the task's stop and pause are checked again under the task's row lock.

Lock order (DESIGN.md, README): operation rows in ascending id, then the task row."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F
from django.db.models.functions import Now
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime import dialect
from runtime.actors import execution_actor
from runtime.admission import concurrency_slot_free_txn
from runtime.budgets import budget_rehold_needed, budget_remember, budget_reserve_txn, task_budget
from runtime.control import paused_claim_refused_txn
from runtime.crashpoints import crash_point
from runtime.db import fetchone_named, prepared_cursor
from runtime.errors import BudgetExhausted, NotClaimable, TransitionRejected
from runtime.events import task_row
from runtime.lease_tokens import lease_token_mint
from runtime.models import Invocation, Operation
from runtime.outbox import TOPIC_EXECUTE, outbox_consume_txn, outbox_enqueue_txn
from runtime.rules.claim import CLAIM_RULES, ClaimFacts, ToolSupport
from runtime.rules.statuses import OperationStatus
from runtime.sqlfiles import queries
from runtime.stoprule import stop_covers, stop_reason
from runtime.tools import adapters
from runtime.transitions.claim_refusals import (
    Refusal,
    claim_refused,
    ledger_refused,
    stop_or_refuse,
)
from runtime.transitions.fast import (
    SLOTS,
    PausedUnderLock,
    StoppedUnderLock,
    deltas_params,
    hint_after_commit,
    operation_of_row,
    task_lock_check,
)
from runtime.transitions.lease import Lease, lease_expiry, lease_seconds, lease_token_digest
from runtime.transitions.rejections import rejection_record
from runtime.transitions.status import operation_transition_txn

S = OperationStatus

_SQL = queries("claim_one", slots=SLOTS)


class _LedgerRefused(Exception):
    """A re-dispatch after a lost call could not hold its estimate again: undo the claim."""


def operation_claim(
    operation_id: str,
    *,
    execution_id: str,
    executor: str = Operation.EXECUTOR_WORKER,
    actor: str | None = None,
    now: datetime | None = None,
) -> Lease | Refusal:
    """Claim a claimable operation for ``execution_id``; a Refusal when there is nothing to claim
    (a duplicate or late delivery, work that is not due, or another claimant won). The claim
    consumes the operation's outbox rows. Work whose task no longer admits it is settled instead
    of claimed; the task's stop is checked again under the task's row lock, so a stop that
    commits while the claim waits for that lock still wins.

    Preconditions: none; safe to call any number of times concurrently (exactly one wins).
    ``actor`` names the claimant in the journal (default: the execution).
    """
    now = now or timezone.now()
    actor = actor or execution_actor(execution_id)
    try:
        with transaction.atomic():
            # Limits: a tool class at its concurrency limit starts nothing (slot lock first),
            # whoever runs it: an agent's running operation is active work as a worker's is.
            if not _slot_free_txn(operation_id, now):
                return Refusal("the tool class is at its concurrency limit")
            if dialect.one_statement_forms():
                lease = claim_fast_txn(
                    operation_id,
                    execution_id=execution_id,
                    executor=executor,
                    actor=actor,
                    now=now,
                )
                if lease is not None:
                    # (A re-dispatch of a budgeted task's work is left to _claim_txn's re-hold.)
                    return lease
            return _claim_txn(
                operation_id, execution_id=execution_id, executor=executor, actor=actor, now=now
            )
    except StoppedUnderLock:
        pass
    except _LedgerRefused:
        return ledger_refused(operation_id, now, actor=actor)
    except PausedUnderLock:
        # A pause committed while the claim waited for the task row: the claim rolled back.
        with transaction.atomic():
            task_id = Operation.objects.filter(pk=operation_id).values_list("task_id", flat=True)
            return Refusal(paused_claim_refused_txn(operation_id, task_id.get()))
    # The claim rolled back; settle the work for the stop in a transaction of its own (the stop
    # is final once seen under the lock, so the task read here cannot contradict it).
    with transaction.atomic():
        op = Operation.objects.select_related("task").filter(pk=operation_id).first()
        if op is None or op.status not in S.CLAIMABLE:
            return Refusal("the task stopped")
        return stop_or_refuse(op, now=now, actor=actor, reason=stop_reason(op.task))


def _slot_free_txn(operation_id: str, now: datetime) -> bool:
    """Whether the operation's tool class has a free concurrency slot (no statement at all when
    no class is limited). When not, the work stays due; a worker's is announced again shortly,
    instead of waiting for the sweeper's grace period (an agent's is never announced: the agent
    claims again)."""
    if not settings.TOOL_CONCURRENCY:
        return True
    row = Operation.objects.filter(pk=operation_id).values_list("tool", "executor").first()
    if row is None or concurrency_slot_free_txn(row[0]):
        return True
    if row[1] != Operation.EXECUTOR_WORKER:
        return False
    outbox_consume_txn(operation_id)
    outbox_enqueue_txn(
        topic=TOPIC_EXECUTE,
        operation_id=operation_id,
        now=now,
        available_at=now + timedelta(seconds=random.uniform(0.2, 0.6)),
    )
    return False


def _rehold_txn(op: Operation, now: datetime) -> None:
    """A re-dispatch (after a retry settled its call's hold, or a lost call turned it unknown)
    holds the estimate again, or does not start (raises _LedgerRefused). No statement for a
    first call or an unbudgeted task."""
    if op.attempts_used <= 1:
        return
    budget = task_budget(op.task_id)
    if not budget_rehold_needed(budget, op):
        return
    try:
        budget_reserve_txn(
            budget=budget,
            op=op,
            number=op.attempts_used,
            now=now,
            cleanup=op.compensates_id is not None,
        )
    except BudgetExhausted:
        raise _LedgerRefused from None


def _supported_tools() -> list[str]:
    return [f"{a.name}:{v}" for a in adapters().values() for v in a.supported_versions]


def claim_fast_txn(
    operation_id: str, *, execution_id: str, executor: str, actor: str, now: datetime
) -> Lease | None:
    """The common claim as one statement (PostgreSQL), inside the caller's transaction; None
    leaves it to the general path (nothing written). Raises StoppedUnderLock or
    PausedUnderLock (the caller rolls back). No slot check: the caller has made it, or claims
    a class without a concurrency limit."""
    token = lease_token_mint(operation_id, execution_id)
    op = claim_txn(
        operation_id,
        execution_id=execution_id,
        executor=executor,
        lease_seconds=lease_seconds(),
        token_digest=lease_token_digest(token),
        supported=_supported_tools() if executor == Operation.EXECUTOR_WORKER else [],
        actor=actor,
        now=now,
    )
    if op is None:
        return None
    return Lease(
        op.pk, op.lease_generation, op.state_version, lease_expiry(op), op.attempts_used, op, token
    )


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
        **deltas_params(S.PENDING, S.RUNNING),
    }
    params["event_data"] = Jsonb({"to": S.RUNNING, "status": S.RUNNING, "execution": execution_id})
    with prepared_cursor() as cur:
        cur.execute(_SQL["claim_one"], params)  # type: ignore[arg-type]
        row = fetchone_named(cur)
    if row is None:
        return None
    op = operation_of_row(row)
    task = task_row(row, "task__")
    # Limits: the task's (immutable) budget rides along, so settling needs no statement.
    budget = row["task_budget"]
    budget_remember(op.task_id, json.loads(budget) if isinstance(budget, str) else budget)
    task_lock_check(task)
    hint_after_commit(task, "operation.claimed", op, actor)
    return op


def _lease_end(now: datetime) -> tuple[Any, datetime | None]:
    """What a claim writes as its lease's expiry: on PostgreSQL the database's clock plus the
    lease (an expression; the caller reads the value back), so the sweeper's takeover, which
    compares with that clock too, never weighs one host's clock against another's. The
    embedded mode (SQLite) runs on one host, whose process clock is its one clock."""
    length = timedelta(seconds=lease_seconds())
    if not dialect.database_clock():
        return now + length, now + length
    return ExpressionWrapper(Now() + length, output_field=DateTimeField()), None


def _tool_support(tool: str, version: str) -> ToolSupport | None:
    """This claimant's answer for the claim rule's version row (runtime.rules.claim)."""
    adapter = adapters().get(tool)
    return None if adapter is None else ToolSupport(adapter.version, adapter.supports(version))


def _claim_facts(op: Operation, executor: str, now: datetime) -> ClaimFacts:
    task = op.task
    return ClaimFacts(
        status=op.status,
        executor=op.executor,
        claimant=executor,
        next_attempt_at=op.next_attempt_at,
        attempts_used=op.attempts_used,
        max_attempts=op.max_attempts,
        approval_required=op.approval_required,
        deadline=op.deadline or task.deadline,
        cancellation=task.cancellation,
        condition=task.condition,
        paused=task.paused,
        tool=op.tool,
        tool_version=op.tool_version,
        now=now,
        adapter=lambda: _tool_support(op.tool, op.tool_version),
    )


def _claim_txn(
    operation_id: str, *, execution_id: str, executor: str, actor: str, now: datetime
) -> Lease | Refusal:
    op = Operation.objects.select_related("task").filter(pk=operation_id).first()
    if op is None:
        return Refusal("no such operation", operation_exists=False)
    crash_point("claim.after_read")
    task = op.task
    budget_remember(task.pk, task.budget)  # read anyway: settling later needs no statement
    cleanup = not stop_covers(op.compensates_id)  # compensations outlive the stop they serve
    # The claim rule, row by row in its order (runtime.rules.claim; the one-statement claim
    # guards with the same rows' SQL).
    facts = _claim_facts(op, executor, now)
    for rule in CLAIM_RULES:
        if rule.admits(facts) or (cleanup and rule.cleanup_exempt):
            continue
        refusal = claim_refused(rule, op, facts, cleanup=cleanup, now=now, actor=actor)
        if refusal is not None:
            return refusal
    return _lease_txn(op, execution_id=execution_id, cleanup=cleanup, actor=actor, now=now)


def _lease_txn(
    op: Operation, *, execution_id: str, cleanup: bool, actor: str, now: datetime
) -> Lease | Refusal:
    """The general claim's write, once every rule admitted it: the guarded move to running under
    the next generation, the stop and pause seen under the task's lock, the re-dispatch's hold,
    the invocation, the announcements consumed."""
    generation = op.lease_generation + 1
    number = op.attempts_used + 1
    lease_end, expires = _lease_end(now)
    token = lease_token_mint(op.pk, execution_id)
    try:
        transitioned = operation_transition_txn(
            op,
            S.RUNNING,
            now=now,
            fields={
                "lease_generation": F("lease_generation") + 1,
                "lease_expires_at": lease_end,
                "lease_token_digest": lease_token_digest(token),
                "execution_id": execution_id,
                "attempts_used": F("attempts_used") + 1,
                "first_attempt_at": op.first_attempt_at or now,
                "next_attempt_at": None,
                "status_reason": "",
                "cancel_requested": False,
            },
            actor=actor,
            data={"lease_generation": generation, "execution": execution_id, "attempt": number},
        )
    except TransitionRejected:
        return Refusal("another claimant won")
    task_lock_check(transitioned.task, cleanup=cleanup)
    op.lease_generation = generation
    op.attempts_used = number
    _rehold_txn(op, now)  # Limits: a re-dispatch after a lost call holds anew
    Invocation.objects.create(
        operation=op,
        number=number,
        lease_generation=generation,
        execution_id=execution_id,
        started_at=now,
    )
    outbox_consume_txn(op.pk)
    if expires is None:  # written on the database's clock: read it back
        expires = Operation.objects.values_list("lease_expires_at", flat=True).get(pk=op.pk)
        op.lease_expires_at = expires
    assert expires is not None
    return Lease(op.pk, generation, op.state_version, expires, number, op, token)


def claim_refused_record(operation_id: str, execution_id: str, reason: str) -> None:
    rejection_record(
        operation_id=operation_id,
        kind="refused_claim",
        execution_id=execution_id,
        detail={"reason": reason},
    )


def agent_claim(operation_id: str, execution_id: str, *, actor: str) -> Lease:
    """An agent's claim of an agent-executed operation; NotClaimable when it cannot be had.

    Preconditions: policy.can_claim allowed ``actor`` (the task's agent) to claim it."""
    lease = operation_claim(
        operation_id, execution_id=execution_id, executor=Operation.EXECUTOR_AGENT, actor=actor
    )
    if isinstance(lease, Refusal):
        if lease.operation_exists:
            claim_refused_record(operation_id, execution_id, lease.reason)
        raise NotClaimable(f"the operation is not claimable now: {lease.reason}")
    return lease
