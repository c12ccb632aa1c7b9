"""A person's side of notifications: their preferences (email, quiet hours, time zone), when
their quiet hours end, the address a message goes to, and the tasks they watch."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import time as dtime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import InvalidInput
from runtime.models import NotificationPreference, TaskWatch
from runtime.policy import can_watch_task
from runtime.selectors.notifications import person_of
from runtime.selectors.tasks import task_get


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def quiet_until(pref: NotificationPreference | None, now: datetime) -> datetime | None:
    """When ``now`` falls in the person's quiet hours, the moment they end; else None. Pure.
    A window whose start is after its end spans midnight (22:00-07:00)."""
    if pref is None or pref.quiet_start is None or pref.quiet_end is None:
        return None
    start, end = pref.quiet_start, pref.quiet_end
    if start == end:
        return None
    zone = _zone(pref.timezone)
    local = now.astimezone(zone)
    clock = local.time().replace(tzinfo=None)
    inside = start <= clock < end if start < end else clock >= start or clock < end
    if not inside:
        return None
    end_day = local.date() if clock < end else local.date() + timedelta(days=1)
    return datetime.combine(end_day, end, tzinfo=zone)


def email_address(user: Any, pref: NotificationPreference | None) -> str:
    if pref is not None and not pref.email_enabled:
        return ""
    return (pref.email if pref is not None and pref.email else "") or (user.email or "")


def preference_save(
    actor: Actor,
    *,
    email_enabled: bool,
    email: str,
    quiet_start: dtime | None,
    quiet_end: dtime | None,
    tz: str,
) -> NotificationPreference:
    """Save the person's own choices. Quiet hours need both ends (or neither)."""
    user_id = person_of(actor)
    if (quiet_start is None) != (quiet_end is None):
        raise InvalidInput("quiet hours need a start and an end", field="quiet_start")
    try:
        ZoneInfo(tz or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"unknown time zone {tz!r}", field="timezone") from None
    email = (email or "").strip()
    if email and ("@" not in email or len(email) > 254 or any(c.isspace() for c in email)):
        raise InvalidInput("email must be an address", field="email")
    pref, _ = NotificationPreference.objects.update_or_create(
        user_id=user_id,
        defaults={
            "email_enabled": email_enabled,
            "email": email,
            "quiet_start": quiet_start,
            "quiet_end": quiet_end,
            "timezone": tz or "UTC",
            "updated_at": timezone.now(),
        },
    )
    return pref


def task_watch_set(actor: Actor, task_id: str, *, watch: bool) -> bool:
    """Start or stop watching a task (its watchers hear of its notifications); returns whether
    the person watches it now."""
    task = task_get(actor, task_id)
    can_watch_task(actor, task)
    user_id = person_of(actor)
    if watch:
        TaskWatch.objects.bulk_create(
            [TaskWatch(task=task, user_id=user_id, created_at=timezone.now())],
            ignore_conflicts=True,
        )
    else:
        TaskWatch.objects.filter(task=task, user_id=user_id).delete()
    return watch
