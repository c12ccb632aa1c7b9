from __future__ import annotations

from django.db import models


class BudgetMeter(models.Model):
    """One allowance of one attempt (``cost_cents``, ``model_tokens``, ``tool_calls`` or a meter
    the task declared). The four amounts are kept by guarded increments in the transaction that
    moves a hold, so ``available = limit - reserved - posted - unknown`` is read from one row and
    admission is one conditional UPDATE (concurrent admissions re-evaluate its predicate).

    ``reserve`` is the part of ``limit`` only cleanup (compensations, checks) may use."""

    attempt = models.ForeignKey("runtime.Attempt", on_delete=models.CASCADE, related_name="meters")
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="meters")
    meter = models.CharField(max_length=64)
    limit = models.BigIntegerField()
    reserve = models.BigIntegerField(default=0)
    reserved = models.BigIntegerField(default=0)
    posted = models.BigIntegerField(default=0)
    unknown = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "meter"], name="meter_unique_per_attempt"),
            models.CheckConstraint(
                condition=models.Q(reserved__gte=0, unknown__gte=0, posted__gte=0),
                name="meter_amounts_not_negative",
            ),
        ]
        indexes = [models.Index(fields=["task", "meter"], name="meter_task")]


class BudgetHold(models.Model):
    """A reservation against one meter: for one invocation of an operation (``number`` 0 is the
    proposal's, a re-dispatch after a lost invocation holds anew under its own number), or for a
    child task's allocation. ``held`` counts in ``reserved``; ``unknown`` (usage lost with a
    dispatched call) counts in ``unknown`` until a person or a lookup settles it; ``settled`` no
    longer counts (its usage, if any, is in ``posted``)."""

    HELD = "held"
    UNKNOWN = "unknown"
    SETTLED = "settled"
    STATUSES = (HELD, UNKNOWN, SETTLED)

    meter = models.ForeignKey(BudgetMeter, on_delete=models.CASCADE, related_name="holds")
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.CASCADE, related_name="holds"
    )
    child_task = models.ForeignKey(
        "runtime.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    number = models.PositiveIntegerField(default=0)
    amount = models.BigIntegerField()
    status = models.CharField(max_length=16, default=HELD)
    created_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)
    settled_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["meter", "operation", "number"],
                condition=models.Q(operation__isnull=False),
                name="hold_unique_per_invocation",
            ),
            models.UniqueConstraint(
                fields=["meter", "child_task"],
                condition=models.Q(child_task__isnull=False),
                name="hold_unique_per_child",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=("held", "unknown", "settled")),
                name="hold_status_valid",
            ),
            models.CheckConstraint(condition=models.Q(amount__gte=0), name="hold_not_negative"),
        ]
        indexes = [models.Index(fields=["operation", "status"], name="hold_operation")]


class UsageRecord(models.Model):
    """Observed usage of one invocation on one meter, recorded with the invocation's acceptance.
    The unique key is what makes recording idempotent: a redelivered or replayed report cannot
    post the same invocation's usage twice, and nothing ever resets it."""

    meter = models.ForeignKey(BudgetMeter, on_delete=models.CASCADE, related_name="usage")
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    child_task = models.ForeignKey(
        "runtime.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    number = models.PositiveIntegerField(default=0)
    amount = models.BigIntegerField()
    source = models.CharField(max_length=32)  # adapter | agent | person | child | lookup
    actor = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["meter", "operation", "number"],
                condition=models.Q(operation__isnull=False),
                name="usage_once_per_invocation",
            ),
            models.UniqueConstraint(
                fields=["meter", "child_task"],
                condition=models.Q(child_task__isnull=False),
                name="usage_once_per_child",
            ),
        ]


class ToolSlot(models.Model):
    """The admission point of one tool class: claims and proposals of a class with a concurrency
    or queue limit lock this row, so counting running and waiting work under it is exact."""

    tool_class = models.CharField(primary_key=True, max_length=200)
