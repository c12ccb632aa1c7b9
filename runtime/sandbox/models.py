from __future__ import annotations

from django.db import models


class PaymentRequest(models.Model):
    """Stripe's idempotency record: the first executing request's response, failures included."""

    key = models.CharField(max_length=400, unique=True)
    request_hash = models.CharField(max_length=80)
    status = models.CharField(max_length=16, default="in_progress")  # in_progress | done
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.JSONField(null=True)
    fencing_token = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()


class Charge(models.Model):
    """The effect: money moved."""

    charge_id = models.CharField(max_length=40, unique=True)
    key = models.CharField(max_length=400, db_index=True)
    account = models.CharField(max_length=200)
    amount_cents = models.BigIntegerField()
    kind = models.CharField(max_length=16, default="charge")  # charge | refund
    refunds = models.CharField(max_length=40, blank=True, default="")
    fencing_token = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()


class Reservation(models.Model):
    """Inventory holds. The receiver does not dedupe; it answers lookups by key."""

    reservation_id = models.CharField(max_length=40, unique=True)
    key = models.CharField(max_length=400, db_index=True)
    sku = models.CharField(max_length=200)
    qty = models.IntegerField()
    released = models.BooleanField(default=False)
    fencing_token = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()


class Notification(models.Model):
    """Messages sent. No contract: no dedupe, no lookup."""

    key = models.CharField(max_length=400, db_index=True)
    to = models.CharField(max_length=300)
    message = models.TextField()
    created_at = models.DateTimeField()


class FenceRecord(models.Model):
    """The newest fencing token a receiver has seen per key: a request carrying an older one
    comes from a worker whose lease was taken over, and is refused before any effect."""

    receiver = models.CharField(max_length=40)
    key = models.CharField(max_length=400)
    token = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["receiver", "key"], name="fence_unique_per_key")
        ]


class SlowCall(models.Model):
    """Calls to the slow receiver (demo.slow): when each started and finished, and how much of
    the task's deadline the caller said was left, so a test sees concurrency and deadlines from
    the receiver's side."""

    key = models.CharField(max_length=400, db_index=True)
    fencing_token = models.PositiveIntegerField(default=0)
    deadline_remaining = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
