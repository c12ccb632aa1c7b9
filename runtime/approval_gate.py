"""The two ends of an approval that live on the operation path: the request written with the
proposal (the operation is created ``waiting_approval`` and nothing reaches the outbox), and the
release recheck at claim time (no claim runs a gated operation unless an approval of its current
parameter hash was granted). Kept apart from ``runtime.approvals`` so the proposal and claim
paths import nothing that imports them back."""

from __future__ import annotations

from datetime import datetime, timedelta

from runtime.actors import Actor
from runtime.events import event_append_txn
from runtime.models import Approval, Operation, Task
from runtime.statemachine import approval_transition_txn
from runtime.tasks import within_task_deadline
from runtime.tools import ToolAdapter
from runtime.transitions import ApprovalStatus

A = ApprovalStatus
MAX_APPROVAL_TIMEOUT_SECONDS = 30 * 24 * 3600


def approval_request_txn(
    op: Operation,
    *,
    task: Task,
    actor: Actor,
    adapter: ToolAdapter,
    timeout_seconds: int | None,
    now: datetime,
) -> Approval:
    """Bind a pending approval to ``op``'s current proposal. Preconditions: inside the proposal's
    transaction, ``op`` just created ``waiting_approval``."""
    seconds = timeout_seconds or adapter.approval_timeout_seconds
    creator = task.created_by_id
    approval = Approval.objects.create(
        operation=op,
        task_id=op.task_id,
        status=A.PENDING,
        proposal_version=1,
        params=op.params,
        params_hash=op.params_hash,
        tool=op.tool,
        scope=f"task:{op.task_id}",
        approver_role=adapter.approver_role,
        requested_by=actor.label,
        requester_key=actor.key,
        requested_for_key=f"user:{creator}" if creator is not None else "",
        # An approval never outlives its task's deadline.
        expires_at=within_task_deadline(now + timedelta(seconds=seconds), task.deadline),
        created_at=now,
    )
    event_append_txn(
        task_id=op.task_id,
        type="approval.requested",
        state_version=op.state_version,
        now=now,
        operation_id=op.pk,
        actor=actor.label,
        data={
            "approval": approval.pk,
            "proposal_version": 1,
            "params_hash": op.params_hash,
            "expires_at": approval.expires_at.isoformat(),
            "approver_role": adapter.approver_role,
        },
    )
    return approval


def approval_release_txn(op: Operation, *, now: datetime) -> str | None:
    """At claim: the approval granted for ``op``'s current parameter hash becomes released; a
    retry of released work stays covered. Returns why the claim must not run it, or None.
    Preconditions: inside the claim's transaction, for an operation with approval_required."""
    covering = (
        Approval.objects.filter(
            operation_id=op.pk,
            params_hash=op.params_hash,
            status__in=(A.APPROVED, A.RELEASED),
        )
        .order_by("-proposal_version")
        .first()
    )
    if covering is None:
        return "no approval covers these parameters"
    if covering.status == A.APPROVED:
        approval_transition_txn(covering, A.RELEASED, now=now, fields={"released_at": now})
    return None


def first_proposal_hash(op: Operation) -> str | None:
    """The parameter hash the requester proposed, before any edit by a person: an agent that
    repeats its own proposal gets the operation back, not a conflict with the edit."""
    if not op.approval_required:
        return None
    return (
        Approval.objects.filter(operation_id=op.pk, proposal_version=1)
        .values_list("params_hash", flat=True)
        .first()
    )
