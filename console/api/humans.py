"""The human side of the API: approvals (decide, bulk, edit, renew), signals, pause/resume/steer,
and expired waits for admins. Thin: parse, call one runtime service (which checks the right),
serialise. The approver is always the authenticated caller: a ``decided_by`` in a body is not a
field here and is ignored."""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api.auth import actor_of
from console.api.control import ReasonIn
from console.api.idempotency import idempotent
from console.api.serializers import Int, Text, approval_out, command_out, parse, signal_out
from console.api.views import ApiView, _limit, _param, operation_bodies, operation_body, task_body
from runtime import approvals, control, signals, waits
from runtime.approval_expiry import approval_renew
from runtime.approval_gate import MAX_APPROVAL_TIMEOUT_SECONDS
from runtime.errors import InvalidInput
from runtime.models import TaskCommand
from runtime.selectors.approvals import approval_get, approval_list
from runtime.selectors.signals import signals_of_task
from runtime.selectors.tasks import task_get
from runtime.selectors.waits import expired_waits
from runtime.transitions.propose_wait import MAX_WAIT_SECONDS


class DecisionIn(serializers.Serializer):
    decision = serializers.ChoiceField(choices=approvals.DECISIONS)
    reason = Text(
        max_length=2000,
        required=False,
        allow_blank=True,
        default="",
        help_text="Required to deny (not blank).",
    )
    params_hash = Text(
        max_length=80,
        required=False,
        allow_blank=True,
        default="",
        help_text="Required to approve: the params_hash of the proposal approved.",
    )


class BulkItemIn(DecisionIn):
    approval = Text(min_length=1, max_length=64)


class ApproveIn(DecisionIn):
    """Approve: ``params_hash`` is the hash of the parameters approved (409 approval_stale when
    it is not the current proposal's)."""

    decision = serializers.ChoiceField(choices=["approve"])
    params_hash = Text(min_length=1, max_length=80)


class DenyIn(DecisionIn):
    """Deny: the ``reason`` is required and not blank."""

    decision = serializers.ChoiceField(choices=["deny"])
    reason = Text(max_length=2000, validators=[RegexValidator(r"\S")])


# Parsed as DecisionIn (the service answers 400 for a missing params_hash or reason); described
# as one of the two shapes. A bulk item keeps one shape, its fields saying when they are
# required: an incomplete item is that item's status 400, not a refused request.
doc.one_of(
    DecisionIn,
    ApproveIn,
    DenyIn,
    description="approve needs params_hash; deny needs a reason (400 without).",
)


class BulkIn(serializers.Serializer):
    decisions = serializers.ListField(
        child=BulkItemIn(), min_length=1, max_length=approvals.MAX_BULK
    )


class EditIn(serializers.Serializer):
    params = serializers.DictField()
    reason = Text(max_length=2000, required=False, allow_blank=True, default="")


class RenewIn(serializers.Serializer):
    """A signal wait's new period (an approval's wait takes at most an approval's validity)."""

    expires_in_seconds = Int(min_value=1, max_value=MAX_WAIT_SECONDS)
    reason = Text(max_length=2000, required=False, allow_blank=True, default="")


class ApprovalRenewIn(RenewIn):
    """An approval's new validity period."""

    expires_in_seconds = Int(min_value=1, max_value=MAX_APPROVAL_TIMEOUT_SECONDS)


class SignalIn(serializers.Serializer):
    event_id = Text(min_length=1, max_length=200)
    name = Text(min_length=1, max_length=200)
    payload = serializers.DictField(required=False, default=dict)


class SteerIn(serializers.Serializer):
    direction = Text(min_length=1, max_length=4000)


class ApprovalCollection(ApiView):
    @extend_schema(
        operation_id="v1_approvals_list",
        parameters=doc.APPROVAL_FILTERS,
        responses=doc.responses({200: doc.ApprovalListSerializer}),
    )
    def get(self, request: Request) -> Response:
        rows = approval_list(
            actor_of(request),
            status=_param(request, "status"),
            tool=_param(request, "tool", 200),
            task_id=_param(request, "task", 64),
            limit=_limit(request, 100, 500),
        )
        return Response({"results": [approval_out(a) for a in rows]})


class ApprovalDetail(ApiView):
    @extend_schema(
        operation_id="v1_approvals_retrieve",
        responses=doc.responses({200: doc.ApprovalSerializer}),
    )
    def get(self, request: Request, approval_id: str) -> Response:
        return Response(approval_out(approval_get(actor_of(request), approval_id)))


class ApprovalDecision(ApiView):
    @extend_schema(
        operation_id="v1_approvals_decision",
        request=DecisionIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.ApprovalSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, approval_id: str) -> Response:
        data = parse(DecisionIn, request.data)
        approval = approvals.approval_decide(
            actor_of(request),
            approval_id,
            decision=data["decision"],
            reason=data["reason"],
            params_hash=data["params_hash"],
        )
        return Response(approval_out(approval))


class ApprovalBulkDecisions(ApiView):
    @extend_schema(
        operation_id="v1_approvals_decisions",
        request=BulkIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.BulkResultsSerializer}, write=True),
    )
    # Each item passes the release gate in a transaction of its own (as the page's bulk does):
    # one request-wide transaction would hold every item's locks at once, against the lock order.
    @idempotent(atomic=False)
    def post(self, request: Request) -> Response:
        raw = request.data.get("decisions") if isinstance(request.data, dict) else None
        if isinstance(raw, list) and len(raw) > approvals.MAX_BULK:
            raise InvalidInput(f"decisions must hold at most {approvals.MAX_BULK} items")
        data = parse(BulkIn, request.data)
        items = [
            approvals.BulkItem(
                approval=d["approval"],
                decision=d["decision"],
                reason=d["reason"],
                params_hash=d["params_hash"],
            )
            for d in data["decisions"]
        ]
        return Response({"results": approvals.approval_decide_bulk(actor_of(request), items)})


class ApprovalEdit(ApiView):
    @extend_schema(
        operation_id="v1_approvals_edit",
        request=EditIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: doc.ApprovalSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, approval_id: str) -> Response:
        data = parse(EditIn, request.data)
        approval = approvals.approval_edit(
            actor_of(request), approval_id, params=dict(data["params"]), reason=data["reason"]
        )
        return Response(approval_out(approval), status=201)


class ApprovalRenew(ApiView):
    @extend_schema(
        operation_id="v1_approvals_renew",
        request=ApprovalRenewIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.ApprovalSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, approval_id: str) -> Response:
        data = parse(ApprovalRenewIn, request.data)
        approval = approval_renew(
            actor_of(request),
            approval_id,
            expires_in_seconds=data["expires_in_seconds"],
            reason=data["reason"],
        )
        return Response(approval_out(approval))


class TaskSignals(ApiView):
    @extend_schema(
        operation_id="v1_tasks_signals_list",
        responses=doc.responses({200: doc.SignalListSerializer}),
    )
    def get(self, request: Request, task_id: str) -> Response:

        task_get(actor_of(request), task_id)
        return Response({"results": [signal_out(s) for s in signals_of_task(task_id)]})

    @extend_schema(
        operation_id="v1_tasks_signals_create",
        request=SignalIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({202: doc.SignalAnswerSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(SignalIn, request.data)
        answer = signals.signal_send(
            actor_of(request),
            task_id,
            event_id=data["event_id"],
            name=data["name"],
            payload=dict(data["payload"]),
        )
        body: dict[str, Any] = {"disposition": answer.disposition, "signal": answer.signal.pk}
        if answer.original is not None:
            body["original_disposition"] = answer.original
        return Response(body, status=202)


def _command_response(result: tuple[Any, TaskCommand]) -> Response:
    task, command = result
    body = task_body(task)
    body["command"] = command_out(command)
    return Response(body, status=202)


_COMMAND = doc.responses({202: doc.TaskCommandSerializer}, write=True)


class TaskPause(ApiView):
    @extend_schema(
        operation_id="v1_tasks_pause",
        request=ReasonIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=_COMMAND,
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(ReasonIn, request.data or {})
        return _command_response(
            control.task_pause(actor_of(request), task_id, reason=data["reason"])
        )


class TaskResume(ApiView):
    @extend_schema(
        operation_id="v1_tasks_resume",
        request=ReasonIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=_COMMAND,
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(ReasonIn, request.data or {})
        return _command_response(
            control.task_resume(actor_of(request), task_id, reason=data["reason"])
        )


class TaskSteer(ApiView):
    @extend_schema(
        operation_id="v1_tasks_steer",
        request=SteerIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=_COMMAND,
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(SteerIn, request.data)
        return _command_response(
            control.task_steer(actor_of(request), task_id, direction=data["direction"])
        )


class WaitCollection(ApiView):
    @extend_schema(
        operation_id="v1_waits_list",
        parameters=doc.WAIT_FILTERS,
        responses=doc.responses({200: doc.OperationListSerializer}),
    )
    def get(self, request: Request) -> Response:
        status = _param(request, "status") or "expired"
        if status != "expired":
            raise InvalidInput("status must be expired")
        rows = expired_waits(actor_of(request), limit=_limit(request, 100, 500))
        return Response({"results": operation_bodies(rows)})


class WaitRenew(ApiView):
    @extend_schema(
        operation_id="v1_waits_renew",
        request=RenewIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.OperationSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, operation_id: str) -> Response:
        data = parse(RenewIn, request.data)
        op = waits.wait_renew(
            actor_of(request),
            operation_id,
            expires_in_seconds=data["expires_in_seconds"],
            reason=data["reason"],
        )
        return Response(operation_body(op))


class WaitTransform(ApiView):
    @extend_schema(
        operation_id="v1_waits_transform",
        request=ReasonIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.OperationSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, operation_id: str) -> Response:
        data = parse(ReasonIn, request.data or {})
        op = waits.wait_transform(actor_of(request), operation_id, reason=data["reason"])
        return Response(operation_body(op))


class WaitEnd(ApiView):
    @extend_schema(
        operation_id="v1_waits_end",
        request=ReasonIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({202: doc.TaskSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, operation_id: str) -> Response:
        data = parse(ReasonIn, request.data or {})
        task = waits.wait_end_task(actor_of(request), operation_id, reason=data["reason"])
        return Response(task_body(task), status=202)
