from __future__ import annotations

from django.db import models


class Event(models.Model):
    """The append-only journal. ``seq`` is the task's cursor (strictly increasing, gap-free in
    visibility order); ``id`` is a global position used only for hints."""

    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    at = models.DateTimeField()
    state_version = models.PositiveIntegerField()
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    # Who or what caused the change: agent:NAME, user:NAME, execution:ID, system:sweeper...
    actor = models.CharField(max_length=200)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="event_seq_unique"),
            models.CheckConstraint(condition=~models.Q(actor=""), name="event_names_its_actor"),
        ]
