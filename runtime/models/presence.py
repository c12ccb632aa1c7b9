"""Who has a people's queue open now (presence): one row per open page, that is per live
websocket of a queue page, refreshed while it stays open. Ephemeral: a row counts only while
it is younger than ``PRESENCE_SECONDS`` (runtime.selectors.presence decides it at read time),
so a page that vanished without saying so (a killed tab, a lost network, a web process that
died) drops out by itself. It references no task nor operation: retention has nothing to do."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime.models.worklist import QUEUES


class Presence(models.Model):
    """One open page of ``place`` (a queue: "approvals" or "unresolved") by ``user``.
    ``connection`` names the socket (its channel name), so a person with two tabs open is two
    rows, and closing one leaves them present through the other. ``item``: the card the page
    is on (an approval request's or an operation's id), empty when none."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    place = models.CharField(max_length=16, choices=[(q, q) for q in QUEUES])
    connection = models.CharField(max_length=200, unique=True)
    item = models.CharField(max_length=64, blank=True, default="")
    seen_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["place", "seen_at"], name="presence_place_seen")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(place__in=QUEUES), name="presence_place_valid"
            ),
        ]
