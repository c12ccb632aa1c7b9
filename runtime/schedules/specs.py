"""What a schedule says: the spec a caller gives, the task template it starts (checked by the
rules of ``POST /tasks``), what an edit may change, and the definition journaled with each
version. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import InvalidInput
from runtime.models import Schedule
from runtime.models.schedules import Overlap
from runtime.schedules.timing import DEFAULT_CATCH_UP_SECONDS
from runtime.tasks import TaskSpec, task_spec_check

# What PATCH may change (pause and resume have their own routes).
EDITABLE = ("cron", "interval_seconds", "timezone", "task", "overlap", "catch_up_seconds")


@dataclass
class ScheduleSpec:
    task: TaskSpec
    cron: str = ""
    interval_seconds: int | None = None
    timezone: str = "UTC"
    overlap: str = Overlap.SKIP
    catch_up_seconds: int = DEFAULT_CATCH_UP_SECONDS
    paused: bool = False


def template_check(spec: TaskSpec) -> dict[str, Any]:
    """The task a schedule starts, checked by the rules of ``POST /tasks``
    (runtime.tasks.task_spec_check), refusals naming the field under ``task.``; returned as it
    is stored. A scheduled task has no parent. Pure."""
    if spec.parent:
        raise InvalidInput("a scheduled task has no parent", field="task.parent")
    try:
        checked = task_spec_check(spec)
    except InvalidInput as exc:
        inner = str(exc.details.get("field") or "")
        raise InvalidInput(
            f"task.{exc.message}" if inner and exc.message.startswith(inner) else exc.message,
            code=exc.code,
            field=f"task.{inner}" if inner else "task",
        ) from None
    return {
        "name": checked.name,
        "input": checked.input,
        "budget": checked.limits or None,
        "deadline_seconds": checked.deadline_seconds,
        "required_checks": checked.checks,
        "compensate_on": checked.compensate_on,
    }


def template_spec(template: dict[str, Any]) -> TaskSpec:
    """The TaskSpec a stored template stands for."""
    return TaskSpec(
        name=str(template.get("name", "")),
        input=dict(template.get("input") or {}),
        deadline_seconds=template.get("deadline_seconds"),
        budget=template.get("budget"),
        required_checks=list(template.get("required_checks") or []),
        compensate_on=list(template.get("compensate_on") or []),
    )


def schedule_changes_check(changes: dict[str, Any]) -> None:
    """Refuse (400) a change to anything but EDITABLE, naming the field when it is a name. Pure."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if not unknown:
        return
    named = next((k for k in unknown if k.isascii() and k.isidentifier()), None)
    raise InvalidInput(
        f"{named or 'a field sent'} cannot be edited (editable: {', '.join(EDITABLE)}; pause "
        "and resume have their own routes)",
        field=named,
    )


def schedule_definition(schedule: Schedule) -> dict[str, Any]:
    """What a version of a schedule says (journaled on creation and with each edit)."""
    return {
        "cron": schedule.cron or None,
        "interval_seconds": schedule.interval_seconds,
        "timezone": schedule.timezone,
        "task": schedule.template,
        "overlap": schedule.overlap,
        "catch_up_seconds": schedule.catch_up_seconds,
    }
