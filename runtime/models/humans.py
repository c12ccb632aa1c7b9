"""Humans in the loop: approvals bound to one exact proposal, signals with their dispositions, and
task commands (pause, resume, steer) with ids and recorded dispositions."""

from __future__ import annotations

from django.db import models

from runtime.ids import new_id
from runtime.rules.statuses import ApprovalStatus


def _approval_id() -> str:
    return new_id("apr")


def _signal_id() -> str:
    return new_id("sig")


def _command_id() -> str:
    return new_id("cmd")


class Approval(models.Model):
    """A person's decision bound to one proposal of one operation: its parameter hash and proposal
    version, the requester (and the user it acts for), the scope and role that may decide, the
    decider (always the authenticated caller), the reason and the validity period."""

    id = models.CharField(primary_key=True, max_length=40, default=_approval_id, editable=False)
    operation = models.ForeignKey(
        "runtime.Operation", on_delete=models.CASCADE, related_name="approvals"
    )
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="approvals")
    status = models.CharField(
        max_length=16,
        choices=[(s, s) for s in ApprovalStatus.ALL],
        default=ApprovalStatus.PENDING,
    )
    proposal_version = models.PositiveIntegerField(default=1)
    params = models.JSONField(default=dict, blank=True)
    params_hash = models.CharField(max_length=80)
    tool = models.CharField(max_length=200, blank=True, default="")
    scope = models.CharField(max_length=200)
    approver_role = models.CharField(max_length=32)
    requested_by = models.CharField(max_length=200)
    requester_key = models.CharField(max_length=100)
    # The console user the requesting agent acts for (the task's creator), if any.
    requested_for_key = models.CharField(max_length=100, blank=True, default="")
    # Who minted the API token the request came with (ApiToken.minted_by), if any: that person
    # could have made the request, so may not decide it.
    requester_minted_by = models.CharField(max_length=100, blank=True, default="")
    edited_by = models.CharField(max_length=200, blank=True, default="")
    editor_key = models.CharField(max_length=100, blank=True, default="")
    previous = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by = models.CharField(max_length=200, blank=True, default="")
    decider_key = models.CharField(max_length=100, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    # The keyed MAC over the decision and the parameters it covers, written by an approve and
    # checked at release (runtime.approval_seal); empty until approved.
    seal = models.CharField(max_length=100, blank=True, default="")
    # The two-person rule: how many distinct people must approve before it is approved, fixed
    # when it is requested from the tool's policy (work in flight keeps its rule). Each
    # approval so far is an ApprovalVote row.
    approvals_required = models.PositiveSmallIntegerField(default=1)
    state_version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation", "proposal_version"], name="approval_version_unique"
            ),
            # At most one live request per operation: an edit supersedes, never adds a second.
            models.UniqueConstraint(
                fields=["operation"],
                condition=models.Q(status__in=["pending", "approved", "expired"]),
                name="approval_one_live_per_operation",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=ApprovalStatus.ALL), name="approval_status_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(approvals_required__gte=1, approvals_required__lte=10),
                name="approval_required_count_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "expires_at"], name="approval_status_expiry"),
            models.Index(fields=["task", "created_at"], name="approval_task_created"),
        ]


class ApprovalVote(models.Model):
    """One person's approve of one approval (runtime.approval_votes): what the two-person rule
    counts. Unique per (approval, approver), so the same person approving twice, even at once,
    counts once; an edit is a new approval and so starts with none."""

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="votes")
    approver = models.CharField(max_length=200)  # the label, as ``decided_by``
    approver_key = models.CharField(max_length=100)  # the actor key, as ``decider_key``
    voted_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "approver_key"], name="approval_vote_once_per_person"
            ),
        ]


class Signal(models.Model):
    """An external event addressed to a task, with the disposition it was given on arrival. The
    unique (task, event_id) is what makes a repeated event a duplicate."""

    DELIVERED = "delivered"
    BUFFERED = "buffered"
    DUPLICATE = "duplicate"
    LATE = "late"
    DISPOSITIONS = (DELIVERED, BUFFERED, DUPLICATE, LATE)

    id = models.CharField(primary_key=True, max_length=40, default=_signal_id, editable=False)
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="signals")
    event_id = models.CharField(max_length=200)
    name = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    disposition = models.CharField(max_length=16)
    # The wait it satisfied (delivered at once, or consumed later from the buffer), or the
    # expired wait it came too late for.
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    consumed_at = models.DateTimeField(null=True, blank=True)
    sent_by = models.CharField(max_length=200)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "event_id"], name="signal_event_unique"),
        ]
        indexes = [
            models.Index(fields=["task", "name", "consumed_at"], name="signal_task_name"),
        ]


class TaskCommand(models.Model):
    """A control command (pause, resume, steer) and what became of it."""

    APPLIED = "applied"
    NO_CHANGE = "no_change"
    REFUSED = "refused"

    id = models.CharField(primary_key=True, max_length=40, default=_command_id, editable=False)
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16)
    payload = models.JSONField(default=dict, blank=True)
    disposition = models.CharField(max_length=16)
    detail = models.TextField(blank=True, default="")
    actor = models.CharField(max_length=200)
    task_state_version = models.PositiveIntegerField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["task", "at"], name="command_task_at")]
