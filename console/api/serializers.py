"""Shapes of the REST contract (API.md): request parsers and response renderers."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from rest_framework import serializers

from console.api.plainparse import NotPlain, plain_form
from runtime.approval_gate import MAX_APPROVAL_TIMEOUT_SECONDS
from runtime.errors import InvalidInput
from runtime.models import (
    Approval,
    Attempt,
    Event,
    Invocation,
    Operation,
    Signal,
    Task,
    TaskCommand,
)
from runtime.models.tasks import MAX_EXTERNAL_ID
from runtime.selectors.approvals import approved_by
from runtime.selectors.budgets import MeterView
from runtime.tasks import MAX_DEADLINE_SECONDS
from runtime.transitions.propose import MAX_ATTEMPTS_CEILING
from runtime.transitions.propose_wait import MAX_WAIT_SECONDS


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


# --- requests -----------------------------------------------------------------------------

# The columns these land in are PostgreSQL ``integer``: a larger value is a 400 here rather than
# "integer out of range" from the database.
MAX_INT32 = 2**31 - 1
# Amounts (budgets) stay exact in a double, so every JSON client reads back what it sent.
MAX_AMOUNT = 2**53 - 1


class Text(serializers.CharField):
    """A JSON string. DRF's CharField also takes 5 or 5.0 and stores "5": a wrong type must be
    refused, not coerced. Not trimmed: the length checked is the length of what was sent, which
    is what the schema's maxLength promises (services normalise, then check again)."""

    plain_kind = "text"  # console.api.plainparse checks it without the serializer

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class Int(serializers.IntegerField):
    """A JSON integer within ``integer`` range. DRF's IntegerField also takes "5"."""

    plain_kind = "int"  # console.api.plainparse checks it without the serializer

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", MAX_INT32)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class BudgetIn(serializers.Serializer):
    cost_cents = Int(required=False, min_value=0, max_value=MAX_AMOUNT)
    tool_calls = Int(required=False, min_value=0, max_value=MAX_AMOUNT)
    model_tokens = Int(required=False, min_value=0, max_value=MAX_AMOUNT)


class AttemptIn(serializers.Serializer):
    reason = Text(max_length=2000, required=False, allow_blank=True, default="")


class CheckIn(serializers.Serializer):
    name = Text(max_length=200)
    checker = Text(max_length=100)
    config = serializers.DictField(required=False, default=dict)


class TaskIn(serializers.Serializer):
    name = Text(max_length=300)
    input = serializers.DictField(required=False, default=dict)
    deadline_seconds = Int(
        required=False, allow_null=True, min_value=1, max_value=MAX_DEADLINE_SECONDS
    )
    # The builtin meters (BudgetIn) and any meter the task declares: {name: whole amount}.
    budget = serializers.DictField(
        child=Int(min_value=0, max_value=MAX_AMOUNT), required=False, allow_null=True
    )
    required_checks = CheckIn(many=True, required=False, default=list)
    # Sagas: undo completed compensable effects, newest first, when the task ends this way.
    compensate_on = serializers.ListField(
        child=serializers.ChoiceField(choices=["failed", "cancelled"]),
        required=False,
        default=list,
    )
    # Get-or-create (runtime.task_keys): the caller's key, unique among its own tasks.
    external_id = Text(
        max_length=MAX_EXTERNAL_ID,
        required=False,
        allow_null=True,
        help_text="Your own key for the task, unique among your tasks: creating again under it "
        "returns the task (200) when the input is the same, 422 idempotency_key_reused when not.",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        # ``parent`` names a serializer's own attribute in DRF, so the field is added here.
        fields = dict(super().get_fields())
        fields["parent"] = Text(max_length=64, required=False, allow_null=True)
        return fields


class OperationIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Operation.KINDS, required=False, default="tool")
    tool = Text(max_length=200, required=False, default="", allow_blank=True)
    params = serializers.DictField(required=False, default=dict)
    step = Text(max_length=200)
    intent_version = Int(required=False, default=1, min_value=1)
    idempotency_key = Text(max_length=300, required=False, allow_null=True)
    estimate = serializers.DictField(
        child=serializers.FloatField(min_value=0, max_value=MAX_AMOUNT),
        required=False,
        default=dict,
    )
    executor = serializers.ChoiceField(
        choices=Operation.EXECUTORS, required=False, default="worker"
    )
    max_attempts = Int(required=False, allow_null=True, min_value=1, max_value=MAX_ATTEMPTS_CEILING)
    signal = Text(max_length=200, required=False, default="", allow_blank=True)
    # The services' own bound (a wait's longest; a tool operation only records it).
    timeout_seconds = Int(required=False, allow_null=True, min_value=1, max_value=MAX_WAIT_SECONDS)
    approval_timeout_seconds = Int(
        required=False, allow_null=True, min_value=1, max_value=MAX_APPROVAL_TIMEOUT_SECONDS
    )


class HeartbeatIn(serializers.Serializer):
    lease_generation = Int(min_value=0)
    lease_token = Text(min_length=1, max_length=200)


class ErrorIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["transient", "permanent"])
    message = Text(max_length=2000, allow_blank=True, required=False, default="")


class CompleteIn(serializers.Serializer):
    lease_generation = Int(min_value=0)
    lease_token = Text(min_length=1, max_length=200)
    outcome = serializers.ChoiceField(choices=["succeeded", "failed", "unknown"])
    result = serializers.JSONField(required=False, allow_null=True)
    error = ErrorIn(required=False, allow_null=True)
    usage = serializers.DictField(
        child=serializers.FloatField(min_value=0, max_value=MAX_AMOUNT),
        required=False,
        default=dict,
    )


# Fields of the contract (API.md) that nothing honours yet: refused by name, never accepted
# and dropped. A feature that starts honouring a field removes it here.
NOT_SUPPORTED_YET: dict[str, tuple[str, ...]] = {}


def parse(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidInput("the body must be a JSON object")
    for name in NOT_SUPPORTED_YET.get(serializer_class.__name__, ()):
        if data.get(name) is not None:
            raise InvalidInput(
                f"{name} is part of the contract but not supported yet",
                code="not_supported_yet",
                field=name,
            )
    plain = plain_form(serializer_class)
    if plain is not None:
        try:
            return plain(data)
        except NotPlain:
            pass  # the serializer decides, and words its errors
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# --- responses ----------------------------------------------------------------------------


def attempt_out(attempt: Attempt) -> dict[str, Any]:
    return {"id": attempt.pk, "number": attempt.number, "reason": attempt.reason}


def budget_out(task: Task, meters: list[MeterView]) -> dict[str, Any]:
    """API.md's budget: the current attempt's meters (``reserve`` is the part kept for
    completion checks and compensation, never available to ordinary work)."""
    return {
        "attempt": task.current_attempt.number if task.current_attempt else None,
        "meters": {m.name: m.as_dict() for m in meters},
    }


def task_out(task: Task, pending: list[str]) -> dict[str, Any]:
    attempt = task.current_attempt
    return {
        "id": task.pk,
        "name": task.name,
        "input": task.input,
        "condition": task.condition,
        "outcome": task.outcome,
        "terminal_reason": task.terminal_reason or None,
        "state_version": task.state_version,
        "attempt": {"id": attempt.pk, "number": attempt.number} if attempt else None,
        "cancellation": task.cancellation,
        "paused": task.paused,
        "direction": {"text": task.direction, "version": task.direction_version}
        if task.direction_version
        else None,
        "deadline": iso(task.deadline),
        "parent": task.parent_id,
        "schedule": task.schedule_id,
        "budget": task.budget or None,
        "pending": pending,
        "compensate_on": task.compensate_on,
        "external_id": task.external_id,
        "created_at": iso(task.created_at),
        "updated_at": iso(task.updated_at),
    }


def invocation_out(inv: Invocation) -> dict[str, Any]:
    return {
        "number": inv.number,
        "execution": inv.execution_id,
        "lease_generation": inv.lease_generation,
        "started_at": iso(inv.started_at),
        "finished_at": iso(inv.finished_at),
        "outcome": inv.outcome,
        "receipt": inv.receipt,
        "provider_handle": inv.provider_handle or None,
    }


def operation_out(
    op: Operation, invocations: list[Invocation], approval: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": op.pk,
        "task": op.task_id,
        "attempt": op.attempt_id,
        "kind": op.kind,
        "tool": op.tool or None,
        "tool_version": op.tool_version or None,
        "step": op.step,
        "intent_version": op.intent_version,
        "params": op.params,
        "params_hash": op.params_hash,
        "idempotency_key": op.idempotency_key,
        "executor": op.executor,
        "status": op.status,
        "status_reason": op.status_reason or None,
        "attempts_used": op.attempts_used,
        "max_attempts": op.max_attempts,
        "lease_generation": op.lease_generation,
        "lease_expires_at": iso(op.lease_expires_at),
        "next_attempt_at": iso(op.next_attempt_at),
        "state_version": op.state_version,
        "result": op.result,
        "error": op.error,
        "approval": approval,
        "compensates": op.compensates_id,
        "invocations": [invocation_out(i) for i in invocations],
        "created_at": iso(op.created_at),
        "updated_at": iso(op.updated_at),
    }


def approval_out(a: Approval) -> dict[str, Any]:
    return {
        "id": a.pk,
        "operation": a.operation_id,
        "task": a.task_id,
        "status": a.status,
        "tool": a.tool,
        "params_hash": a.params_hash,
        "proposal_version": a.proposal_version,
        "params": a.params,
        "previous": a.previous_id,
        "scope": a.scope,
        "approver_role": a.approver_role,
        "requested_by": a.requested_by,
        "edited_by": a.edited_by or None,
        "decided_by": a.decided_by or None,
        "decided_at": iso(a.decided_at),
        "approvals_required": a.approvals_required,
        "approved_by": approved_by(a),
        "reason": a.reason or None,
        "expires_at": iso(a.expires_at),
        "released_at": iso(a.released_at),
        "created_at": iso(a.created_at),
    }


def signal_out(sig: Signal) -> dict[str, Any]:
    return {
        "id": sig.pk,
        "event_id": sig.event_id,
        "name": sig.name,
        "payload": sig.payload,
        "disposition": sig.disposition,
        "operation": sig.operation_id,
        "received_at": iso(sig.received_at),
        "consumed_at": iso(sig.consumed_at),
        "sent_by": sig.sent_by,
    }


def command_out(cmd: TaskCommand) -> dict[str, Any]:
    return {
        "id": cmd.pk,
        "kind": cmd.kind,
        "disposition": cmd.disposition,
        "detail": cmd.detail,
        "payload": cmd.payload,
        "actor": cmd.actor,
        "at": iso(cmd.at),
    }


def event_out(event: Event) -> dict[str, Any]:
    return {
        "id": str(event.seq),
        "type": event.type,
        "at": iso(event.at),
        "state_version": event.state_version,
        "operation": event.operation_id,
        "actor": event.actor or None,
        "data": event.data,
    }


def cursor_encode(at: datetime, pk: str) -> str:
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{pk}".encode()).decode().rstrip("=")


def cursor_decode(raw: str) -> tuple[datetime, str]:
    try:
        padded = raw + "=" * (-len(raw) % 4)
        text, pk = base64.urlsafe_b64decode(padded.encode()).decode().split("|", 1)
        at = datetime.fromisoformat(text)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("cursor is not valid") from None
    # Only what cursor_encode makes: an aware time and an id (a NUL would reach the query).
    if at.tzinfo is None or not pk or len(pk) > 64 or not pk.isascii() or not pk.isprintable():
        raise InvalidInput("cursor is not valid")
    return at, pk
