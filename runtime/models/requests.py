from __future__ import annotations

from django.db import models


class IdempotentRequest(models.Model):
    """A POST made under an ``Idempotency-Key`` header: the first response is kept and replayed.
    The unique constraint is what makes two concurrent first requests impossible."""

    STATUS_IN_PROGRESS = "in_progress"
    STATUS_DONE = "done"

    principal = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    body_hash = models.CharField(max_length=80)
    status = models.CharField(max_length=16, default=STATUS_IN_PROGRESS)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="idempotent_request_unique")
        ]
