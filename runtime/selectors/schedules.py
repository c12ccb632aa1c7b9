"""Reads of schedules (selectors): scoped by the caller's visibility (runtime.policy), their
decided slots and journal entries in one query per page."""

from __future__ import annotations

from datetime import datetime

from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber

from runtime.actors import Actor
from runtime.errors import NotFound
from runtime.models import Schedule, ScheduleEvent, ScheduleRun
from runtime.policy_features import schedule_scope


def schedule_get(actor: Actor, schedule_id: str) -> Schedule:
    """The schedule if the actor may see it; NotFound otherwise (never reveals existence)."""
    schedule = (
        Schedule.objects.filter(schedule_scope(actor), pk=schedule_id)
        .select_related("agent", "user")
        .first()
    )
    if schedule is None:
        raise NotFound("no such schedule")
    return schedule


def schedule_list(
    actor: Actor, *, before: tuple[datetime, str] | None = None, limit: int = 50
) -> list[Schedule]:
    """The schedules the actor sees, newest first, by keyset (``before`` = (created_at, id) of
    the last row of the previous page)."""
    qs = Schedule.objects.filter(schedule_scope(actor)).select_related("agent", "user")
    if before is not None:
        at, last_id = before
        qs = qs.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=last_id))
    return list(qs.order_by("-created_at", "-id")[:limit])


def schedule_runs(schedule_ids: list[str], per_schedule: int = 10) -> dict[str, list[ScheduleRun]]:
    """Each schedule's latest decided slots, newest first, for a page of schedules in one
    query (with their tasks)."""
    runs: dict[str, list[ScheduleRun]] = {pk: [] for pk in schedule_ids}
    if not schedule_ids:
        return runs
    rows = (
        ScheduleRun.objects.filter(schedule_id__in=schedule_ids)
        .annotate(
            position=Window(
                RowNumber(),
                partition_by=[F("schedule_id")],
                order_by=[F("slot_time").desc(), F("id").desc()],
            )
        )
        .filter(position__lte=per_schedule)
        .select_related("task")
        .order_by("schedule_id", "-slot_time", "-id")
    )
    for run in rows:
        runs[run.schedule_id].append(run)
    return runs


def schedule_events(schedule_id: str, limit: int = 20) -> list[ScheduleEvent]:
    """The schedule's latest journal entries, newest first. Preconditions: the caller may
    see the schedule (schedule_get)."""
    return list(ScheduleEvent.objects.filter(schedule_id=schedule_id).order_by("-id")[:limit])


def schedule_pauses(schedule_ids: list[str]) -> dict[str, ScheduleEvent]:
    """The entry that paused each of these schedules (its latest ``schedule.paused``: who, when,
    why), in one query; a schedule created paused has none. Preconditions: the caller may see
    them."""
    if not schedule_ids:
        return {}
    rows = (
        ScheduleEvent.objects.filter(schedule_id__in=schedule_ids, type="schedule.paused")
        .annotate(
            position=Window(RowNumber(), partition_by=[F("schedule_id")], order_by=[F("id").desc()])
        )
        .filter(position=1)
    )
    return {event.schedule_id: event for event in rows}


def schedule_owner_label(schedule: Schedule) -> str:
    if schedule.agent is not None:
        return f"agent:{schedule.agent.name}"
    return f"user:{schedule.user.get_username()}" if schedule.user else "user:?"
