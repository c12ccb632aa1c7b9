"""Who is working on what, over the API (``/api/v1/queues/{queue}/items/{operation_id}``): read
an item's holder and comments, take it, hand it over, release it, comment on it. Thin: parse,
call one runtime.worklist service (which checks the right, runtime.policy.can_work_on),
serialise. The same services as the console's Take, Hand over, Release and Comment."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api.auth import actor_of
from console.api.idempotency import idempotent
from console.api.serializers import Text, iso, parse
from console.api.views import ApiView
from runtime import worklist
from runtime.models import Claim, Event
from runtime.models.worklist import QUEUES
from runtime.selectors.worklist import claim_return_after, work_item

QUEUE = OpenApiParameter(
    "queue",
    {"type": "string", "enum": list(QUEUES)},
    OpenApiParameter.PATH,
    description="approvals (operators) or unresolved (support staff); admins work both.",
)


class GiveIn(serializers.Serializer):
    to = Text(min_length=1, max_length=150, help_text="The username of the person handed it.")


class CommentIn(serializers.Serializer):
    text = Text(min_length=1, max_length=worklist.MAX_COMMENT)


class CommentSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The journal event's id.")
    actor = serializers.CharField()
    at = serializers.DateTimeField()
    text = serializers.CharField()


class WorkItemSerializer(serializers.Serializer):
    operation = serializers.CharField()
    queue = serializers.ChoiceField(choices=list(QUEUES))
    holder = serializers.CharField(allow_null=True, help_text="Who has it; null: nobody.")
    given_by = serializers.CharField(allow_null=True, help_text="Who handed it to its holder.")
    taken_at = serializers.DateTimeField(allow_null=True)
    returns_at = serializers.DateTimeField(
        allow_null=True, help_text="When it goes back to everyone unless taken again."
    )
    comments = CommentSerializer(many=True)


def comment_out(event: Event) -> dict[str, Any]:
    return {
        "id": str(event.pk),
        "actor": event.actor,
        "at": iso(event.at),
        "text": event.data["text"],
    }


def _item_out(request: Request, queue: str, operation_id: str) -> Response:
    op, claim, comments = work_item(actor_of(request), queue, operation_id, timezone.now())
    return Response(
        {
            "operation": op.pk,
            "queue": queue,
            **_claim_fields(claim),
            "comments": [comment_out(e) for e in comments],
        }
    )


def _claim_fields(claim: Claim | None) -> dict[str, Any]:
    if claim is None:
        return {"holder": None, "given_by": None, "taken_at": None, "returns_at": None}
    return {
        "holder": claim.holder.get_username(),
        "given_by": claim.given_by or None,
        "taken_at": iso(claim.taken_at),
        "returns_at": iso(claim.taken_at + claim_return_after()),
    }


_ITEM = doc.responses({200: WorkItemSerializer}, write=True)


class WorkItemDetail(ApiView):
    @extend_schema(
        operation_id="v1_queues_items_retrieve",
        parameters=[QUEUE],
        responses=doc.responses({200: WorkItemSerializer}),
    )
    def get(self, request: Request, queue: str, operation_id: str) -> Response:
        return _item_out(request, queue, operation_id)


class WorkItemTake(ApiView):
    @extend_schema(
        operation_id="v1_queues_items_take",
        request=None,
        parameters=[QUEUE, doc.IDEMPOTENCY_KEY],
        responses=_ITEM,
    )
    @idempotent
    def post(self, request: Request, queue: str, operation_id: str) -> Response:
        worklist.claim_take_txn(actor_of(request), queue, operation_id)
        return _item_out(request, queue, operation_id)


class WorkItemGive(ApiView):
    @extend_schema(
        operation_id="v1_queues_items_give",
        request=GiveIn,
        parameters=[QUEUE, doc.IDEMPOTENCY_KEY],
        responses=_ITEM,
    )
    @idempotent
    def post(self, request: Request, queue: str, operation_id: str) -> Response:
        data = parse(GiveIn, request.data)
        worklist.claim_give_txn(actor_of(request), queue, operation_id, to=data["to"])
        return _item_out(request, queue, operation_id)


class WorkItemRelease(ApiView):
    @extend_schema(
        operation_id="v1_queues_items_release",
        request=None,
        parameters=[QUEUE, doc.IDEMPOTENCY_KEY],
        responses=_ITEM,
    )
    @idempotent
    def post(self, request: Request, queue: str, operation_id: str) -> Response:
        worklist.claim_release_txn(actor_of(request), queue, operation_id)
        return _item_out(request, queue, operation_id)


class WorkItemComments(ApiView):
    @extend_schema(
        operation_id="v1_queues_items_comments_create",
        request=CommentIn,
        parameters=[QUEUE, doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: CommentSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, queue: str, operation_id: str) -> Response:
        data = parse(CommentIn, request.data)
        event = worklist.comment_add_txn(actor_of(request), queue, operation_id, text=data["text"])
        return Response(comment_out(event), status=201)
