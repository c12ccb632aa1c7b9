"""Who is working on what: a person holds an item of a people's queue (an approval request or an
unresolved operation) so the others leave it to them. An item is one operation in one queue:
an approval edited into a new proposal stays the same item, with the same holder."""

from __future__ import annotations

from django.conf import settings
from django.db import models

QUEUE_APPROVALS = "approvals"
QUEUE_UNRESOLVED = "unresolved"
QUEUES = (QUEUE_APPROVALS, QUEUE_UNRESOLVED)


class Claim(models.Model):
    """One holder per item, kept by the database (``claim_one_holder_per_item``): two people
    taking the same item at once both insert, and the second insert fails. A claim older than
    ``CLAIM_RETURN_MINUTES`` counts as returned (runtime.worklist decides it at read time)."""

    operation = models.ForeignKey(
        "runtime.Operation", on_delete=models.CASCADE, related_name="claims"
    )
    queue = models.CharField(max_length=16, choices=[(q, q) for q in QUEUES])
    holder = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="claims"
    )
    taken_at = models.DateTimeField()
    # Who handed it to its holder (an Actor label); empty when the holder took it.
    given_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation", "queue"], name="claim_one_holder_per_item"
            ),
            models.CheckConstraint(condition=models.Q(queue__in=QUEUES), name="claim_queue_valid"),
        ]
