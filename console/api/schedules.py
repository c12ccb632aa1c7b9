"""REST API v1: schedules (docs/schedules.md). Each view parses, authorises (the services ask
runtime.policy), calls one runtime service and serialises. The shapes are here: the request
parsers, the renderers (``*_out``) and the schema components that describe them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api import serializers as s
from console.api.auth import actor_of
from console.api.control import ReasonIn
from console.api.idempotency import idempotent
from console.api.views import ApiView, _limit, _param, task_body
from runtime.errors import InvalidInput
from runtime.models import Schedule, ScheduleRun
from runtime.models.schedules import Overlap, RunStatus, SkipReason
from runtime.schedules.services import (
    schedule_create,
    schedule_edit,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
)
from runtime.schedules.specs import ScheduleSpec, schedule_changes_check
from runtime.schedules.timing import (
    DEFAULT_CATCH_UP_SECONDS,
    MAX_CATCH_UP_SECONDS,
    MAX_INTERVAL_SECONDS,
    MIN_CATCH_UP_SECONDS,
    MIN_INTERVAL_SECONDS,
    schedule_next_slots,
)
from runtime.selectors.schedules import (
    schedule_get,
    schedule_list,
    schedule_owner_label,
    schedule_runs,
)
from runtime.tasks import TaskSpec

# --- requests -------------------------------------------------------------------------------


class ScheduleTaskIn(s.TaskIn):
    """The task each slot creates: POST /tasks' body without ``parent``."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return dict(serializers.Serializer.get_fields(self))


class ScheduleIn(serializers.Serializer):
    cron = s.Text(max_length=200, required=False, allow_blank=True, default="")
    interval_seconds = s.Int(
        required=False,
        allow_null=True,
        min_value=MIN_INTERVAL_SECONDS,
        max_value=MAX_INTERVAL_SECONDS,
    )
    timezone = s.Text(min_length=1, max_length=64, required=False, default="UTC")
    task = ScheduleTaskIn()
    overlap = serializers.ChoiceField(choices=Overlap.ALL, required=False, default=Overlap.SKIP)
    catch_up_seconds = s.Int(
        required=False,
        default=DEFAULT_CATCH_UP_SECONDS,
        min_value=MIN_CATCH_UP_SECONDS,
        max_value=MAX_CATCH_UP_SECONDS,
    )
    paused = serializers.BooleanField(required=False, default=False)


class SchedulePatchIn(serializers.Serializer):
    """Parsed with ``partial=True``: only what is sent is changed (``task`` merged over the
    stored template)."""

    cron = s.Text(max_length=200, required=False, allow_blank=True)
    interval_seconds = s.Int(
        required=False,
        allow_null=True,
        min_value=MIN_INTERVAL_SECONDS,
        max_value=MAX_INTERVAL_SECONDS,
    )
    timezone = s.Text(min_length=1, max_length=64, required=False)
    task = ScheduleTaskIn(required=False)
    overlap = serializers.ChoiceField(choices=Overlap.ALL, required=False)
    catch_up_seconds = s.Int(
        required=False,
        min_value=MIN_CATCH_UP_SECONDS,
        max_value=MAX_CATCH_UP_SECONDS,
    )
    version = s.Int(
        required=False,
        min_value=1,
        help_text="The version the edit is based on: 409 state_version_mismatch if not current.",
    )


def _task_spec(data: dict[str, Any]) -> TaskSpec:
    return TaskSpec(
        name=data["name"],
        input=data.get("input") or {},
        deadline_seconds=data.get("deadline_seconds"),
        budget=data.get("budget"),
        required_checks=data.get("required_checks") or [],
        compensate_on=data.get("compensate_on") or [],
    )


def _patch_changes(request: Request) -> tuple[dict[str, Any], int | None]:
    if not isinstance(request.data, dict):
        raise InvalidInput("the body must be a JSON object")
    schedule_changes_check({k: v for k, v in request.data.items() if k != "version"})
    parser = SchedulePatchIn(data=request.data, partial=True)
    parser.is_valid(raise_exception=True)
    changes = dict(parser.validated_data)
    version = changes.pop("version", None)
    if "task" in changes:
        changes["task"] = dict(changes["task"])  # partial: only the keys sent
    return changes, version


# --- responses ------------------------------------------------------------------------------


def run_out(run: ScheduleRun) -> dict[str, Any]:
    return {
        "slot_time": s.iso(run.slot_time),
        "kind": run.kind,
        "status": run.status,
        "reason": run.reason or None,
        "detail": run.detail or None,
        "task": run.task_id,
        "schedule_version": run.schedule_version,
        "actor": run.actor,
        "decided_at": s.iso(run.decided_at),
    }


def schedule_out(schedule: Schedule) -> dict[str, Any]:
    upcoming = schedule_next_slots(schedule, 1)
    return {
        "id": schedule.pk,
        "cron": schedule.cron or None,
        "interval_seconds": schedule.interval_seconds,
        "timezone": schedule.timezone,
        "task": schedule.template,
        "overlap": schedule.overlap,
        "catch_up_seconds": schedule.catch_up_seconds,
        "paused": schedule.paused,
        "version": schedule.version,
        "owner": schedule_owner_label(schedule),
        "created_by": schedule.created_by,
        "next_run_at": s.iso(upcoming[0]) if upcoming else None,
        "created_at": s.iso(schedule.created_at),
        "updated_at": s.iso(schedule.updated_at),
    }


def schedule_detail_out(schedule: Schedule) -> dict[str, Any]:
    runs = schedule_runs([schedule.pk], per_schedule=20)[schedule.pk]
    return {
        **schedule_out(schedule),
        "next_runs": [s.iso(t) for t in schedule_next_slots(schedule, 5)],
        "runs": [run_out(r) for r in runs],
    }


# --- schema components ----------------------------------------------------------------------


class ScheduleTaskSerializer(serializers.Serializer):
    name = serializers.CharField()
    input = serializers.DictField()
    budget = serializers.DictField(child=serializers.IntegerField(min_value=0), allow_null=True)
    deadline_seconds = serializers.IntegerField(allow_null=True)
    required_checks = serializers.ListField(child=serializers.DictField())
    compensate_on = serializers.ListField(
        child=serializers.ChoiceField(choices=["failed", "cancelled"])
    )


class ScheduleSerializer(serializers.Serializer):
    id = serializers.CharField()
    cron = serializers.CharField(allow_null=True)
    interval_seconds = serializers.IntegerField(allow_null=True)
    timezone = serializers.CharField()
    task = ScheduleTaskSerializer(help_text="The task each slot creates.")
    overlap = serializers.ChoiceField(choices=Overlap.ALL)
    catch_up_seconds = serializers.IntegerField()
    paused = serializers.BooleanField()
    version = serializers.IntegerField(min_value=1)
    owner = serializers.CharField(help_text="agent:NAME or user:NAME; the tasks are its.")
    created_by = serializers.CharField()
    next_run_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ScheduleRunSerializer(serializers.Serializer):
    slot_time = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=[ScheduleRun.SCHEDULED, ScheduleRun.MANUAL])
    status = serializers.ChoiceField(choices=RunStatus.ALL)
    reason = serializers.ChoiceField(choices=SkipReason.ALL, allow_null=True)
    detail = serializers.CharField(allow_null=True)
    task = serializers.CharField(allow_null=True)
    schedule_version = serializers.IntegerField(min_value=1)
    actor = serializers.CharField()
    decided_at = serializers.DateTimeField()


class ScheduleDetailSerializer(ScheduleSerializer):
    next_runs = serializers.ListField(child=serializers.DateTimeField())
    runs = ScheduleRunSerializer(many=True, help_text="The latest decided slots, newest first.")


class SchedulePageSerializer(serializers.Serializer):
    results = ScheduleSerializer(many=True)
    next = serializers.CharField(allow_null=True)


class TriggerSerializer(serializers.Serializer):
    run = ScheduleRunSerializer()
    task = doc.TaskSerializer()


# --- views ----------------------------------------------------------------------------------


class ScheduleCollection(ApiView):
    @extend_schema(
        operation_id="v1_schedules_list",
        parameters=[doc.CURSOR, doc.limit(50, 200)],
        responses=doc.responses({200: SchedulePageSerializer}),
    )
    def get(self, request: Request) -> Response:
        cursor = _param(request, "cursor")
        limit = _limit(request)
        rows = schedule_list(
            actor_of(request),
            before=s.cursor_decode(cursor) if cursor else None,
            limit=limit + 1,
        )
        page, more = rows[:limit], len(rows) > limit
        return Response(
            {
                "results": [schedule_out(x) for x in page],
                "next": s.cursor_encode(page[-1].created_at, page[-1].pk) if more else None,
            }
        )

    @extend_schema(
        operation_id="v1_schedules_create",
        request=ScheduleIn,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: ScheduleDetailSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = s.parse(ScheduleIn, request.data)
        schedule = schedule_create(
            actor_of(request),
            ScheduleSpec(
                task=_task_spec(data["task"]),
                cron=data.get("cron") or "",
                interval_seconds=data.get("interval_seconds"),
                timezone=data["timezone"],
                overlap=data["overlap"],
                catch_up_seconds=data["catch_up_seconds"],
                paused=data["paused"],
            ),
        )
        return Response(schedule_detail_out(schedule), status=201)


class ScheduleDetail(ApiView):
    @extend_schema(
        operation_id="v1_schedules_retrieve",
        responses=doc.responses({200: ScheduleDetailSerializer}),
    )
    def get(self, request: Request, schedule_id: str) -> Response:
        return Response(schedule_detail_out(schedule_get(actor_of(request), schedule_id)))

    @extend_schema(
        operation_id="v1_schedules_partial_update",
        request=SchedulePatchIn,
        responses=doc.responses({200: ScheduleDetailSerializer}, write=True),
    )
    def patch(self, request: Request, schedule_id: str) -> Response:
        changes, version = _patch_changes(request)
        actor = actor_of(request)
        schedule = schedule_edit(actor, schedule_id, changes, version=version)
        return Response(schedule_detail_out(schedule_get(actor, schedule.pk)))


# Pause or resume: the same request (a reason) and answer (the schedule), one service each.
# (A comment, not a docstring: the schema would take it as both operations' description.)
class _ScheduleSwitch(ApiView):
    switch: Callable[..., tuple[Schedule, bool]]

    @idempotent
    def post(self, request: Request, schedule_id: str) -> Response:
        data = s.parse(ReasonIn, request.data or {})
        actor = actor_of(request)
        type(self).switch(actor, schedule_id, reason=data["reason"])
        return Response(schedule_detail_out(schedule_get(actor, schedule_id)))


def _switch_schema(operation_id: str) -> Any:
    return extend_schema_view(
        post=extend_schema(
            operation_id=operation_id,
            request=ReasonIn,
            parameters=[doc.IDEMPOTENCY_KEY],
            responses=doc.responses({200: ScheduleDetailSerializer}, write=True),
        )
    )


@_switch_schema("v1_schedules_pause")
class SchedulePause(_ScheduleSwitch):
    switch = staticmethod(schedule_pause)


@_switch_schema("v1_schedules_resume")
class ScheduleResume(_ScheduleSwitch):
    switch = staticmethod(schedule_resume)


class ScheduleTrigger(ApiView):
    @extend_schema(
        operation_id="v1_schedules_trigger",
        request=None,
        parameters=[doc.IDEMPOTENCY_KEY],
        responses=doc.responses({201: TriggerSerializer}, write=True),
    )
    @idempotent
    def post(self, request: Request, schedule_id: str) -> Response:
        run = schedule_trigger(actor_of(request), schedule_id)
        assert run.task is not None
        return Response({"run": run_out(run), "task": task_body(run.task)}, status=201)
