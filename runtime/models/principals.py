from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime.ids import new_id


def _agent_id() -> str:
    return new_id("agt")


def _token_id() -> str:
    return new_id("tok")


class Agent(models.Model):
    """A program that posts work. It sees only its own tasks."""

    id = models.CharField(primary_key=True, max_length=40, default=_agent_id, editable=False)
    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A bearer token, stored only as a SHA-256 digest. It acts either as an agent or as a
    console user (with that user's role); exactly one of the two is set."""

    id = models.CharField(primary_key=True, max_length=40, default=_token_id, editable=False)
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Who issued or revoked it (an admin's actor label, or "system:cli" for the shell).
    created_by = models.CharField(max_length=200, default="system:cli")
    # Who minted it, as an identity (Actor.key: "user:<id>", or "system:cli"): approvals refuse
    # the minter of the requesting token. NULL for tokens minted before this was recorded.
    minted_by = models.CharField(max_length=100, null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(agent__isnull=False, user__isnull=True))
                | (models.Q(agent__isnull=True, user__isnull=False)),
                name="token_acts_as_agent_xor_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"


class AuditRecord(models.Model):
    """A change to who may act (tokens issued or revoked), with the actor who made it. Tasks
    have their journal; access changes belong to no task, so they are kept here."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField()
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=64)
    subject = models.CharField(max_length=200)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~models.Q(actor=""), name="audit_names_its_actor")
        ]


class RateCounter(models.Model):
    """An attempt counter for the embedded mode's rate limits (services mode counts in Redis).
    Incremented only by guarded UPDATEs, so concurrent attempts can never overshoot."""

    key = models.CharField(primary_key=True, max_length=300)
    count = models.PositiveIntegerField(default=0)
    window_ends_at = models.DateTimeField()
