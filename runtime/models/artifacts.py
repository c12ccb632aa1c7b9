from __future__ import annotations

from django.db import models

from runtime.ids import new_id


def _artifact_id() -> str:
    return new_id("art")


def _check_id() -> str:
    return new_id("chk")


class ArtifactStatus:
    STAGED = "staged"  # the intent: a row exists, its bytes may or may not be stored yet
    STORED = "stored"  # bytes stored under their digest and verified after the write
    ACCEPTED = "accepted"  # the task's manifest entry for its name
    SUPERSEDED = "superseded"  # was accepted; a newer artifact of the same name replaced it
    FAILED = "failed"  # the upload never produced verified bytes
    DISCARDED = "discarded"  # never accepted; its bytes were reclaimed under the retention policy
    ALL = (STAGED, STORED, ACCEPTED, SUPERSEDED, FAILED, DISCARDED)
    # Rows that still need their bytes.
    HOLDING = (STAGED, STORED, ACCEPTED, SUPERSEDED)


class Artifact(models.Model):
    """A produced item a task retains: content identity (sha256 digest), where its bytes are,
    which stage it reached and what produced it (provenance)."""

    id = models.CharField(primary_key=True, max_length=40, default=_artifact_id, editable=False)
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="artifacts")
    name = models.CharField(max_length=200)
    media_type = models.CharField(max_length=200)
    status = models.CharField(
        max_length=16,
        choices=[(s, s) for s in ArtifactStatus.ALL],
        default=ArtifactStatus.STAGED,
    )
    status_reason = models.TextField(blank=True, default="")
    digest = models.CharField(max_length=80, blank=True, default="")
    size = models.BigIntegerField(null=True, blank=True)
    storage_key = models.CharField(max_length=200, blank=True, default="")
    # Provenance: what produced these bytes.
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    attempt = models.ForeignKey(
        "runtime.Attempt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    execution = models.ForeignKey(
        "runtime.Execution", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    code_version = models.CharField(max_length=200, blank=True, default="")
    input_digests = models.JSONField(default=list, blank=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    accepted_by = models.CharField(max_length=200, blank=True, default="")
    accepted_state_version = models.PositiveIntegerField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # One manifest entry per name: the database, not Python, keeps it single.
            models.UniqueConstraint(
                fields=["task", "name"],
                condition=models.Q(status="accepted"),
                name="artifact_one_accepted_per_name",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=ArtifactStatus.ALL), name="artifact_status_valid"
            ),
        ]
        indexes = [
            models.Index(fields=["task", "created_at"], name="artifact_task_created"),
            models.Index(fields=["status", "updated_at"], name="artifact_status_updated"),
            models.Index(fields=["digest"], name="artifact_digest"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.name} {self.status}"


class ContentKey(models.Model):
    """One row per content address that an upload or the reconciler is working on: the lock that
    serialises "an upload records that it needs these bytes" against "the reconciler decides
    nobody needs them". ``deleting_since`` is set (and committed) before the reconciler deletes
    the bytes, so an upload that comes later waits for the deletion instead of being told its
    bytes are stored while they are being removed."""

    key = models.CharField(primary_key=True, max_length=200)
    deleting_since = models.DateTimeField(null=True, blank=True)


class RequiredCheck(models.Model):
    """A check a task promised at creation: success needs it passed on the current artifacts."""

    task = models.ForeignKey(
        "runtime.Task", on_delete=models.CASCADE, related_name="required_checks"
    )
    name = models.CharField(max_length=200)
    checker = models.CharField(max_length=100)
    config = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "name"], name="required_check_name_unique")
        ]


class CheckResult(models.Model):
    """One run of a required check: checker and version, the subject's digest, the task version
    it saw, and the result. Append-only; the newest per name is the one that counts, and only
    while its subject is still the accepted artifact."""

    PASSED = "passed"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"
    TIMED_OUT = "timed_out"
    RESULTS = (PASSED, FAILED, UNAVAILABLE, TIMED_OUT)

    id = models.CharField(primary_key=True, max_length=40, default=_check_id, editable=False)
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    checker = models.CharField(max_length=100)
    checker_version = models.CharField(max_length=40)
    subject = models.ForeignKey(
        Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="checks"
    )
    subject_digest = models.CharField(max_length=80, blank=True, default="")
    task_state_version = models.PositiveIntegerField()
    result = models.CharField(max_length=16, choices=[(r, r) for r in RESULTS])
    reason = models.TextField(blank=True, default="")
    # Set when the subject was replaced after this check: it no longer counts.
    stale = models.BooleanField(default=False)
    actor = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(result__in=("passed", "failed", "unavailable", "timed_out")),
                name="check_result_valid",
            )
        ]
        indexes = [models.Index(fields=["task", "name", "-at"], name="check_task_name_at")]
