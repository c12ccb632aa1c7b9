"""Leases and fencing. A claim sets the owner execution, ``lease_generation + 1`` and the expiry in
one guarded UPDATE; heartbeats extend only under the same generation; expiry hands the work to a
new generation but never proves the old owner stopped."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runtime.errors import NotClaimable, StaleLease, TransitionRejected
from runtime.models import Invocation, Operation
from runtime.outbox import TOPIC_EXECUTE, outbox_consume_txn, outbox_enqueue_txn
from runtime.statemachine import operation_transition_txn, rejection_record
from runtime.tools import Contract, adapters, contract_of
from runtime.transitions import Cancellation, OperationStatus

S = OperationStatus


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


def lease_seconds() -> int:
    return int(settings.LEASE_SECONDS)


def operation_claim(
    operation_id: str,
    *,
    execution_id: str,
    executor: str = Operation.EXECUTOR_WORKER,
    now: datetime | None = None,
) -> Lease | Refusal:
    """Claim a claimable operation for ``execution_id``; a Refusal when there is nothing to claim
    (a duplicate or late delivery, or work that is not due). The claim consumes the operation's
    outbox rows. Work whose task no longer admits it is settled instead of claimed.

    Preconditions: none; safe to call any number of times concurrently (exactly one wins).
    """
    now = now or timezone.now()
    with transaction.atomic():
        op = Operation.objects.select_related("task").filter(pk=operation_id).first()
        if op is None:
            return Refusal("no such operation", operation_exists=False)
        if op.status not in S.CLAIMABLE:
            return Refusal(f"operation is {op.status} (duplicate or late delivery)")
        if op.executor != executor:
            return Refusal(f"operation is executed by the {op.executor}")
        if op.next_attempt_at is not None and op.next_attempt_at > now:
            return Refusal("the retry is not due yet")
        task = op.task
        cleanup = op.compensates_id is not None  # compensations outlive the stop they serve
        if task.cancellation != Cancellation.NONE and not cleanup:
            operation_settle_txn(op, S.CANCELLED, now=now, reason="the task was cancelled")
            return Refusal("the task was cancelled")
        if task.paused:
            # Paused work is not announced again until resume.
            outbox_consume_txn(op.pk)
            return Refusal("the task is paused")
        deadline = op.deadline or task.deadline
        if deadline is not None and now >= deadline and not cleanup:
            reason = "the deadline passed before the work could start"
            operation_settle_txn(op, S.EXPIRED, now=now, reason=reason)
            return Refusal("the deadline passed")
        if executor == Operation.EXECUTOR_WORKER:
            adapter = adapters().get(op.tool)
            if adapter is None or not adapter.supports(op.tool_version):
                reason = (
                    f"recorded under {op.tool} version {op.tool_version or '?'}, which this "
                    f"worker does not support"
                    + (f" (it runs version {adapter.version})" if adapter else " (tool missing)")
                )
                operation_settle_txn(op, S.MANUAL_INTERVENTION, now=now, reason=reason)
                return Refusal(reason)
        if op.attempts_used >= op.max_attempts:
            operation_settle_txn(
                op,
                S.UNRESOLVED if cleanup else S.FAILED,
                now=now,
                reason="attempts exhausted",
                fields={"error": {"kind": "permanent", "message": "attempts exhausted"}},
            )
            return Refusal("attempts exhausted")
        generation = op.lease_generation + 1
        number = op.attempts_used + 1
        expires = now + timedelta(seconds=lease_seconds())
        try:
            operation_transition_txn(
                op,
                S.RUNNING,
                now=now,
                fields={
                    "lease_generation": F("lease_generation") + 1,
                    "lease_expires_at": expires,
                    "execution_id": execution_id,
                    "attempts_used": F("attempts_used") + 1,
                    "first_attempt_at": op.first_attempt_at or now,
                    "next_attempt_at": None,
                    "status_reason": "",
                },
                data={"lease_generation": generation, "execution": execution_id, "attempt": number},
            )
        except TransitionRejected:
            return Refusal("another claimant won")
        op.lease_generation = generation
        op.attempts_used = number
        Invocation.objects.create(
            operation=op,
            number=number,
            lease_generation=generation,
            execution_id=execution_id,
            started_at=now,
        )
        outbox_consume_txn(op.pk)
    return Lease(op.pk, generation, op.state_version, expires, number, op)


def operation_settle_txn(
    op: Operation,
    target: str,
    *,
    now: datetime,
    reason: str,
    actor: str = "",
    fields: dict[str, Any] | None = None,
) -> None:
    """Settle work that is not running (cancelled, expired, refused, exhausted): the guarded
    transition, its announcements consumed, and whatever the settling sets in motion (a
    stopping task may now be quiescent). Inside the caller's transaction."""
    from runtime.compensation import after_settle_txn

    transitioned = operation_transition_txn(
        op,
        target,
        now=now,
        actor=actor,
        fields={"status_reason": reason, **(fields or {})},
        data={"reason": reason},
    )
    outbox_consume_txn(op.pk)
    after_settle_txn(op, transitioned.task, now=now)


def lease_heartbeat(
    operation_id: str, lease_generation: int, now: datetime | None = None
) -> tuple[datetime, bool]:
    """Extend the lease under the caller's generation; returns (new expiry, cancel requested).
    Raises StaleLease when the generation is no longer current."""
    now = now or timezone.now()
    expires = now + timedelta(seconds=lease_seconds())
    touched = Operation.objects.filter(
        pk=operation_id, status=S.RUNNING, lease_generation=lease_generation
    ).update(lease_expires_at=expires)
    if touched != 1:
        rejection_record(
            operation_id=operation_id,
            kind="stale_heartbeat",
            lease_generation=lease_generation,
            detail={},
        )
        raise StaleLease("the lease generation is not the current one", operation=operation_id)
    row = (
        Operation.objects.filter(pk=operation_id)
        .values("cancel_requested", "task__cancellation")
        .first()
    )
    cancel = bool(row and (row["cancel_requested"] or row["task__cancellation"] != "none"))
    return expires, cancel


def lease_expire_sweep(now: datetime | None = None, batch: int = 200) -> int:
    """Take over running operations whose lease expired: the work becomes claimable again (a
    new generation at the next claim), the invocation is marked lost, attempts stay used."""
    now = now or timezone.now()
    expired_ids = list(
        Operation.objects.filter(status=S.RUNNING, lease_expires_at__lt=now)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:batch]
    )
    taken = 0
    for op_id in expired_ids:
        with transaction.atomic():
            op = Operation.objects.filter(pk=op_id).first()
            if op is None or op.status != S.RUNNING or not op.lease_expires_at:
                continue
            if op.lease_expires_at >= now:
                continue
            generation = op.lease_generation
            # With no receiver contract, a dispatched call whose worker went silent may or may
            # not have taken effect, and invoking again could repeat it: a person decides.
            unconfirmed = contract_of(op.tool) == Contract.NONE
            target = S.UNRESOLVED if unconfirmed else S.PENDING
            reason = (
                "lease expired with the outcome unconfirmed; the receiver cannot be asked"
                if unconfirmed
                else "lease expired"
            )
            try:
                transitioned = operation_transition_txn(
                    op,
                    target,
                    now=now,
                    fields={"lease_expires_at": None, "status_reason": reason},
                    lease_generation=generation,
                    data={"lease_generation": generation, "reason": reason},
                    event_type="operation.lease_expired",
                )
            except (TransitionRejected, StaleLease):
                continue
            Invocation.objects.filter(
                operation=op, lease_generation=generation, outcome__isnull=True
            ).update(outcome=Invocation.OUTCOME_LOST, finished_at=now)
            if target == S.PENDING and op.executor == Operation.EXECUTOR_WORKER:
                outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)
            else:
                from runtime.compensation import after_settle_txn

                after_settle_txn(op, transitioned.task, now=now)
            taken += 1
    return taken


def claim_refused_record(operation_id: str, execution_id: str, reason: str) -> None:
    rejection_record(
        operation_id=operation_id,
        kind="refused_claim",
        execution_id=execution_id,
        detail={"reason": reason},
    )


def agent_claim(operation_id: str, execution_id: str) -> Lease:
    """An agent's claim of an agent-executed operation; NotClaimable when it cannot be had."""
    lease = operation_claim(
        operation_id, execution_id=execution_id, executor=Operation.EXECUTOR_AGENT
    )
    if isinstance(lease, Refusal):
        if lease.operation_exists:
            claim_refused_record(operation_id, execution_id, lease.reason)
        raise NotClaimable(f"the operation is not claimable now: {lease.reason}")
    return lease
