"""Schedules for people (/schedules/): each schedule's next runs, its last runs with their tasks,
and for those who may manage it (can_manage_schedule: admins, in the console) pause,
resume, trigger now and an edit form. Every console role reads the page."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from console.api.parsers import json_problem
from console.web.humans import json_for_editing
from console.web.views import console_view
from runtime import policy, schedule_owners
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput, NotAuthorized
from runtime.models import Schedule
from runtime.models.schedules import Overlap
from runtime.policy_features import can_create_schedule, can_manage_schedule
from runtime.schedules import services, timing
from runtime.schedules.specs import ScheduleSpec
from runtime.selectors import schedules
from runtime.tasks import TaskSpec

_PAGE = "/schedules/"


def _local(at: datetime, zone: str) -> str:
    """The time as the schedule's zone reads it (its cron is written in that zone)."""
    return at.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")


def _rows(actor: Actor) -> list[dict[str, Any]]:
    page = schedules.schedule_list(actor, limit=100)
    runs = schedules.schedule_runs([x.pk for x in page], per_schedule=5)
    paused = [x for x in page if x.paused]
    pauses = schedules.schedule_pauses([x.pk for x in paused])
    rows = []
    for schedule in page:
        template = schedule.template
        rows.append(
            {
                "s": schedule,
                "owner": schedules.schedule_owner_label(schedule),
                # Who paused it and why; and, while paused, whether its owner can act now (a
                # resume is refused until it can).
                "pause": pauses.get(schedule.pk),
                "owner_inactive": (
                    schedule_owners.owner_inactive_reason(schedule) if schedule.paused else None
                ),
                "next": [
                    {"at": t, "local": _local(t, schedule.timezone)}
                    for t in timing.schedule_next_slots(schedule, 3)
                ],
                "runs": runs[schedule.pk],
                "can_manage": policy.allowed(can_manage_schedule, actor, schedule),
                "input": json_for_editing(template.get("input") or {}),
                "budget": json_for_editing(template.get("budget") or {}),
                "checks": json_for_editing(template.get("required_checks") or []),
            }
        )
    return rows


@require_GET
@console_view
def schedules_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(
        request,
        "console/schedules.html",
        {
            "rows": _rows(actor),
            "overlaps": Overlap.ALL,
            "can_create": policy.allowed(can_create_schedule, actor),
        },
    )


def _back(schedule_id: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(f"{_PAGE}#{schedule_id}")


@require_POST
@console_view
def schedule_action(request: HttpRequest, actor: Actor, schedule_id: str) -> HttpResponse:
    # The right first: a person without it gets the 403 page whatever the form says.
    can_manage_schedule(actor, schedules.schedule_get(actor, schedule_id))
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")[:2000]
    try:
        if action == "pause":
            _, changed = services.schedule_pause(actor, schedule_id, reason=reason)
            said = "is paused: its slots start nothing" if changed else "was already paused"
        elif action == "resume":
            schedule, changed = services.schedule_resume(actor, schedule_id, reason=reason)
            said = (
                f"is running again: next run {schedule.next_slot_at:%Y-%m-%d %H:%M} UTC"
                if changed
                else "was not paused"
            )
        elif action == "trigger":
            run = services.schedule_trigger(actor, schedule_id)
            said = f"started task {run.task_id} now"
        else:
            raise InvalidInput("action is pause, resume or trigger")
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"Nothing was done to schedule {schedule_id}: {exc.message}.")
        return _back(schedule_id)
    messages.success(request, f"Schedule {schedule_id} {said}.")
    return _back(schedule_id)


def _json_field(request: HttpRequest, name: str, field: str) -> Any:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidInput(f"{field} is not JSON", field=field) from None


def _int_field(request: HttpRequest, name: str) -> int | None:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a whole number", field=name) from None


def _changes(request: HttpRequest) -> tuple[dict[str, Any], int | None]:
    """The edit form as PATCH /schedules/{id} takes it (the same service checks it)."""
    problem = json_problem({k: request.POST.getlist(k) for k in request.POST})
    if problem:
        raise InvalidInput(problem)
    cron = request.POST.get("cron", "").strip()
    interval = _int_field(request, "interval_seconds")
    task: dict[str, Any] = {
        "name": request.POST.get("name", ""),
        "input": _json_field(request, "input", "task.input") or {},
        "budget": _json_field(request, "budget", "task.budget") or None,
        "deadline_seconds": _int_field(request, "deadline_seconds"),
        "required_checks": _json_field(request, "required_checks", "task.required_checks") or [],
    }
    if not isinstance(task["input"], dict):
        raise InvalidInput("task.input must be a JSON object", field="task.input")
    if task["budget"] is not None and not isinstance(task["budget"], dict):
        raise InvalidInput("task.budget must be a JSON object", field="task.budget")
    checks = task["required_checks"]
    if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
        raise InvalidInput(
            "task.required_checks must be a JSON list of objects", field="task.required_checks"
        )
    catch_up = _int_field(request, "catch_up_seconds")
    # Both timings as typed: a cron and an interval together are the service's refusal to say
    # ("exactly one"), never an interval dropped without a word; a catch-up window left empty
    # is the default, one typed (even 0) is checked as typed.
    changes: dict[str, Any] = {
        "cron": cron,
        "interval_seconds": interval,
        "timezone": request.POST.get("timezone", "").strip() or "UTC",
        "overlap": request.POST.get("overlap", ""),
        "catch_up_seconds": timing.DEFAULT_CATCH_UP_SECONDS if catch_up is None else catch_up,
        "task": task,
    }
    return changes, _int_field(request, "version")


@require_POST
@console_view
def schedule_edit(request: HttpRequest, actor: Actor, schedule_id: str) -> HttpResponse:
    before: Schedule = schedules.schedule_get(actor, schedule_id)
    can_manage_schedule(actor, before)
    try:
        changes, version = _changes(request)
        schedule = services.schedule_edit(actor, schedule_id, changes, version=version)
    except NotAuthorized:
        raise
    except DomainError as exc:
        messages.error(request, f"Schedule {schedule_id} was not changed: {exc.message}.")
        return _back(schedule_id)
    if schedule.version == before.version:
        messages.info(request, f"Schedule {schedule_id}: nothing to change.")
    else:
        messages.success(
            request,
            f"Schedule {schedule_id} is now version {schedule.version}; tasks already started "
            "keep what they were started with.",
        )
    return _back(schedule_id)


@require_POST
@console_view
def schedule_new(request: HttpRequest, actor: Actor) -> HttpResponse:
    """The create form (/schedules/, admins): the fields of the edit form, as
    POST /api/v1/schedules takes them; the schedule and its tasks are the admin's."""
    can_create_schedule(actor)  # the right first: a 403 page whatever the form says
    try:
        changes, _ = _changes(request)
        task = changes.pop("task")
        spec = ScheduleSpec(
            task=TaskSpec(**task),
            cron=changes["cron"],
            interval_seconds=changes["interval_seconds"],
            timezone=changes["timezone"],
            overlap=changes["overlap"] or Overlap.SKIP,
            catch_up_seconds=changes["catch_up_seconds"],
        )
        schedule = services.schedule_create(actor, spec)
    except NotAuthorized:
        raise
    except DomainError as exc:
        messages.error(request, f"No schedule was created: {exc.message}.")
        return HttpResponseRedirect(_PAGE)
    messages.success(
        request,
        f"Schedule {schedule.pk} is created: its first run is "
        f"{schedule.next_slot_at:%Y-%m-%d %H:%M} UTC.",
    )
    return _back(schedule.pk)
