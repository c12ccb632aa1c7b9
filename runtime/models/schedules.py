"""Schedules: a task template started at the times a cron expression or an interval names, in a
time zone, with an overlap policy and a catch-up window. Each slot the scheduler decides is a
ScheduleRun row, unique on (schedule, slot time): that constraint is what makes a slot start
at most once, whatever number of sweepers race for it or restart."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime.ids import new_id


def _schedule_id() -> str:
    return new_id("sch")


class Overlap:
    """What a due slot does while an earlier run's task is still live."""

    SKIP = "skip"  # record the slot skipped (overlap)
    BUFFER_ONE = "buffer_one"  # keep one slot waiting; start it once the live task ends
    ALLOW = "allow"  # start it anyway
    ALL = (SKIP, BUFFER_ONE, ALLOW)


class RunStatus:
    STARTED = "started"
    SKIPPED = "skipped"
    BUFFERED = "buffered"  # waiting for the live task to end (overlap buffer_one)
    ALL = (STARTED, SKIPPED, BUFFERED)


class SkipReason:
    OVERLAP = "overlap"
    MISSED = "missed"  # older than the catch-up window when the scheduler got to it
    PAUSED = "paused"
    REFUSED = "refused"  # the task could not be created (the runtime refused it)
    ALL = (OVERLAP, MISSED, PAUSED, REFUSED)


class Schedule(models.Model):
    """A schedule and its current version. Its owner (an agent, or else a user) owns the tasks
    it starts. ``next_slot_at`` is the scheduler's cursor: the earliest slot not yet decided."""

    id = models.CharField(primary_key=True, max_length=40, default=_schedule_id, editable=False)
    agent = models.ForeignKey(
        "runtime.Agent",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,  # schedule_agent_recent leads with it
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    created_by = models.CharField(max_length=200)
    cron = models.CharField(max_length=200, blank=True, default="")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    # The task each slot creates, as POST /api/v1/tasks takes it (name, input, budget,
    # deadline_seconds, required_checks), validated by the same rules.
    template = models.JSONField(default=dict)
    overlap = models.CharField(
        max_length=16, choices=[(o, o) for o in Overlap.ALL], default=Overlap.SKIP
    )
    catch_up_seconds = models.PositiveIntegerField(default=60)
    paused = models.BooleanField(default=False)
    version = models.PositiveIntegerField(default=1)
    next_slot_at = models.DateTimeField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(agent__isnull=False, user__isnull=True))
                | (models.Q(agent__isnull=True, user__isnull=False)),
                name="schedule_owned_by_agent_xor_user",
            ),
            models.CheckConstraint(
                condition=(models.Q(cron="", interval_seconds__isnull=False))
                | (~models.Q(cron="") & models.Q(interval_seconds__isnull=True)),
                name="schedule_cron_xor_interval",
            ),
            models.CheckConstraint(
                condition=models.Q(overlap__in=Overlap.ALL), name="schedule_overlap_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(created_by=""), name="schedule_names_its_creator"
            ),
        ]
        indexes = [
            models.Index(fields=["next_slot_at"], name="schedule_due"),
            models.Index(fields=["agent", "-created_at"], name="schedule_agent_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.template.get('name', '')}"


class ScheduleRun(models.Model):
    """One slot of a schedule and what the scheduler decided for it: started (with its task),
    buffered, or skipped with a reason. A manual trigger is a slot at the moment it was asked."""

    SCHEDULED = "scheduled"
    MANUAL = "manual"

    id = models.BigAutoField(primary_key=True)
    # Indexed by schedule_slot_once, which leads with it.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    slot_time = models.DateTimeField()
    kind = models.CharField(max_length=16, default=SCHEDULED)
    status = models.CharField(max_length=16, choices=[(s, s) for s in RunStatus.ALL])
    reason = models.CharField(max_length=16, blank=True, default="")
    detail = models.TextField(blank=True, default="")
    task = models.OneToOneField(
        "runtime.Task",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="schedule_run",
    )
    schedule_version = models.PositiveIntegerField()
    actor = models.CharField(max_length=200)
    decided_at = models.DateTimeField()

    class Meta:
        constraints = [
            # The exactly-once claim: a slot is decided by whoever inserts this row first.
            models.UniqueConstraint(fields=["schedule", "slot_time"], name="schedule_slot_once"),
            # At most one slot waits for a live task (overlap buffer_one).
            models.UniqueConstraint(
                fields=["schedule"],
                condition=models.Q(status=RunStatus.BUFFERED),
                name="schedule_one_buffered",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=RunStatus.ALL), name="schedule_run_status_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(status=RunStatus.STARTED, task__isnull=False)
                | (~models.Q(status=RunStatus.STARTED) & models.Q(task__isnull=True)),
                name="schedule_run_task_iff_started",
            ),
            models.CheckConstraint(condition=~models.Q(actor=""), name="schedule_run_actor"),
        ]


class ScheduleEvent(models.Model):
    """The journal of a schedule's changes (created, edited, paused, resumed, triggered), each
    with its actor. Schedules belong to no task, so they keep a journal of their own."""

    id = models.BigAutoField(primary_key=True)
    # Indexed by schedule_event_order, which leads with it.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    type = models.CharField(max_length=64)
    at = models.DateTimeField()
    actor = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~models.Q(actor=""), name="schedule_event_actor"),
        ]
        indexes = [models.Index(fields=["schedule", "id"], name="schedule_event_order")]
