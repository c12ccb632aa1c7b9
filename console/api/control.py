"""Task control (cancel, fail), the support queue's resolve action (unresolved operations and
work waiting for manual intervention), and the demo receivers' read-only effects view. Thin:
parse, authorise (in the service), call one service, serialise."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api.auth import actor_of
from console.api.idempotency import idempotent
from console.api.serializers import AttemptIn, Int, Text, attempt_out, budget_out, parse
from console.api.views import ApiView, operation_body, task_body
from runtime import attempts, cancellation, policy, resolutions
from runtime.errors import NotFound
from runtime.sandbox.receivers import RECEIVERS, effects_under
from runtime.selectors import tasks


class ReasonIn(serializers.Serializer):
    reason = Text(max_length=2000, required=False, allow_blank=True, default="")


class ResolveIn(serializers.Serializer):
    # For an unresolved operation: succeeded, no_effect, retry_same_key, lookup or compensate
    # (as its receiver's contract allows); for one waiting for manual intervention: requeue or
    # abandon (docs/api.md).
    resolution = serializers.ChoiceField(choices=resolutions.RESOLUTIONS)
    evidence = Text(
        max_length=10000,
        required=False,
        allow_blank=True,
        default="",
        help_text="What was checked; needed to mark succeeded, and the reason to abandon.",
    )
    state_version = Int(min_value=1)


class _TaskStop(ApiView):
    """Stop a task through one of the cancellation services (202 with the task)."""

    stop = staticmethod(cancellation.task_cancel)

    @extend_schema(
        request=ReasonIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({202: doc.TaskSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(ReasonIn, request.data or {})
        task = self.stop(actor_of(request), task_id, data["reason"])
        return Response(task_body(task), status=202)


class TaskCancel(_TaskStop):
    stop = staticmethod(cancellation.task_cancel)


class TaskFail(_TaskStop):
    stop = staticmethod(cancellation.task_fail)


class OperationResolve(ApiView):
    @extend_schema(
        operation_id="v1_operations_resolve",
        request=ResolveIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.OperationSerializer}, write=True),
    )
    @idempotent(atomic=False)  # a lookup resolution asks the receiver: no transaction around it
    def post(self, request: Request, operation_id: str) -> Response:
        data = parse(ResolveIn, request.data)
        op = resolutions.operation_resolve(
            actor_of(request),
            operation_id,
            resolution=data["resolution"],
            evidence=data["evidence"],
            state_version=data["state_version"],
        )
        return Response(operation_body(op))


class TaskAttempts(ApiView):
    @extend_schema(
        operation_id="v1_tasks_attempts_create",
        request=AttemptIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: doc.NewAttemptSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = parse(AttemptIn, request.data or {})
        attempt = attempts.attempt_create(actor_of(request), task_id, reason=data["reason"])
        return Response(attempt_out(attempt), status=201)


class TaskBudget(ApiView):
    @extend_schema(
        operation_id="v1_tasks_budget_retrieve",
        responses=doc.responses({200: doc.BudgetSerializer}),
    )
    def get(self, request: Request, task_id: str) -> Response:
        task, meters = tasks.task_budget_read(actor_of(request), task_id)
        return Response(budget_out(task, meters))


class ReceiverEffects(ApiView):
    @extend_schema(
        operation_id="v1_demo_receivers_effects",
        parameters=[
            OpenApiParameter(
                "key", {"type": "string", "minLength": 1, "maxLength": 400}, required=True
            )
        ],
        responses=doc.responses({200: doc.EffectsSerializer}),
    )
    def get(self, request: Request, receiver: str) -> Response:

        if not settings.DEMO_TOOLS or receiver not in RECEIVERS:
            raise NotFound("no such receiver")
        key = request.query_params.get("key") or ""
        # Authorised through the operation that owns the key (404 for anyone else's key).
        policy.effects_visible(actor_of(request), key)
        return Response({"receiver": receiver, "key": key, "effects": effects_under(receiver, key)})
