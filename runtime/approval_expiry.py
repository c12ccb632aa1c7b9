"""Approvals past their validity: the sweeper expires them (the operation goes ``expired`` and
stays visible; nothing retries it) and closes those whose operation left ``waiting_approval``
some other way; an admin renews an expired one (admitted again against its queue) or
transforms it into a denial. Each locks the operation row, then the approval."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from runtime.actors import SWEEPER, Actor
from runtime.admission import queue_admit_txn
from runtime.approval_gate import MAX_APPROVAL_TIMEOUT_SECONDS
from runtime.approval_votes import approval_votes_void_txn
from runtime.approvals import approval_locked_txn
from runtime.crashpoints import crash_point
from runtime.errors import Conflict, InvalidInput, WaitNotExpired
from runtime.events import event_append_txn
from runtime.models import Approval, Operation
from runtime.notify_events import approval_noticed_txn
from runtime.policy import can_manage_waits
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.selectors.approvals import approval_get
from runtime.tasks import task_renewal_txn
from runtime.transitions.settle import operation_settle_txn
from runtime.transitions.status import approval_transition_txn, operation_transition_txn

A = ApprovalStatus


S = OperationStatus


def approval_renew(
    actor: Actor, approval_id: str, *, expires_in_seconds: int, reason: str
) -> Approval:
    """An admin gives an expired approval a new validity period; the operation waits for a
    decision again. Audited in the journal with the admin and the reason."""
    seen = approval_get(actor, approval_id)  # what the actor may not see is a 404 first
    can_manage_waits(actor)
    if not 1 <= expires_in_seconds <= MAX_APPROVAL_TIMEOUT_SECONDS:
        raise InvalidInput(
            f"expires_in_seconds must be between 1 and {MAX_APPROVAL_TIMEOUT_SECONDS}"
        )
    with transaction.atomic():
        # Limits: the renewed work waits again, so it is admitted again against its class's
        # queue capacity (429 queue_full when full); the slot row comes before the operation's.
        queue_admit_txn(seen.tool)
        op, approval = approval_locked_txn(approval_id, seen.operation_id)
        now = timezone.now()
        if approval.status != A.EXPIRED or op.status != S.EXPIRED:
            raise WaitNotExpired(f"the approval is {approval.status}, not expired")
        expires = task_renewal_txn(op.task_id, now + timedelta(seconds=expires_in_seconds), now)
        approval_transition_txn(approval, A.PENDING, now=now, fields={"expires_at": expires})
        # Decided again from the start: the approvals given before it expired no longer count.
        voided = approval_votes_void_txn(approval)
        operation_transition_txn(
            op,
            S.WAITING_APPROVAL,
            now=now,
            actor=actor.label,
            fields={"status_reason": ""},
            event_type="approval.renewed",
            data={
                "approval": approval.pk,
                "expires_at": expires.isoformat(),
                "reason": reason,
                "voided": voided,
            },
        )
        approval_noticed_txn(approval, actor=actor.label, now=now)
    return approval


def approval_transform_txn(
    op: Operation, approval: Approval, *, actor: Actor, reason: str, now: datetime
) -> None:
    """An expired approval becomes a denial and its operation is cancelled. Preconditions:
    inside a transaction holding the operation's and the approval's rows."""
    if approval.status != A.EXPIRED or op.status != S.EXPIRED:
        raise WaitNotExpired(f"the approval is {approval.status}, not expired")
    approval_transition_txn(
        approval,
        A.DENIED,
        now=now,
        fields={
            "decided_by": actor.label,
            "decider_key": actor.key,
            "decided_at": now,
            "reason": reason or "transformed after expiry",
        },
    )
    operation_settle_txn(
        op, S.CANCELLED, now=now, reason=reason or "expired approval transformed", actor=actor.label
    )


def approval_expire_sweep(now: datetime | None = None, batch: int = 200) -> int:
    """Expire pending approvals past their validity (the operation goes ``expired`` and stays
    visible for an admin; nothing retries it), and close pending approvals whose operation left
    ``waiting_approval`` some other way (cancelled with its task)."""
    now = now or timezone.now()
    due = list(
        Approval.objects.filter(status=A.PENDING, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", "operation_id")[:batch]
    )
    orphaned = list(
        Approval.objects.filter(status=A.PENDING)
        .exclude(operation__status=S.WAITING_APPROVAL)
        .values_list("pk", "operation_id")[:batch]
    )
    done = 0
    for approval_id, operation_id in dict.fromkeys(due + orphaned):
        try:
            with transaction.atomic():
                op, approval = approval_locked_txn(approval_id, operation_id)
                crash_point("approval.expire_locked")
                at = timezone.now()
                if approval.status != A.PENDING:
                    continue
                if op.status != S.WAITING_APPROVAL:
                    reason = f"the operation was {op.status}"
                    approval_transition_txn(
                        approval, A.DENIED, now=at, fields={"decided_at": at, "reason": reason}
                    )
                    event_append_txn(
                        task_id=op.task_id,
                        type="approval.closed",
                        state_version=op.state_version,
                        now=at,
                        op=op,
                        actor=SWEEPER,
                        data={"approval": approval.pk, "reason": reason},
                    )
                    done += 1
                    continue
                if approval.expires_at > at:
                    continue
                approval_transition_txn(
                    approval, A.EXPIRED, now=at, extra_guard={"expires_at__lte": at}
                )
                operation_transition_txn(
                    op,
                    S.EXPIRED,
                    now=at,
                    actor=SWEEPER,
                    fields={"status_reason": "no decision before the approval expired"},
                    event_type="approval.expired",
                    data={"approval": approval.pk, "reason": "approval expired"},
                )
                done += 1
        except (Conflict, Approval.DoesNotExist, Operation.DoesNotExist):
            continue
    return done
