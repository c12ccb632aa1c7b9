"""REST API v1 (API.md). Each view parses, authorises, calls one runtime service, serialises."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api import schema as doc
from console.api import serializers as s
from console.api.auth import actor_of
from console.api.idempotency import idempotent
from console.api.parsers import PARSER_CLASSES, text_problem
from runtime import events as journal
from runtime import policy, task_keys
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput
from runtime.executions import execution_for_agent
from runtime.logcontext import work_bind
from runtime.models import Operation, Task
from runtime.models.tasks import MAX_EXTERNAL_ID
from runtime.selectors.approvals import approvals_current
from runtime.selectors.operations import (
    invocations_by_operation,
    operation_get,
    operation_get_for_agent,
    operation_list,
)
from runtime.selectors.tasks import task_get, task_list, tasks_pending_operation_ids
from runtime.specs import OperationSpec
from runtime.tasks import TaskSpec
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim
from runtime.transitions.lease import lease_heartbeat
from runtime.transitions.propose import operation_propose_txn


def task_body(task: Task) -> dict[str, Any]:
    return task_bodies([task])[0]


def task_bodies(page: list[Task]) -> list[dict[str, Any]]:
    pending = tasks_pending_operation_ids([t.pk for t in page])
    return [s.task_out(t, pending[t.pk]) for t in page]


def operation_body(op: Operation, *, created: bool = False) -> dict[str, Any]:
    return operation_bodies([op], created=created)[0]


def operation_bodies(page: list[Operation], *, created: bool = False) -> list[dict[str, Any]]:
    # An operation this request created is answered as it was created (pending, or waiting for
    # its approval), before any invocation: no query for them.
    invocations: dict[str, list[Any]] = (
        {op.pk: [] for op in page} if created else invocations_by_operation([op.pk for op in page])
    )
    approvals = approvals_current([op for op in page if op.approval_required])
    return [
        s.operation_out(
            op,
            invocations[op.pk],
            s.approval_out(approvals[op.pk]) if op.pk in approvals else None,
        )
        for op in page
    ]


class ApiView(APIView):
    # Bodies go through the storable-JSON parser. (A comment, not a docstring: the schema would
    # inherit a docstring as every view's description.)
    parser_classes = PARSER_CLASSES

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # DRF reads a body without a Content-Type as no body at all: it would be dropped, not
        # refused, so a request whose body is something else than JSON is a 415 here.
        if _has_body(request):
            if not request.content_type:
                raise UnsupportedMediaType("", detail="a request body must be application/json")
            # Parsed even where the handler reads nothing (claim): every POST refuses a bad
            # body the same way, before anything happens.
            if not isinstance(request.data, dict):
                raise InvalidInput("the body must be a JSON object")


def _has_body(request: Request) -> bool:
    meta = request._request.META
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    return length > 0 or "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()


def _param(request: Request, name: str, max_length: int = 300) -> str | None:
    """A query parameter, or None when absent or empty; 400 for text the database refuses or
    longer than the schema allows."""
    raw = request.query_params.get(name)
    if not raw:
        return None
    problem = text_problem(raw)
    if problem:
        raise InvalidInput(f"{name}: {problem}")
    if len(raw) > max_length:
        raise InvalidInput(f"{name} is longer than {max_length} characters")
    return str(raw)


def _limit(request: Request, default: int = 50, ceiling: int = 200) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput("limit must be a whole number") from None
    if not 1 <= value <= ceiling:
        raise InvalidInput(f"limit must be between 1 and {ceiling}")
    return value


class TaskCollection(ApiView):
    @extend_schema(
        operation_id="v1_tasks_list",
        parameters=doc.TASK_FILTERS,
        responses=doc.responses({200: doc.TaskPageSerializer}),
    )
    def get(self, request: Request) -> Response:
        cursor = _param(request, "cursor")
        limit = _limit(request)
        rows = task_list(
            actor_of(request),
            condition=_param(request, "condition"),
            outcome=_param(request, "outcome"),
            search=_param(request, "q"),
            schedule=_param(request, "schedule", max_length=64),
            external_id=_param(request, "external_id", max_length=MAX_EXTERNAL_ID),
            before=s.cursor_decode(cursor) if cursor else None,
            limit=limit + 1,
        )
        page, more = rows[:limit], len(rows) > limit
        return Response(
            {
                "results": task_bodies(page),
                "next": s.cursor_encode(page[-1].created_at, page[-1].pk) if more else None,
            }
        )

    @extend_schema(
        operation_id="v1_tasks_create",
        request=s.TaskIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.TaskSerializer, 201: doc.TaskSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.parse(s.TaskIn, request.data)
        task, created = task_keys.task_get_or_create(
            actor_of(request),
            TaskSpec(
                name=data["name"],
                input=data.get("input") or {},
                deadline_seconds=data.get("deadline_seconds"),
                budget=data.get("budget"),
                parent=data.get("parent"),
                required_checks=data.get("required_checks") or [],
                compensate_on=data.get("compensate_on") or [],
                external_id=data.get("external_id"),
            ),
        )
        return Response(task_body(task), status=201 if created else 200)


class TaskDetail(ApiView):
    @extend_schema(
        operation_id="v1_tasks_retrieve", responses=doc.responses({200: doc.TaskSerializer})
    )
    def get(self, request: Request, task_id: str) -> Response:
        return Response(task_body(task_get(actor_of(request), task_id)))


class TaskOperations(ApiView):
    @extend_schema(
        operation_id="v1_tasks_operations_list",
        parameters=[doc.limit(100, 500)],
        responses=doc.responses({200: doc.OperationListSerializer}),
    )
    def get(self, request: Request, task_id: str) -> Response:
        actor = actor_of(request)
        task_get(actor, task_id)
        ops = operation_list(actor, task_id=task_id, limit=_limit(request, 100, 500))
        return Response({"results": operation_bodies(ops)})

    @extend_schema(
        operation_id="v1_tasks_operations_create",
        request=s.OperationIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses(
            {200: doc.OperationSerializer, 201: doc.OperationSerializer}, write=True
        ),
    )
    @idempotent
    def post(self, request: Request, task_id: str) -> Response:
        data = s.parse(s.OperationIn, request.data)
        # In the request's transaction (``idempotent``): a refusal rolls the request back.
        op, created = operation_propose_txn(
            actor_of(request),
            task_id,
            OperationSpec(
                kind=data["kind"],
                tool=data.get("tool") or "",
                params=data.get("params") or {},
                step=data["step"],
                intent_version=data["intent_version"],
                idempotency_key=data.get("idempotency_key"),
                estimate=data.get("estimate") or {},
                executor=data["executor"],
                max_attempts=data.get("max_attempts"),
                signal=data.get("signal") or "",
                timeout_seconds=data.get("timeout_seconds"),
                approval_timeout_seconds=data.get("approval_timeout_seconds"),
            ),
        )
        return Response(operation_body(op, created=created), status=201 if created else 200)


class OperationCollection(ApiView):
    @extend_schema(
        operation_id="v1_operations_list",
        parameters=doc.OPERATION_FILTERS,
        responses=doc.responses({200: doc.OperationPageSerializer}),
    )
    def get(self, request: Request) -> Response:
        cursor = _param(request, "cursor")
        limit = _limit(request)
        rows = operation_list(
            actor_of(request),
            status=_param(request, "status"),
            task_id=_param(request, "task"),
            after=s.cursor_decode(cursor) if cursor else None,
            limit=limit + 1,
        )
        page, more = rows[:limit], len(rows) > limit
        return Response(
            {
                "results": operation_bodies(page),
                "next": s.cursor_encode(page[-1].created_at, page[-1].pk) if more else None,
            }
        )


class OperationDetail(ApiView):
    @extend_schema(
        operation_id="v1_operations_retrieve",
        responses=doc.responses({200: doc.OperationSerializer}),
    )
    def get(self, request: Request, operation_id: str) -> Response:
        return Response(operation_body(operation_get(actor_of(request), operation_id)))


class OperationClaim(ApiView):
    @extend_schema(
        operation_id="v1_operations_claim",
        request=None,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.LeaseSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, operation_id: str) -> Response:
        op = operation_get_for_agent(actor_of(request), operation_id)
        execution = execution_for_agent(actor_of(request).name)
        work_bind(op, execution_id=execution.pk)  # the ids this request's log lines carry
        lease = agent_claim(operation_id, execution.pk, actor=actor_of(request).label)
        return Response(
            {
                "lease_generation": lease.lease_generation,
                "lease_expires_at": s.iso(lease.lease_expires_at),
                "lease_token": lease.lease_token,
                "state_version": lease.state_version,
                "execution": execution.pk,
                # The deadline travels with the work: what is left of it when the claim began.
                "deadline": s.iso(lease.operation.deadline),
                "deadline_remaining_seconds": _remaining(lease.operation.deadline),
            }
        )


def _remaining(deadline: Any) -> float | None:
    if deadline is None:
        return None

    return max(0.0, round((deadline - timezone.now()).total_seconds(), 3))


class OperationHeartbeat(ApiView):
    @extend_schema(
        operation_id="v1_operations_heartbeat",
        request=s.HeartbeatIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.HeartbeatSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, operation_id: str) -> Response:
        data = s.parse(s.HeartbeatIn, request.data)
        work_bind(operation_get_for_agent(actor_of(request), operation_id, leased=True))
        expires, cancel = lease_heartbeat(
            operation_id, data["lease_generation"], data["lease_token"]
        )
        return Response({"lease_expires_at": s.iso(expires), "cancel_requested": cancel})


class OperationComplete(ApiView):
    @extend_schema(
        operation_id="v1_operations_complete",
        request=s.CompleteIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({200: doc.OperationSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, operation_id: str) -> Response:
        data = s.parse(s.CompleteIn, request.data)
        op = operation_get_for_agent(actor_of(request), operation_id, leased=True)
        work_bind(op)
        error = data.get("error") or {}
        if data["outcome"] == "failed" and not error:
            raise InvalidInput("a failed outcome needs error.kind (transient or permanent)")
        accepted = agent_report(
            op,
            actor=actor_of(request).label,
            lease_generation=data["lease_generation"],
            lease_token=data["lease_token"],
            report=Report(
                outcome=data["outcome"],
                result=data.get("result"),
                error_kind=error.get("kind", ""),
                message=error.get("message", ""),
                usage=data.get("usage") or {},
            ),
        )
        return Response(operation_body(accepted))


class _StreamOrJson(DefaultContentNegotiation):
    """The events view answers ``Accept: text/event-stream`` itself with a streamed response DRF
    does not render; whatever DRF does render there (a page, an error) is JSON. DRF's default
    negotiation would refuse that Accept header with a 406 before the view ran."""

    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        first = next(iter(renderers))
        return first, str(first.media_type)


class TaskEvents(ApiView):
    content_negotiation_class = _StreamOrJson

    @extend_schema(
        operation_id="v1_tasks_events_list",
        parameters=[doc.EVENT_CURSOR, doc.limit(100, 1000)],
        responses=doc.responses({200: doc.EventPageSerializer}),
        description="With `Accept: text/event-stream`, the same events as server-sent events "
        "(each with `id:`), resuming after `Last-Event-ID`.",
    )
    def get(self, request: Request, task_id: str) -> Any:
        actor = actor_of(request)
        task = task_get(actor, task_id)
        accept = request.headers.get("Accept", "")
        raw_after = request.headers.get("Last-Event-ID") or request.query_params.get("after")
        after = _cursor_int(raw_after)
        if "text/event-stream" in accept:
            response = StreamingHttpResponse(
                _sse(
                    task,
                    after,
                    _float(request.query_params.get("max_seconds"), 3600.0),
                    actor=actor,
                    # A person's stream without a token came with its browser session.
                    session_key=None if actor.token_id else request.session.session_key,
                ),
                content_type="text/event-stream",
            )
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        rows = journal.events_after(task_id, after, _limit(request, 100, 1000))
        return Response(
            {
                "events": [s.event_out(e) for e in rows],
                "next": str(rows[-1].seq) if rows else str(after),
            }
        )


MAX_CURSOR = 2**63 - 1


def _cursor_int(raw: str | None) -> int:
    if raw in (None, ""):
        return 0
    try:
        value = int(str(raw))
    except ValueError:
        raise InvalidInput("the cursor must be an event id from this task") from None
    if not 0 <= value <= MAX_CURSOR:
        raise InvalidInput("the cursor must be an event id from this task")
    return value


def _float(raw: str | None, default: float) -> float:
    try:
        return min(float(raw), default) if raw else default
    except ValueError:
        raise InvalidInput("max_seconds must be a number") from None


def _released(fn: Any) -> Any:
    """``fn`` run for a long-lived stream: its database connection goes back afterwards (to the
    web server's pool: close_old_connections closes a connection that is not kept, and a pooled
    one never is), so open streams do not each hold one of the pool's connections while they
    wait for a hint."""

    def run(*args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return run


_events_after = _released(journal.events_after)


@_released
def _stream_refusal(actor: Actor, task: Task, session_key: str | None) -> dict[str, Any] | None:
    """The error that ends an open stream now (policy.can_keep_streaming, the rule the live
    sockets follow too), or None while its principal still holds."""
    try:
        policy.can_keep_streaming(
            actor, lambda now: policy.can_follow_task(now, task), session_key=session_key
        )
    except DomainError as exc:
        return {"error": {"code": exc.code, "message": exc.message}}
    return None


async def _sse(
    task: Task, after: int, max_seconds: float, *, actor: Actor, session_key: str | None
) -> AsyncIterator[bytes]:
    """Server-sent events from the journal, resuming strictly after ``after``. Woken by the same
    journal hints as the websockets (services mode); the hints are lossy, so the journal is also
    read on a slow timer as a safety net (and on a quick one in embedded mode, where hints do not
    cross processes). Ends after ``max_seconds`` so clients reconnect with Last-Event-ID, and,
    with an ``event: error``, within TOKEN_RECHECK_SECONDS of its principal no longer holding
    (token revoked, logged out, user deactivated, role removed)."""

    task_id = task.pk
    layer = get_channel_layer()
    hinted = layer is not None and not isinstance(layer, InMemoryChannelLayer)
    group = journal.TASK_GROUP.format(task_id=task_id)
    channel = ""
    if hinted:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    # The principal's recheck comes round within its period, hints or not.
    idle = min(
        float(settings.SSE_SAFETY_POLL_SECONDS) if hinted else 0.25,
        float(settings.TOKEN_RECHECK_SECONDS),
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    checked = started
    last = after
    quiet = 0.0
    try:
        yield b"retry: 1000\n\n"
        while loop.time() - started < max_seconds:
            if loop.time() - checked >= settings.TOKEN_RECHECK_SECONDS:
                checked = loop.time()
                if (refused := await _sse_refusal(actor, task, session_key)) is not None:
                    yield refused
                    return
            rows = await sync_to_async(_events_after)(task_id, last, 200)
            for event in rows:
                yield _sse_event(event)
                last = event.seq
            if rows:
                quiet = 0.0
                continue
            waited = loop.time()
            await _sse_wait(layer if hinted else None, channel, idle)
            quiet += loop.time() - waited
            if quiet >= 15:
                quiet = 0.0
                yield b": keepalive\n\n"
    finally:
        if hinted:
            await layer.group_discard(group, channel)


async def _sse_refusal(actor: Actor, task: Task, session_key: str | None) -> bytes | None:
    """The ``event: error`` that ends a stream whose principal no longer holds, or None."""
    refusal = await sync_to_async(_stream_refusal)(actor, task, session_key)
    if refusal is None:
        return None
    return f"event: error\ndata: {json.dumps(refusal)}\n\n".encode()


def _sse_event(event: Any) -> bytes:
    """One journal event as a server-sent event, its sequence number as its id."""
    body = json.dumps(s.event_out(event), separators=(",", ":"))
    return f"id: {event.seq}\nevent: {event.type}\ndata: {body}\n\n".encode()


async def _sse_wait(layer: Any, channel: str, idle: float) -> None:
    """Until the next journal hint on ``channel`` (``layer``: services mode) or ``idle`` seconds,
    whichever comes first."""
    try:
        if layer is not None:
            await asyncio.wait_for(layer.receive(channel), timeout=idle)
        else:
            await asyncio.sleep(idle)
    except TimeoutError:
        pass
