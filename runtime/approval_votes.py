"""The two-person rule's votes: a tool's policy says how many distinct people must approve a
gated call (``ToolAdapter.approvals_required``), fixed on the approval when it is requested.
Each approve by a person who may decide is a vote row (runtime.models.ApprovalVote), unique per
(approval, approver) in the database, so the same person approving twice, even at once, counts
once and the second is refused (409 ``approval_already_approved``). The approval stays pending
until the votes reach the count; the vote that does makes it approved (runtime.approvals, the one
status writer, under the operation's and the approval's row locks, so of two approvers at once
exactly one makes it approved). An edit is a new approval and so starts with no vote; a renewal
or an integrity failure voids them all; a voter who lost the right loses the vote, found at the
vote that would complete the count or, failing that, at release (runtime.approval_gate).

Every function here runs inside the caller's transaction, holding the operation's row and then
the approval's (the lock order of runtime.approvals)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from runtime.actors import Actor
from runtime.errors import ApprovalAlreadyApproved
from runtime.events import event_append_txn
from runtime.models import Approval, ApprovalVote, Operation
from runtime.policy import approval_decision_refusal, fresh
from runtime.tools import ToolAdapter

# What the database's check allows (runtime/models/humans.py).
MAX_APPROVALS = 10


def approvals_required_for(adapter: ToolAdapter, params: dict[str, Any]) -> int:
    """How many distinct approvers the tool's policy asks of a call with ``params``, within
    1..MAX_APPROVALS. Pure."""
    return min(max(1, int(adapter.approvals_required(params))), MAX_APPROVALS)


def approval_votes(approval_id: str) -> list[ApprovalVote]:
    """The approval's votes, the first first."""
    return list(ApprovalVote.objects.filter(approval_id=approval_id).order_by("voted_at", "id"))


def approval_vote_txn(actor: Actor, approval: Approval, *, now: datetime) -> list[ApprovalVote]:
    """Record ``actor``'s approve of ``approval`` and return every vote now recorded.
    ApprovalAlreadyApproved when the person's vote is there already (the unique constraint
    decides, in a savepoint: nothing else of the caller's transaction is lost).
    Preconditions: the caller checked the person may decide (policy.can_decide_approval)."""
    try:
        with transaction.atomic():
            ApprovalVote.objects.create(
                approval=approval, approver=actor.label, approver_key=actor.key, voted_at=now
            )
    except IntegrityError:
        votes = approval_votes(approval.pk)
        raise ApprovalAlreadyApproved(
            f"you approved it already ({approval_progress(len(votes), approval)}): it waits "
            "for another approver",
            approved_by=[v.approver for v in votes],
        ) from None
    return approval_votes(approval.pk)


def approval_progress(count: int, approval: Approval) -> str:
    """``"1 of 2 approvals"``. Pure."""
    return f"{count} of {approval.approvals_required} approvals"


def approval_voted_txn(
    actor: Actor, op: Operation, approval: Approval, *, data: dict[str, Any], now: datetime
) -> None:
    """Journal a vote that does not yet make the approval approved (``approval.voted``): the
    request stays pending for the next approver. ``data`` carries the counts and the voters."""
    event_append_txn(
        task_id=op.task_id,
        type="approval.voted",
        state_version=op.state_version,
        now=now,
        op=op,
        actor=actor.label,
        data=data,
    )


def approval_votes_lost(approval: Approval, votes: list[ApprovalVote]) -> dict[str, str]:
    """The voters who may no longer decide it ({approver key: why}): the approval rule
    (runtime.policy) asked again for each, on the roles and activity they hold now."""
    lost = {}
    for vote in votes:
        kind, _, ident = vote.approver_key.partition(":")
        if kind != "user" or not ident.isdigit():
            lost[vote.approver_key] = "the decision names no person"
            continue
        person = fresh(Actor(kind="user", name=vote.approver.partition(":")[2], user_id=int(ident)))
        refusal = approval_decision_refusal(person, approval)
        if refusal is not None:
            lost[vote.approver_key] = refusal
    return lost


def approval_votes_standing_txn(
    approval: Approval, votes: list[ApprovalVote], *, checked: str
) -> tuple[list[ApprovalVote], list[str]]:
    """The votes that still count, when the vote of ``checked`` (an actor key, whose right
    the gate just checked) was recorded: an earlier approver who lost the right since (a role
    taken away, deactivated) no longer counts, and their vote is voided here (its label
    returned) rather than found by the release gate later."""
    others = [v for v in votes if v.approver_key != checked]
    lost = approval_votes_lost(approval, others) if others else {}
    if not lost:
        return votes, []
    voided = approval_votes_void_txn(approval, lost)
    return [v for v in votes if v.approver_key not in lost], voided


def approval_votes_void_txn(approval: Approval, keys: Iterable[str] | None = None) -> list[str]:
    """Remove the votes of ``keys`` (None: all) from ``approval`` and return the voters' labels
    removed: a vote counts only for the request as it was approved. The journal keeps them."""
    votes = ApprovalVote.objects.filter(approval_id=approval.pk)
    if keys is not None:
        votes = votes.filter(approver_key__in=list(keys))
    removed = list(votes.order_by("voted_at", "id").values_list("approver", flat=True))
    if removed:
        votes.delete()
    return removed
