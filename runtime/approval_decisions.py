"""The release gate's two outcomes (runtime.approvals holds the gate itself, its locks and its
checks): an approve, which records the person's vote and, once the votes reach what the approval
requires, seals it and makes its operation runnable; and a deny, which fails the operation.
Both run inside the gate's transaction, holding the operation's and the approval's rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.actors import Actor
from runtime.approval_seal import approval_seal
from runtime.approval_votes import (
    approval_vote_txn,
    approval_voted_txn,
    approval_votes,
    approval_votes_standing_txn,
)
from runtime.errors import ApprovalStale
from runtime.events import event_append_txn
from runtime.models import Approval, Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn
from runtime.rules.admission import task_admission_check
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.transitions.settle import operation_settle_txn
from runtime.transitions.status import approval_transition_txn, operation_transition_txn

A = ApprovalStatus
S = OperationStatus


def approval_approve_txn(
    actor: Actor,
    op: Operation,
    approval: Approval,
    params_hash: str,
    *,
    decided: dict[str, Any],
    data: dict[str, Any],
    now: datetime,
) -> None:
    """The gate's approval: the task still admits work and the decision is for the current
    proposal; the vote is recorded, and once the votes that still count reach the approval's
    count, it is sealed and the operation becomes runnable (with its outbox row)."""
    task = Task.objects.select_for_update().get(pk=op.task_id)
    task_admission_check(
        condition=task.condition,
        cancellation=task.cancellation,
        paused=task.paused,
        deadline=task.deadline,
        now=now,
    )
    if (
        params_hash != approval.params_hash
        or approval.params_hash != op.params_hash
        or op.status != S.WAITING_APPROVAL
    ):
        raise ApprovalStale("the decision is for another proposal than the current one")
    votes = approval_vote_txn(actor, approval, now=now)
    votes, voided = approval_votes_standing_txn(approval, votes, checked=actor.key)
    data.update(approvals_required=approval.approvals_required, voided=voided)
    data.update(approvals=len(votes), approved_by=[v.approver for v in votes])
    if len(votes) < approval.approvals_required:
        approval_voted_txn(actor, op, approval, data=data, now=now)
        return
    # Sealed over what was decided, the voters and the parameters as stored; checked at release.
    decided["seal"] = approval_seal(
        approval,
        approver=actor.key,
        operation_params=op.params,
        voters=[v.approver_key for v in votes],
    )
    approval_transition_txn(
        approval,
        A.APPROVED,
        now=now,
        fields=decided,
        extra_guard={"expires_at__gt": now, "params_hash": params_hash},
    )
    operation_transition_txn(
        op,
        S.PENDING,
        now=now,
        actor=actor.label,
        fields={"status_reason": ""},
        event_type="approval.approved",
        data=data,
    )
    if op.executor == Operation.EXECUTOR_WORKER:
        outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)


def approval_deny_txn(
    actor: Actor,
    op: Operation,
    approval: Approval,
    params_hash: str,
    *,
    decided: dict[str, Any],
    data: dict[str, Any],
    now: datetime,
) -> None:
    """The gate's denial: the operation still waiting on it fails, and the journal says why
    (with the approvals it had, if any: one deny outweighs them)."""
    if params_hash and params_hash != approval.params_hash:
        raise ApprovalStale("the decision is for another proposal than the current one")
    if approval.approvals_required > 1:
        voters = [v.approver for v in approval_votes(approval.pk)]
        data.update(approvals_required=approval.approvals_required)
        data.update(approvals=len(voters), approved_by=voters)
    approval_transition_txn(approval, A.DENIED, now=now, fields=decided)
    reason = data["reason"]
    if op.status == S.WAITING_APPROVAL:
        operation_settle_txn(
            op,
            S.FAILED,
            now=now,
            reason=f"approval denied: {reason}",
            actor=actor.label,
            fields={"error": {"kind": "denied", "message": reason}},
        )
    event_append_txn(
        task_id=op.task_id,
        type="approval.denied",
        state_version=op.state_version,
        now=now,
        op=op,
        actor=actor.label,
        data=data,
    )
