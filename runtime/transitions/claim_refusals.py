"""What a claim that may not run settles to: a refusal (``Refusal``: nothing claimed), or the
work settled for the rule that refused it (runtime.rules.claim's ``Settles``): stopped with its
task, expired, handed to a person, exhausted, or released by its approval. Each runs inside the
claim's transaction; a settling that loses its race refuses instead."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from runtime.approval_gate import approval_release_txn
from runtime.control import paused_claim_refused_txn
from runtime.crashpoints import crash_point
from runtime.errors import TransitionRejected
from runtime.models import Operation
from runtime.rules.claim import ClaimFacts, ClaimRule, Settles
from runtime.rules.statuses import OperationStatus
from runtime.stoprule import stop_reason
from runtime.transitions.settle import operation_settle_txn, operation_stop_txn

S = OperationStatus


@dataclass(frozen=True)
class Refusal:
    """Why a delivery claimed nothing (duplicate, late, not due, or the task stopped it)."""

    reason: str
    operation_exists: bool = True


def ledger_refused(operation_id: str, now: datetime, *, actor: str) -> Refusal:
    """The ledger cannot hold another call: the work stops here. It failed where every earlier
    call's outcome is known (a retry after confirmed failures); where an earlier call may have
    had an effect nobody confirmed (its usage unknown), the writer hands it to a person instead
    (runtime.transitions.status's possible-effect rule)."""
    with transaction.atomic():
        op = Operation.objects.select_related("task").filter(pk=operation_id).first()
        if op is None or op.status not in S.CLAIMABLE:
            return Refusal("another claimant won")
        reason = "budget exhausted: the ledger cannot hold another call"
        return settle_or_refuse(
            op,
            S.FAILED,
            now=now,
            actor=actor,
            reason=reason,
            fields={"error": {"kind": "budget_exhausted", "message": reason}},
        )


def settle_or_refuse(
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


def stop_or_refuse(op: Operation, *, now: datetime, actor: str, reason: str) -> Refusal:
    try:
        operation_stop_txn(op, now=now, actor=actor, reason=reason)
    except TransitionRejected:
        return Refusal("another claimant won")
    return Refusal(reason)


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
        return settle_or_refuse(
            op, S.MANUAL_INTERVENTION, now=now, actor=actor, reason=refused.reason
        )
    return None


def claim_refused(
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
            return stop_or_refuse(op, now=now, actor=actor, reason=stop_reason(op.task))
        case Settles.REFUSE_PAUSED:
            # Pause: the delivery takes nothing and its announcement is spent (runtime.control).
            return Refusal(paused_claim_refused_txn(op.pk, op.task_id))
        case Settles.EXPIRED:
            return settle_or_refuse(op, S.EXPIRED, now=now, actor=actor, reason=rule.reason(facts))
        case Settles.MANUAL_INTERVENTION:
            reason = rule.reason(facts)
            return settle_or_refuse(op, S.MANUAL_INTERVENTION, now=now, actor=actor, reason=reason)
        case Settles.EXHAUSTED:
            # (Where an earlier call's outcome is unconfirmed, the writer makes it
            # ``unresolved``: runtime.transitions.status's possible-effect rule.)
            reason = rule.reason(facts)
            return settle_or_refuse(
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
