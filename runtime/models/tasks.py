from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime.ids import new_id
from runtime.rules.statuses import Cancellation, TaskCondition, TaskOutcome

# The longest caller's key for a task (the column's width; runtime.tasks.external_id_check).
MAX_EXTERNAL_ID = 200


def _task_id() -> str:
    return new_id("tsk")


def _attempt_id() -> str:
    return new_id("att")


class Task(models.Model):
    """The requested work; its identity is stable across attempts, workers and recovery."""

    id = models.CharField(primary_key=True, max_length=40, default=_task_id, editable=False)
    name = models.CharField(max_length=300)
    input = models.JSONField(default=dict, blank=True)
    agent = models.ForeignKey("runtime.Agent", null=True, blank=True, on_delete=models.PROTECT)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    condition = models.CharField(
        max_length=16,
        choices=[(c, c) for c in TaskCondition.ALL],
        default=TaskCondition.RUNNABLE,
    )
    outcome = models.CharField(
        max_length=16, choices=[(o, o) for o in TaskOutcome.ALL], null=True, blank=True
    )
    terminal_reason = models.TextField(blank=True, default="")
    state_version = models.PositiveIntegerField(default=1)
    # The journal cursor: bumped under the task's row lock by every event, so the order in
    # which events become visible is the order of their numbers (no gaps for a reader to skip).
    event_seq = models.PositiveBigIntegerField(default=0)
    # How many of the task's operations are active / claimable / blocked on something outside
    # the workers. Kept by the same guarded transition that moves an operation, so the task's
    # condition is derived in one statement under the task's row lock instead of by a scan.
    ops_active = models.IntegerField(default=0)
    ops_claimable = models.IntegerField(default=0)
    ops_blocked = models.IntegerField(default=0)
    current_attempt = models.ForeignKey(
        "runtime.Attempt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    cancellation = models.CharField(
        max_length=16, choices=[(c, c) for c in Cancellation.ALL], default=Cancellation.NONE
    )
    paused = models.BooleanField(default=False)
    # Steering: the latest direction a person (or the agent) gave, versioned for agents to read.
    direction = models.TextField(blank=True, default="")
    direction_version = models.PositiveIntegerField(default=0)
    # Sagas: on which endings ("failed", "cancelled") completed compensable effects are undone,
    # in reverse order of completion.
    compensate_on = models.JSONField(default=list, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    # Limits: the declared allowances ({meter: amount}); empty means the ledger does no work for
    # this task (no statement on the hot path).
    budget = models.JSONField(default=dict, blank=True)
    # A child task draws its allocation from its parent's ledger and is cancelled with it.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    # The schedule that started it, if any (runtime.schedules); indexed with the list's order.
    schedule = models.ForeignKey(
        "runtime.Schedule",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        db_index=False,
    )
    # The caller's own key for the task (get-or-create: runtime.task_keys), unique per owner;
    # ``spec_hash`` is the canonical hash of the input it was created with, so a second creation
    # under the key is told apart: the same input finds the task, other input is refused.
    external_id = models.CharField(max_length=MAX_EXTERNAL_ID, null=True, blank=True)
    spec_hash = models.CharField(max_length=80, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["agent", "-created_at", "-id"], name="task_agent_recent"),
            models.Index(fields=["-created_at", "-id"], name="task_recent"),
            # No index names ``condition`` (issue 37): it changes with an operation's claim and
            # acceptance, and an index on it made both of those task updates non-HOT (a new
            # entry in every index of the table, about 1 KB of WAL per operation). A list
            # filtered by condition walks the recency indexes above.
            models.Index(
                fields=["schedule", "-created_at", "-id"],
                name="task_schedule_recent",
                condition=models.Q(schedule__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(condition__in=TaskCondition.ALL), name="task_condition_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(outcome__isnull=True) | models.Q(condition="terminal"),
                name="task_outcome_only_when_terminal",
            ),
            # One task per external id and owner. A task has an agent or a creating user, never
            # both, and NULLs never collide: each constraint binds one kind of owner. The key
            # leads, so a search by it alone (any owner: the console's) reads these indexes.
            models.UniqueConstraint(
                fields=["external_id", "agent"],
                condition=models.Q(external_id__isnull=False),
                name="task_external_id_agent",
            ),
            models.UniqueConstraint(
                fields=["external_id", "created_by"],
                condition=models.Q(external_id__isnull=False),
                name="task_external_id_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.name}"


class Attempt(models.Model):
    """One pursuit of a task. Recovery continues an attempt; only a new pursuit makes a new one."""

    id = models.CharField(primary_key=True, max_length=40, default=_attempt_id, editable=False)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    reason = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # The end of the pursuit: when its task ended (with the task's outcome), or when a newer
    # attempt replaced it (``failed``, or ``unresolved`` while it keeps unresolved operations).
    # Its running work may still settle afterwards; no new work is admitted under it.
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, default="")
    end_reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "number"], name="attempt_number_unique")
        ]


class TaskCount(models.Model):
    """How many tasks are in each (condition, outcome), kept by database triggers on the task
    table (so no code path can forget it), one shard per writing backend on PostgreSQL so
    concurrent transactions never wait on (or deadlock over) one counter row (migration 0010).
    The dashboard sums these few rows instead of counting every task on each refresh."""

    condition = models.CharField(max_length=16)
    outcome = models.CharField(max_length=16, blank=True, default="")  # "" for none yet
    shard = models.PositiveSmallIntegerField(default=0)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["condition", "outcome", "shard"], name="task_count_unique"
            )
        ]
