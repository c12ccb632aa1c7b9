from __future__ import annotations

from django.db import models


class OutboxMessage(models.Model):
    """Work announced in the same transaction as the state change that made it due. The claim
    that consumes it deletes the row; the sweeper publishes rows nobody consumed in time."""

    topic = models.CharField(max_length=64)
    operation = models.ForeignKey(
        "runtime.Operation", null=True, on_delete=models.CASCADE, related_name="+"
    )
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    available_at = models.DateTimeField()
    publish_count = models.PositiveIntegerField(default=0)
    last_published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["available_at"], name="outbox_available")]
