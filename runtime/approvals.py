"""Approvals: a person's decision bound to the exact proposal of one operation.

The release gate is one transaction. It locks the operation row, then the approval, then the
task (the global lock order: operation rows first, then the task), takes ``now`` only after the
locks, and rechecks everything there: the approval is still pending and unexpired at that moment,
the decision's parameter hash is the current proposal's, the approver holds the right now and is
neither the requester nor the editor, and the task admits work. Only then does the operation
become runnable, with its outbox row, in the same transaction. A concurrent decision, expiry or
cancellation serialises on the operation row and finds the result of the first.

Here: the decision (one or in bulk) and the edit; what an approve and a deny write is in
runtime.approval_decisions, the two-person rule's votes in runtime.approval_votes, renewal,
transformation and expiry in runtime.approval_expiry, the reads in runtime.selectors.approvals.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runtime.actors import Actor
from runtime.approval_decisions import approval_approve_txn, approval_deny_txn
from runtime.approval_votes import approval_votes, approvals_required_for
from runtime.crashpoints import crash_point
from runtime.errors import (
    ApprovalDecided,
    ApprovalExpired,
    ApprovalStale,
    DomainError,
    InvalidInput,
    TransitionRejected,
)
from runtime.events import event_append_txn
from runtime.hashing import params_hash
from runtime.models import Approval, Operation
from runtime.notify_events import approval_noticed_txn
from runtime.policy import can_decide_approval, can_edit_approval
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.selectors.approvals import approval_get
from runtime.tasks import within_task_deadline
from runtime.tools import ToolAdapter, adapter_for
from runtime.transitions.status import approval_transition_txn

A = ApprovalStatus


S = OperationStatus


DECISIONS = ("approve", "deny")


MAX_BULK = 100


def approval_locked_txn(approval_id: str, operation_id: str) -> tuple[Operation, Approval]:
    """Operation row first, then the approval (then, where needed, the task)."""
    op = Operation.objects.select_for_update().get(pk=operation_id)
    approval = Approval.objects.select_for_update().get(pk=approval_id)
    return op, approval


def _pending_or_refuse(approval: Approval, now: datetime) -> None:
    if approval.status == A.EXPIRED or (
        approval.status == A.PENDING and approval.expires_at <= now
    ):
        raise ApprovalExpired("the approval expired before the decision reached it")
    if approval.status != A.PENDING:
        what = "superseded by an edit" if approval.reason == "superseded" else approval.status
        raise ApprovalDecided(f"the approval was already decided ({what})")


def approval_decide(
    actor: Actor, approval_id: str, *, decision: str, reason: str, params_hash: str
) -> Approval:
    """Approve or deny a pending approval through the release gate. An approve is a vote
    (runtime.approval_votes): the approval stays pending until as many distinct people as it
    requires voted; a deny by anyone who may decide denies it.

    Preconditions: ``actor`` is the authenticated caller (never a name from a request body).
    Raises InvalidInput (approving without ``params_hash``), NotAuthorized (no right now,
    requester, editor), ApprovalExpired, ApprovalDecided, ApprovalStale (another proposal),
    TaskRefused (cancelled, paused, ended, past deadline), ApprovalAlreadyApproved (this
    person's vote is recorded already).
    """
    if decision not in DECISIONS:
        raise InvalidInput("decision must be approve or deny")
    reason = (reason or "").strip()
    if decision == "deny" and not reason:
        raise InvalidInput("a denial needs a reason")
    seen = approval_get(actor, approval_id)
    if decision == "approve" and not params_hash:
        # An approval is bound to the exact parameters the approver saw: without their hash
        # the request is incomplete (400), not a decision about another proposal (409).
        raise InvalidInput(
            "params_hash is required to approve: the hash of the parameters being approved",
            field="params_hash",
        )
    with transaction.atomic():
        op, approval = approval_locked_txn(approval_id, seen.operation_id)
        crash_point("approval.gate_locked")
        # The moment of the gate: after the locks, so a request that began before the expiry
        # cannot carry an earlier clock past it.
        now = timezone.now()
        can_decide_approval(actor, approval)
        _pending_or_refuse(approval, now)
        decided = {
            "decided_by": actor.label,
            "decider_key": actor.key,
            "decided_at": now,
            "reason": reason[:2000],
        }
        data = {
            "approval": approval.pk,
            "proposal_version": approval.proposal_version,
            "params_hash": approval.params_hash,
            "reason": reason,
        }
        decide = approval_approve_txn if decision == "approve" else approval_deny_txn
        decide(actor, op, approval, params_hash, decided=decided, data=data, now=now)
        crash_point("approval.before_commit")
    return approval


@dataclass(frozen=True)
class BulkItem:
    approval: str
    decision: str
    reason: str
    params_hash: str


def approval_decide_bulk(actor: Actor, items: list[BulkItem]) -> list[dict[str, Any]]:
    """Decide many approvals; each passes the release gate on its own (its own savepoint), and
    one failing item changes nothing of the others."""
    if not items or len(items) > MAX_BULK:
        raise InvalidInput(f"decisions must hold 1 to {MAX_BULK} items")
    results: list[dict[str, Any]] = []
    for item in items:
        try:
            approval = approval_decide(
                actor,
                item.approval,
                decision=item.decision,
                reason=item.reason,
                params_hash=item.params_hash,
            )
        except DomainError as exc:
            results.append(
                {
                    "approval": item.approval,
                    "status": exc.status,
                    "error": {"code": exc.code, "message": exc.message},
                }
            )
        else:
            results.append(
                {
                    "approval": item.approval,
                    "status": 200,
                    "approval_status": approval.status,
                    "approvals_required": approval.approvals_required,
                    "approved_by": [v.approver for v in approval_votes(approval.pk)],
                }
            )
    return results


def approval_edit(
    actor: Actor, approval_id: str, *, params: dict[str, Any], reason: str
) -> Approval:
    """An operator edits a pending proposal: the operation's parameters change, the old approval
    is denied as ``superseded`` and a new pending approval binds the new proposal version, marked
    as edited by ``actor`` (who may not approve it). Preconditions: ``params`` is a JSON object."""
    seen = approval_get(actor, approval_id)  # what the actor may not see is a 404 first
    can_edit_approval(actor)
    adapter = _edited_params_check(seen, params)
    digest = params_hash(params)
    reason = (reason or "").strip()
    with transaction.atomic():
        op, old = approval_locked_txn(approval_id, seen.operation_id)
        now = timezone.now()
        _pending_or_refuse(old, now)
        if op.status != S.WAITING_APPROVAL or op.params_hash != old.params_hash:
            raise ApprovalStale("the operation moved on from this proposal")
        if digest == old.params_hash:
            raise InvalidInput("the edit does not change the parameters")
        _superseded_txn(actor, op, old, params, digest, now=now)
        # A new proposal starts over with no vote, and never asks fewer approvers than the one
        # it replaces (work in flight keeps its rule) nor than the policy asks of the new one.
        required = max(old.approvals_required, approvals_required_for(adapter, params))
        new = _successor_txn(actor, op, old, (params, digest, required), reason=reason, now=now)
        approval_noticed_txn(new, actor=actor.label, now=now)
    return new


def _edited_params_check(seen: Approval, params: dict[str, Any]) -> ToolAdapter:
    """The edited parameters, held to the schema of the tool version the operation was
    recorded under (and runs): that version's adapter."""
    adapter = adapter_for(seen.tool)
    if adapter.declared:
        recorded = Operation.objects.filter(pk=seen.operation_id).values_list(
            "tool_version", flat=True
        )
        adapter = adapter.at_version(recorded.first() or "")
    adapter.validate(params)
    return adapter


def _superseded_txn(
    actor: Actor,
    op: Operation,
    old: Approval,
    params: dict[str, Any],
    digest: str,
    *,
    now: datetime,
) -> None:
    """The old approval denied as ``superseded``; the operation takes the new parameters."""
    approval_transition_txn(
        old,
        A.DENIED,
        now=now,
        fields={
            "decided_by": actor.label,
            "decider_key": actor.key,
            "decided_at": now,
            "reason": "superseded",
        },
    )
    touched = Operation.objects.filter(
        pk=op.pk, status=S.WAITING_APPROVAL, state_version=op.state_version
    ).update(
        params=params, params_hash=digest, state_version=F("state_version") + 1, updated_at=now
    )
    if touched != 1:
        raise TransitionRejected("the operation changed while it was being edited")
    op.state_version += 1


def _successor_txn(
    actor: Actor,
    op: Operation,
    old: Approval,
    proposal: tuple[dict[str, Any], str, int],
    *,
    reason: str,
    now: datetime,
) -> Approval:
    """The new pending approval of the edited proposal (``proposal``: its parameters, their
    hash, the approvers it requires), with the old one's validity from now, journaled as
    ``approval.edited``."""
    params, digest, required = proposal
    validity = old.expires_at - old.created_at
    new = Approval.objects.create(
        operation=op,
        task_id=op.task_id,
        status=A.PENDING,
        proposal_version=old.proposal_version + 1,
        params=params,
        params_hash=digest,
        tool=old.tool,
        scope=old.scope,
        approver_role=old.approver_role,
        approvals_required=required,
        requested_by=old.requested_by,
        requester_key=old.requester_key,
        requested_for_key=old.requested_for_key,
        requester_minted_by=old.requester_minted_by,
        edited_by=actor.label,
        editor_key=actor.key,
        previous=old,
        reason=reason[:2000],
        expires_at=within_task_deadline(now + validity, op.task.deadline),
        created_at=now,
    )
    event_append_txn(
        task_id=op.task_id,
        type="approval.edited",
        state_version=op.state_version,
        now=now,
        op=op,
        actor=actor.label,
        data={
            "approval": new.pk,
            "supersedes": old.pk,
            "proposal_version": new.proposal_version,
            "params_hash": digest,
            "reason": reason,
            "approvals_required": required,
        },
    )
    return new
