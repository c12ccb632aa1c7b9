"""Leases and fencing. A claim sets the owner execution, ``lease_generation + 1``, the expiry and
the digest of a fresh lease token in one guarded UPDATE; heartbeats and reports must present both
the generation and the token, so a lease belongs to the execution that claimed it; expiry hands
the work to a new generation (re-checked in the takeover's own statement) but never proves the
old owner stopped.

Lock order (DESIGN.md, README): operation rows in ascending id, then the task row. Every path
here updates one operation row and then touches its task through the journal."""

from __future__ import annotations

import hmac
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F
from django.db.models.functions import Now
from django.utils import timezone

from runtime import dialect, hotpath
from runtime.actors import SWEEPER, execution_actor
from runtime.admission import concurrency_slot_free_txn
from runtime.approval_gate import approval_release_txn
from runtime.budgets import (
    budget_mark_unknown_txn,
    budget_rehold_needed,
    budget_release_txn,
    budget_remember,
    budget_reserve_txn,
    task_budget,
)
from runtime.control import paused_claim_refused_txn
from runtime.crashpoints import crash_point
from runtime.db import db_datetime, fetchone_named
from runtime.errors import BudgetExhausted, NotClaimable, StaleLease, TransitionRejected
from runtime.events import event_append_txn
from runtime.lease_tokens import lease_token_digest as _derived_digest
from runtime.lease_tokens import lease_token_mint
from runtime.models import Invocation, Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_consume_txn, outbox_enqueue_txn
from runtime.reactor import operation_settled_txn
from runtime.rules.claim import CLAIM_RULES, ClaimFacts, ClaimRule, Settles
from runtime.rules.statuses import OperationStatus
from runtime.sqlfiles import queries
from runtime.statemachine import operation_transition_txn, rejection_record
from runtime.stoprule import (
    STOPPED_UNCONFIRMED_EVENT,
    stop_asked,
    stop_covers,
    stop_reason,
    stop_target,
    task_stopping,
    unconfirmed_calls_txn,
)
from runtime.tools import Contract, adapters, contract_of

S = OperationStatus

# The heartbeat, one form per dialect (runtime/sql/lease.sql).
_SQL = queries("lease_heartbeat", "lease_heartbeat_database_clock", slots={"running": S.RUNNING})


@dataclass(frozen=True)
class Refusal:
    """Why a delivery claimed nothing (duplicate, late, not due, or the task stopped it)."""

    reason: str
    operation_exists: bool = True


@dataclass(frozen=True)
class Lease:
    operation_id: str
    lease_generation: int
    state_version: int
    lease_expires_at: datetime
    invocation_number: int
    operation: Operation
    # The claim's secret: shown to the claimant, kept nowhere (runtime.lease_tokens).
    lease_token: str


def lease_seconds() -> int:
    return int(settings.LEASE_SECONDS)


def lease_token_digest(token: str) -> str:
    """What fencing compares (a token of a dropped key matches nothing): runtime.lease_tokens."""
    return _derived_digest(token)


def lease_token_matches(op: Operation, token: str) -> bool:
    return bool(op.lease_token_digest) and hmac.compare_digest(
        op.lease_token_digest, lease_token_digest(token)
    )


class _StoppedUnderLock(Exception):
    """The task's stop committed while the claim waited for the task row: undo the claim."""


class _LedgerRefused(Exception):
    """A re-dispatch after a lost call could not hold its estimate again: undo the claim."""


class _PausedUnderLock(Exception):
    """The task's pause committed while the claim waited for the task row: undo the claim."""


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
    except (_StoppedUnderLock, hotpath.StoppedUnderLock):
        pass
    except _LedgerRefused:
        return _ledger_refused(operation_id, now, actor=actor)
    except (_PausedUnderLock, hotpath.PausedUnderLock):
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
        return _stop_or_refuse(op, now=now, actor=actor, reason=stop_reason(op.task))


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


def _ledger_refused(operation_id: str, now: datetime, *, actor: str) -> Refusal:
    """The ledger cannot hold another call: the work stops here. It failed where every earlier
    call's outcome is known (a retry after confirmed failures); where an earlier call may have
    had an effect nobody confirmed (its usage unknown), the writer hands it to a person instead
    (runtime.statemachine's possible-effect rule)."""
    with transaction.atomic():
        op = Operation.objects.select_related("task").filter(pk=operation_id).first()
        if op is None or op.status not in S.CLAIMABLE:
            return Refusal("another claimant won")
        reason = "budget exhausted: the ledger cannot hold another call"
        return _settle_or_refuse(
            op,
            S.FAILED,
            now=now,
            actor=actor,
            reason=reason,
            fields={"error": {"kind": "budget_exhausted", "message": reason}},
        )


def _supported_tools() -> list[str]:
    return [f"{a.name}:{v}" for a in adapters().values() for v in a.supported_versions]


def claim_fast_txn(
    operation_id: str, *, execution_id: str, executor: str, actor: str, now: datetime
) -> Lease | None:
    """The common claim as one statement (PostgreSQL), inside the caller's transaction; None
    leaves it to the general path (nothing written). Raises hotpath.StoppedUnderLock or
    PausedUnderLock (the caller rolls back). No slot check: the caller has made it, or claims
    a class without a concurrency limit."""
    token = lease_token_mint(operation_id, execution_id)
    op = hotpath.claim_txn(
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
        op.pk, op.lease_generation, op.state_version, _expiry(op), op.attempts_used, op, token
    )


def _expiry(op: Operation) -> datetime:
    """The expiry a claim statement wrote on the database's clock (returned with the row)."""
    assert op.lease_expires_at is not None
    return op.lease_expires_at


def _lease_end(now: datetime) -> tuple[Any, datetime | None]:
    """What a claim writes as its lease's expiry: on PostgreSQL the database's clock plus the
    lease (an expression; the caller reads the value back), so the sweeper's takeover, which
    compares with that clock too, never weighs one host's clock against another's. The
    embedded mode (SQLite) runs on one host, whose process clock is its one clock."""
    length = timedelta(seconds=lease_seconds())
    if not dialect.database_clock():
        return now + length, now + length
    return ExpressionWrapper(Now() + length, output_field=DateTimeField()), None


def lease_clock(now: datetime | None) -> Any:
    """What a takeover compares a lease's expiry with: the database's clock (PostgreSQL), the
    process clock in the embedded mode; an explicit ``now`` stands for that clock (tests)."""
    if now is not None:
        return now
    return Now() if dialect.database_clock() else timezone.now()


def _settle_or_refuse(
    op: Operation,
    target: str,
    *,
    now: datetime,
    actor: str,
    reason: str,
    fields: dict[str, Any] | None = None,
) -> Refusal:
    try:
        operation_settle_txn(op, target, now=now, actor=actor, reason=reason, fields=fields)
    except TransitionRejected:
        # Another claimant (or a cancel) moved the operation first: nothing for this one.
        return Refusal("another claimant won")
    return Refusal(reason)


def _stop_or_refuse(op: Operation, *, now: datetime, actor: str, reason: str) -> Refusal:
    try:
        operation_stop_txn(op, now=now, actor=actor, reason=reason)
    except TransitionRejected:
        return Refusal("another claimant won")
    return Refusal(reason)


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
        adapter=lambda: adapters().get(op.tool),
    )


def _release_or_refuse(op: Operation, *, now: datetime, actor: str) -> Refusal | None:
    """The release recheck (``Settles.RELEASE``): gated work runs only under an approval of
    these parameters; None when it may run. The operation row is locked first (as read), then
    the approval, then (through the transition's journal) the task: the release gate's order,
    so a late decision racing this claim waits for it instead of deadlocking."""
    held = Operation.objects.select_for_update().filter(
        pk=op.pk, status=op.status, state_version=op.state_version
    )
    if not list(held.values_list("pk", flat=True)):
        return Refusal("another claimant won")
    refused = approval_release_txn(op, now=now, actor=actor)
    crash_point("claim.approval_released")
    if refused is not None and refused.returned:
        return Refusal(refused.reason)  # back with a person: expired, or reopened
    if refused is not None:
        return _settle_or_refuse(
            op, S.MANUAL_INTERVENTION, now=now, actor=actor, reason=refused.reason
        )
    return None


def _claim_refused(
    rule: ClaimRule, op: Operation, facts: ClaimFacts, *, cleanup: bool, now: datetime, actor: str
) -> Refusal | None:
    """What a refusing row of ``CLAIM_RULES`` settles to (its ``outcome``); None when the claim
    may go on after all (an approval released)."""
    match rule.outcome:
        case Settles.REFUSE:
            return Refusal(rule.reason(facts))
        case Settles.STOP:
            # A stop is final: seen once, it holds (a claim that sees none re-checks under the
            # lock).
            return _stop_or_refuse(op, now=now, actor=actor, reason=stop_reason(op.task))
        case Settles.REFUSE_PAUSED:
            # Pause: the delivery takes nothing and its announcement is spent (runtime.control).
            return Refusal(paused_claim_refused_txn(op.pk, op.task_id))
        case Settles.EXPIRED:
            return _settle_or_refuse(op, S.EXPIRED, now=now, actor=actor, reason=rule.reason(facts))
        case Settles.MANUAL_INTERVENTION:
            reason = rule.reason(facts)
            return _settle_or_refuse(op, S.MANUAL_INTERVENTION, now=now, actor=actor, reason=reason)
        case Settles.EXHAUSTED:
            # (Where an earlier call's outcome is unconfirmed, the writer makes it
            # ``unresolved``: runtime.statemachine's possible-effect rule.)
            reason = rule.reason(facts)
            return _settle_or_refuse(
                op,
                S.UNRESOLVED if cleanup else S.FAILED,
                now=now,
                actor=actor,
                reason=reason,
                fields={"error": {"kind": "permanent", "message": reason}},
            )
        case Settles.RELEASE:
            return _release_or_refuse(op, now=now, actor=actor)
    raise ValueError(f"claim rule {rule.code}: no outcome {rule.outcome!r}")


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
        refusal = _claim_refused(rule, op, facts, cleanup=cleanup, now=now, actor=actor)
        if refusal is not None:
            return refusal
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
    if task_stopping(transitioned.task) and not cleanup:
        raise _StoppedUnderLock
    if transitioned.task.paused and not cleanup:
        raise _PausedUnderLock
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


def lease_heartbeat(
    operation_id: str, lease_generation: int, lease_token: str, now: datetime | None = None
) -> tuple[datetime, bool]:
    """Extend the lease under the caller's claim (generation and token); returns (new expiry,
    asked to stop: ``stoprule.stop_asked``, so a compensation is not asked to stop by its task's
    stop). Raises StaleLease when the claim is no longer the current one.

    A heartbeat that commits before the sweeper's takeover keeps the lease: the takeover
    re-checks the expiry in its own statement."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        # One statement: extend under the claim and read the stop flags in the same breath.
        # On PostgreSQL the expiry is the database's clock plus the lease, never the caller's
        # ``now`` (a worker's clock, maybe skewed against the sweeper's host).
        cur.execute(
            _SQL["lease_heartbeat_database_clock"]
            if dialect.database_clock()
            else _SQL["lease_heartbeat"],
            {
                "expires": now + timedelta(seconds=lease_seconds()),
                "seconds": lease_seconds(),
                "id": operation_id,
                "generation": lease_generation,
                "digest": lease_token_digest(lease_token),
            },
        )
        row = fetchone_named(cur)
    if row is None:
        rejection_record(
            operation_id=operation_id,
            kind="stale_heartbeat",
            lease_generation=lease_generation,
            detail={},
        )
        raise StaleLease("the lease is not the current one", operation=operation_id)
    expires = db_datetime(row["lease_expires_at"])
    assert expires is not None
    asked = stop_asked(
        cancel_requested=bool(row["cancel_requested"]),
        covered=stop_covers(row["compensates_id"]),
        cancellation=row["cancellation"],
        condition=row["condition"],
    )
    return expires, asked


def lease_expire_sweep(now: datetime | None = None, batch: int = 200) -> int:
    """Take over running operations whose lease expired. The work becomes claimable again (a new
    generation at the next claim), the invocation is marked lost, attempts stay used. Where
    invoking again could repeat an effect nobody can confirm (no receiver contract, or the task
    is stopping), the operation goes to a person instead. The takeover re-checks the expiry in
    its guarded statement, so a heartbeat that committed after the read keeps its lease.

    Locks: the operation row, then its task's (the global order); the target is decided from
    the task read under its lock, so a stop that committed first is seen, and one still under
    way waits for the takeover and then settles what it left (runtime.stoprule)."""
    clock = lease_clock(now)  # leases run on the database's clock
    now = now or timezone.now()
    expired_ids = list(
        Operation.objects.filter(status=S.RUNNING, lease_expires_at__lt=clock)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:batch]
    )
    taken = 0
    for op_id in expired_ids:
        crash_point("sweep.after_read")
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update()
                .filter(pk=op_id, status=S.RUNNING, lease_expires_at__lt=clock)
                .first()
            )
            if op is None:
                continue
            op.task = Task.objects.select_for_update().get(pk=op.task_id)
            generation = op.lease_generation
            target, reason = _takeover_target(op, op.task)
            try:
                transitioned = operation_transition_txn(
                    op,
                    target,
                    now=now,
                    actor=SWEEPER,
                    fields={"lease_expires_at": None, "status_reason": reason},
                    lease_generation=generation,
                    where={"lease_expires_at__lt": clock},
                    data={"lease_generation": generation, "reason": reason},
                    event_type="operation.lease_expired",
                )
            except (TransitionRejected, StaleLease):
                continue
            Invocation.objects.filter(
                operation=op, lease_generation=generation, outcome__isnull=True
            ).update(outcome=Invocation.OUTCOME_LOST, finished_at=now)
            # Limits: the lost call's usage is unknown, never free.
            budget_mark_unknown_txn(budget=op.task.budget, op=op, actor=SWEEPER, now=now)
            if target == S.PENDING and op.executor == Operation.EXECUTOR_WORKER:
                outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)
            elif target != S.PENDING:
                operation_settled_txn(op, transitioned.task, now=now, actor=SWEEPER)
            taken += 1
    return taken


def _takeover_target(op: Operation, task: Task) -> tuple[str, str]:
    """Where expired work goes. ``task`` was read under its row lock."""
    if contract_of(op.tool) == Contract.NONE:
        # With no receiver contract, a dispatched call whose worker went silent may or may
        # not have taken effect, and invoking again could repeat it: a person decides.
        return (
            S.UNRESOLVED,
            "lease expired with the outcome unconfirmed; the receiver cannot be asked",
        )
    if task_stopping(task) and stop_covers(op.compensates_id):
        # No covered work is re-admitted for a stopping task, and the lost call is unconfirmed:
        # only a pure call is simply cancelled; any other outcome stays with a person.
        why = f"lease expired after the stop ({stop_reason(task)})"
        if stop_target(op.tool, unconfirmed=True) == S.CANCELLED:
            return S.CANCELLED, why
        return S.UNRESOLVED, f"{why}; the outcome is unconfirmed"
    return S.PENDING, "lease expired"


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


def cancel_requested_txn(
    task_id: str, locked: list[Operation], *, now: datetime, actor: str, reason: str
) -> list[str]:
    """Ask the task's running covered operations to stop (they learn it from their heartbeat),
    journalling the request for each, inside the caller's transaction. The operations' state
    versions do not move: a result that arrives anyway is still accepted and kept.

    Preconditions: ``locked`` are the task's live operations, locked (in ascending id) before
    the task row and read under those locks; only they are touched (an operation updated
    without its lock while the task row is held would deadlock with its own report)."""
    running = [
        (op.pk, op.state_version)
        for op in sorted(locked, key=lambda o: o.pk)
        if op.status == S.RUNNING and stop_covers(op.compensates_id) and not op.cancel_requested
    ]
    if not running:
        return []
    Operation.objects.filter(pk__in=[pk for pk, _ in running]).update(cancel_requested=True)
    for pk, version in running:
        event_append_txn(
            task_id=task_id,
            type="operation.cancel_requested",
            state_version=version,
            now=now,
            operation_id=pk,
            actor=actor,
            data={"reason": reason},
        )
    return [pk for pk, _ in running]


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
            ops = hotpath.claim_batch_txn(
                operation_ids,
                tools=tools,
                execution_id=execution_id,
                lease_seconds=lease_seconds(),
                token_digest=lease_token_digest(token),
                actor=execution_actor(execution_id),
                now=now,
            )
            crash_point("claim.batch_before_commit")
    except hotpath.BatchStopped:
        return Batch([], list(operation_ids))
    claimed = {op.pk for op in ops}
    return Batch(
        [
            Lease(
                op.pk,
                op.lease_generation,
                op.state_version,
                _expiry(op),
                op.attempts_used,
                op,
                token,
            )
            for op in ops
        ],
        [i for i in dict.fromkeys(operation_ids) if i not in claimed],
    )
