"""The two ends of an approval that live on the operation path: the request written with the
proposal (the operation is created ``waiting_approval`` and nothing reaches the outbox), and the
release recheck at claim time (no claim runs a gated operation unless an approval of its current
proposal was granted, is still valid and its approver still holds the right). Kept apart from
``runtime.approvals`` so the proposal and claim paths import nothing that imports them back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from runtime.actors import Actor
from runtime.approval_seal import approval_seal_refusal
from runtime.approval_votes import (
    approval_votes,
    approval_votes_lost,
    approval_votes_void_txn,
    approvals_required_for,
)
from runtime.db import db_now
from runtime.events import event_append_txn
from runtime.hashing import params_hash
from runtime.models import Approval, Operation, Task
from runtime.notify_events import approval_noticed_txn
from runtime.outbox import outbox_consume_txn
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.tasks import within_task_deadline
from runtime.tools import ToolAdapter, adapters
from runtime.transitions.status import approval_transition_txn, operation_transition_txn

A = ApprovalStatus
S = OperationStatus
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
        requester_minted_by=actor.minted_by or "",
        approvals_required=approvals_required_for(adapter, op.params),
        # An approval never outlives its task's deadline.
        expires_at=within_task_deadline(now + timedelta(seconds=seconds), task.deadline),
        created_at=now,
    )
    event_append_txn(
        task_id=op.task_id,
        type="approval.requested",
        state_version=op.state_version,
        now=now,
        op=op,
        actor=actor.label,
        data={
            "approval": approval.pk,
            "proposal_version": 1,
            "params_hash": op.params_hash,
            "expires_at": approval.expires_at.isoformat(),
            "approver_role": adapter.approver_role,
            "approvals_required": approval.approvals_required,
        },
    )
    approval_noticed_txn(approval, actor=actor.label, now=now)
    return approval


@dataclass(frozen=True)
class ReleaseRefused:
    """Why a claim may not run gated work. ``returned``: the action already went back to a
    person (its approval expired, or reopened for another approver) and nothing is left to
    settle; otherwise no approval covers it and the claim settles it for a person."""

    reason: str
    returned: bool = False


def approval_release_txn(op: Operation, *, now: datetime, actor: str) -> ReleaseRefused | None:
    """At claim, the release recheck: the newest decision on ``op`` must be an approval of its
    current proposal (parameter hash and proposal version), not denied, still valid by the
    database's clock, its votes at least the approvers it requires (the two-person rule), and
    every voter must hold the right now (roles and activity read fresh). Then it becomes
    released and the claim goes on (None); a retry of released work stays covered. Otherwise
    nothing runs: an approval that expired goes ``expired`` with its operation (an admin renews
    or transforms it on /waits/); a voter who lost the right loses the vote, and the request
    waits on /approvals/ for another approver.

    The votes are checked twice over, on purpose: the seal covers the count required and the
    voters' keys (runtime.approval_seal), so a vote row added, dropped or rewritten behind the
    application's back is an integrity failure; and the gate counts the votes and asks each
    voter's right itself, because the seal says who voted, not that they may still decide.

    Preconditions: inside the claim's transaction, holding ``op``'s row (lock order: the
    operation, then its approvals, then the task through the journal)."""
    latest = (
        Approval.objects.select_for_update()
        .filter(operation_id=op.pk)
        .order_by("-proposal_version", "-created_at")
        .first()
    )
    if latest is None or latest.status not in (A.APPROVED, A.RELEASED):
        return ReleaseRefused("no approval covers these parameters")
    # The moment of release on the database's clock: the validity was set by another host.
    at = db_now()
    # Expiry first: an expiry moved earlier behind the application's back only ends the approval
    # sooner, which is safe; moved later (or anything else changed), the seal below refuses.
    if latest.status == A.APPROVED and latest.expires_at <= at:
        return _expired_at_release_txn(latest, op, at=at, now=now, actor=actor)
    # Integrity: the decision and the parameters it covers, as stored now, under its seal (a
    # keyed MAC, runtime.approval_seal); this also covers a retry of released work.
    votes = approval_votes(latest.pk)
    tampered = approval_seal_refusal(latest, op, [v.approver_key for v in votes])
    if tampered is None and len(votes) < latest.approvals_required:
        tampered = f"{len(votes)} of the {latest.approvals_required} approvals it requires"
    if tampered is not None:
        return _integrity_refused(latest, op, f"integrity check failed: {tampered}", now, actor)
    if latest.status == A.RELEASED:
        return None
    lost = approval_votes_lost(latest, votes)
    if lost:
        refusal = next(iter(lost.values()))
        if op.status != S.PENDING:
            return ReleaseRefused(f"the approval no longer holds: {refusal}")
        return _reopened_txn(latest, op, lost, now=now, actor=actor)
    approval_transition_txn(
        latest,
        A.RELEASED,
        now=now,
        fields={"released_at": now},
        extra_guard={"expires_at__gt": at, "params_hash": op.params_hash},
    )
    return None


def _expired_at_release_txn(
    latest: Approval, op: Operation, *, at: datetime, now: datetime, actor: str
) -> ReleaseRefused:
    """The approval expired before its work could start: it and its operation go ``expired``
    (an admin renews or transforms it), and the claim's outbox row is consumed."""
    approval_transition_txn(latest, A.EXPIRED, now=now, extra_guard={"expires_at__lte": at})
    reason = "the approval expired before its work could start"
    operation_transition_txn(
        op,
        S.EXPIRED,
        now=now,
        actor=actor,
        fields={"status_reason": reason},
        event_type="approval.expired",
        data={"approval": latest.pk, "reason": reason},
    )
    outbox_consume_txn(op.pk)
    return ReleaseRefused(reason, returned=True)


def _reopened_txn(
    latest: Approval, op: Operation, lost: dict[str, str], *, now: datetime, actor: str
) -> ReleaseRefused:
    """Approvers lost the right (``lost``: their keys, and why): the decision and their votes
    are voided (the others' stand) and the request waits on /approvals/ for another approver
    (announced again); the claim's outbox row is consumed."""
    reason = f"the approver can no longer approve it: {next(iter(lost.values()))}"
    voided = approval_votes_void_txn(latest, lost)
    approval_transition_txn(
        latest,
        A.PENDING,
        now=now,
        fields={
            "decided_by": "",
            "decider_key": "",
            "decided_at": None,
            "reason": reason,
            "seal": "",
        },
    )
    operation_transition_txn(
        op,
        S.WAITING_APPROVAL,
        now=now,
        actor=actor,
        fields={"status_reason": reason},
        event_type="approval.reopened",
        data={
            "approval": latest.pk,
            "reason": reason,
            "approver": voided[0] if voided else latest.decided_by,
            "voided": voided,
            "approved_by": [v.approver for v in approval_votes(latest.pk)],
            "approvals_required": latest.approvals_required,
        },
    )
    approval_noticed_txn(latest, actor=actor, now=now)
    outbox_consume_txn(op.pk)
    return ReleaseRefused(reason, returned=True)


def _integrity_refused(
    latest: Approval, op: Operation, reason: str, now: datetime, actor: str
) -> ReleaseRefused:
    """Nothing runs and a person decides. An approval not yet released goes back to ``pending``
    (its operation to ``waiting_approval``), bound in place to the operation's parameters now
    with a fresh validity and no vote: /approvals/ shows what would run and why it came back;
    what had been approved stays in the journal. A retry of released work cannot reopen its
    approval: the claim settles it ``manual_intervention``. Preconditions: as the release."""
    found = params_hash(op.params)
    data = {
        "approval": latest.pk,
        "reason": reason,
        "approved_params_hash": latest.params_hash,
        "approved_params": latest.params,
        "approver": latest.decided_by,
        "params_hash": found,
    }
    if latest.status != A.APPROVED or op.status != S.PENDING:
        event_append_txn(
            task_id=op.task_id,
            type="approval.integrity_failed",
            state_version=op.state_version,
            now=now,
            op=op,
            actor=actor,
            data=data,
        )
        return ReleaseRefused(reason)
    adapter = adapters().get(op.tool) or ToolAdapter()
    seconds = adapter.approval_timeout_seconds
    # Starts over, asking at least the approvers the policy asks of the parameters held now.
    data["voided"] = approval_votes_void_txn(latest)
    required = max(latest.approvals_required, approvals_required_for(adapter, op.params))
    approval_transition_txn(
        latest,
        A.PENDING,
        now=now,
        fields={
            "approvals_required": required,
            "params": op.params,
            "params_hash": found,
            "decided_by": "",
            "decider_key": "",
            "decided_at": None,
            "reason": reason,
            "seal": "",
            "expires_at": within_task_deadline(now + timedelta(seconds=seconds), op.task.deadline),
        },
    )
    operation_transition_txn(
        op,
        S.WAITING_APPROVAL,
        now=now,
        actor=actor,
        fields={"status_reason": reason, "params_hash": found},
        event_type="approval.integrity_failed",
        data=data,
    )
    outbox_consume_txn(op.pk)
    return ReleaseRefused(reason, returned=True)
