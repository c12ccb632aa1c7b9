from __future__ import annotations

from django.db import models

from runtime.ids import new_id
from runtime.rules.statuses import OperationStatus

# Not settled: an operation a machine or a person will still move.
IN_FLIGHT = tuple(s for s in OperationStatus.ALL if s not in OperationStatus.FINAL)


def _operation_id() -> str:
    return new_id("op")


def _execution_id() -> str:
    return new_id("exe")


class Operation(models.Model):
    """One logical action. Its status changes only through ``runtime.transitions.status``."""

    KIND_TOOL = "tool"
    KIND_WAIT_SIGNAL = "wait_signal"
    KIND_TIMER = "timer"
    KINDS = (KIND_TOOL, KIND_WAIT_SIGNAL, KIND_TIMER)
    EXECUTOR_WORKER = "worker"
    EXECUTOR_AGENT = "agent"
    EXECUTORS = (EXECUTOR_WORKER, EXECUTOR_AGENT)

    id = models.CharField(primary_key=True, max_length=40, default=_operation_id, editable=False)
    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="operations")
    attempt = models.ForeignKey("runtime.Attempt", on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, default=KIND_TOOL)
    tool = models.CharField(max_length=200, blank=True, default="")
    # The adapter version the operation was recorded under: a worker that does not support it
    # refuses the operation instead of silently running different code.
    tool_version = models.CharField(max_length=64, blank=True, default="")
    step = models.CharField(max_length=200)
    intent_version = models.PositiveIntegerField(default=1)
    params = models.JSONField(default=dict, blank=True)
    params_hash = models.CharField(max_length=80)
    idempotency_key = models.CharField(max_length=400)
    executor = models.CharField(max_length=16, default=EXECUTOR_WORKER)
    status = models.CharField(
        max_length=24,
        choices=[(s, s) for s in OperationStatus.ALL],
        default=OperationStatus.PENDING,
    )
    state_version = models.PositiveIntegerField(default=1)
    lease_generation = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The digest of the claim's secret: heartbeats and reports must present the secret, so a
    # lease belongs to the execution that claimed it, not to whoever knows the generation.
    lease_token_digest = models.CharField(max_length=80, blank=True, default="")
    execution = models.ForeignKey(
        "runtime.Execution", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    attempts_used = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    estimate = models.JSONField(default=dict, blank=True)
    signal = models.CharField(max_length=200, blank=True, default="")
    timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Durable waits: when a timer fires, or when a signal wait expires (the sweeper's index).
    wait_until = models.DateTimeField(null=True, blank=True)
    # Set at proposal by the tool's policy: no claim runs it without an approval of its
    # current parameter hash.
    approval_required = models.BooleanField(default=False)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    status_reason = models.TextField(blank=True, default="")
    # Sagas: a compensation is a new operation of its own, pointing at the effect it undoes.
    compensates = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="compensations"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # The exactly-once claim of a logical action lives here, not in Python checks.
            models.UniqueConstraint(
                fields=["task", "idempotency_key"], name="operation_key_unique_per_task"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=OperationStatus.ALL), name="operation_status_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(attempts_used__lte=models.F("max_attempts")),
                name="operation_attempts_bounded",
            ),
        ]
        # Every claim and acceptance changes the status, so it updates every index whose key or
        # predicate names it (issue 37): the status indexes are partial, over the rows that
        # their readers look for, and a settled operation leaves them. Their keys name no
        # column a heartbeat moves (lease_expires_at, updated_at), so a heartbeat can be a HOT
        # update (migration 0021 leaves room for it in each page on PostgreSQL).
        indexes = [
            models.Index(fields=["task", "created_at"], name="op_task_created"),
            # In flight: admission's counts per tool class, the sweeper's running leases (a
            # few, checked on the row), the unresolved queue, the metrics' in-flight gauge.
            models.Index(
                fields=["status", "tool"],
                name="op_live",
                condition=models.Q(status__in=IN_FLIGHT),
            ),
            # Due timers and expiring signal waits (runtime.waits, the reminders).
            models.Index(
                fields=["wait_until"],
                name="op_waiting_until",
                condition=models.Q(status=OperationStatus.WAITING),
            ),
            # Expired waits (the console's list of them).
            models.Index(
                fields=["task"],
                name="op_expired",
                condition=models.Q(status=OperationStatus.EXPIRED),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.tool or self.kind} {self.status}"


class Execution(models.Model):
    """One physical worker activation: a Celery worker process, or an agent's claim."""

    id = models.CharField(primary_key=True, max_length=40, default=_execution_id, editable=False)
    kind = models.CharField(max_length=16, default="worker")
    host = models.CharField(max_length=200)
    pid = models.IntegerField(null=True, blank=True)
    label = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["kind", "last_heartbeat_at"], name="exec_kind_heartbeat")]

    def __str__(self) -> str:
        return f"{self.id} {self.host}:{self.pid}"


class Invocation(models.Model):
    """One dispatch of an operation to its receiver, with its receipt or its absence.
    Append-only: the row is inserted with the claim (intent recorded before the call) and gets
    its outcome once, at acceptance or when recovery settles it."""

    OUTCOME_SUCCEEDED = "succeeded"
    OUTCOME_FAILED_TRANSIENT = "failed_transient"
    OUTCOME_FAILED_PERMANENT = "failed_permanent"
    OUTCOME_UNKNOWN = "unknown"
    OUTCOME_LOST = "lost"  # the lease expired with no report from the worker
    OUTCOME_REFUSED = "refused"

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="invocations")
    number = models.PositiveIntegerField()
    lease_generation = models.PositiveIntegerField()
    execution = models.ForeignKey(Execution, null=True, on_delete=models.SET_NULL, related_name="+")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=24, null=True, blank=True)
    receipt = models.JSONField(null=True, blank=True)
    provider_handle = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "number"], name="invocation_number_unique")
        ]


class Resolution(models.Model):
    """A person's settlement of an unresolved operation: who, what, on what evidence, when."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="resolutions")
    actor = models.CharField(max_length=200)
    resolution = models.CharField(max_length=32)
    evidence = models.TextField(blank=True, default="")
    from_status = models.CharField(max_length=24)
    to_status = models.CharField(max_length=24)
    state_version = models.PositiveIntegerField()
    at = models.DateTimeField()


class RejectedObservation(models.Model):
    """What a stale or duplicate actor tried to do and was refused: kept for diagnosis, never
    applied."""

    operation = models.ForeignKey(
        Operation, on_delete=models.CASCADE, related_name="rejections", null=True
    )
    kind = models.CharField(max_length=40)  # stale_completion, refused_claim, ...
    lease_generation = models.PositiveIntegerField(null=True, blank=True)
    state_version = models.PositiveIntegerField(null=True, blank=True)
    execution = models.ForeignKey(Execution, null=True, on_delete=models.SET_NULL, related_name="+")
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)
