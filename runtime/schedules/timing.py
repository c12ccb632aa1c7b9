"""When a schedule's slots fall (pure): its timing checked (a cron expression or an interval,
an IANA time zone) and the slots it names. croniter is called here only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadDateError

from runtime.errors import InvalidInput
from runtime.models import Schedule
from runtime.models.schedules import Overlap

MIN_INTERVAL_SECONDS = 60


MAX_INTERVAL_SECONDS = 366 * 24 * 3600


# A window shorter than the sweeper's period would miss slots the sweeper was merely late for.
MIN_CATCH_UP_SECONDS = 10


MAX_CATCH_UP_SECONDS = 366 * 24 * 3600


DEFAULT_CATCH_UP_SECONDS = 60


# The cursor of a cron expression that matches no later time.
NEVER = datetime(9999, 1, 1, tzinfo=UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_CRON_MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)


@dataclass(frozen=True)
class Timing:
    """When a schedule's slots fall: a cron expression read in ``timezone``, or every
    ``interval_seconds`` counted from the Unix epoch (so slots do not drift with restarts)."""

    cron: str
    interval_seconds: int | None
    timezone: str


def timing_of(schedule: Schedule) -> Timing:
    return Timing(schedule.cron, schedule.interval_seconds, schedule.timezone)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"timezone {name!r} is not an IANA time zone (e.g. Europe/Paris)", field="timezone"
        ) from None


def timing_check(cron: str, interval_seconds: int | None, zone: str, now: datetime) -> Timing:
    """A schedule's timing, checked: exactly one of a cron expression (five fields, or a macro
    such as @daily) and an interval, and an IANA time zone. 400 naming the field. Pure."""
    cron = cron.strip()
    _zone(zone)
    if bool(cron) == (interval_seconds is not None):
        raise InvalidInput("give exactly one of cron and interval_seconds", field="cron")
    if interval_seconds is not None:
        if not MIN_INTERVAL_SECONDS <= interval_seconds <= MAX_INTERVAL_SECONDS:
            raise InvalidInput(
                f"interval_seconds must be between {MIN_INTERVAL_SECONDS} and "
                f"{MAX_INTERVAL_SECONDS}",
                field="interval_seconds",
            )
        return Timing("", interval_seconds, zone)
    if cron.startswith("@"):
        if cron not in _CRON_MACROS:
            raise InvalidInput(
                f"cron macro {cron!r} is not one of {', '.join(sorted(_CRON_MACROS))}",
                field="cron",
            )
    elif len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise InvalidInput(
            f"cron {cron!r} is not a cron expression (five fields: minute hour day month weekday)",
            field="cron",
        )
    timing = Timing(cron, None, zone)
    if slot_after(timing, now) >= NEVER:
        raise InvalidInput(f"cron {cron!r} matches no time to come", field="cron")
    return timing


def overlap_check(overlap: str) -> str:
    if overlap not in Overlap.ALL:
        raise InvalidInput(f"overlap must be one of {', '.join(Overlap.ALL)}", field="overlap")
    return overlap


def catch_up_check(seconds: int) -> int:
    if not MIN_CATCH_UP_SECONDS <= seconds <= MAX_CATCH_UP_SECONDS:
        raise InvalidInput(
            f"catch_up_seconds must be between {MIN_CATCH_UP_SECONDS} and {MAX_CATCH_UP_SECONDS}",
            field="catch_up_seconds",
        )
    return seconds


def slot_after(timing: Timing, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (UTC), or NEVER. Pure. A cron expression is read
    in the schedule's time zone: a local time that a clock change skips runs at the first
    moment after it (croniter's reading)."""
    if timing.interval_seconds:
        step = timedelta(seconds=timing.interval_seconds)
        return _EPOCH + ((after - _EPOCH) // step + 1) * step
    local = after.astimezone(ZoneInfo(timing.timezone))
    for _ in range(3):
        try:
            found = croniter(timing.cron, local).get_next(datetime).astimezone(UTC)
        except CroniterBadDateError:
            return NEVER
        if found > after:
            return found
        # Around a clock change a local reading can land on or before ``after``: a cursor that
        # did not move would claim the same slot forever. Read again a minute later.
        local += timedelta(minutes=1)
    return NEVER


def slots_between(timing: Timing, first: datetime, until: datetime, limit: int) -> list[datetime]:
    """``first`` and the slots after it up to ``until`` (inclusive), at most ``limit``. Pure."""
    slots: list[datetime] = []
    slot = first
    while slot <= until and len(slots) < limit:
        slots.append(slot)
        slot = slot_after(timing, slot)
    return slots


def schedule_next_slots(schedule: Schedule, count: int = 3) -> list[datetime]:
    """The next ``count`` slots from the cursor (a due slot the sweeper has not decided yet
    included). Pure."""
    if schedule.next_slot_at >= NEVER:
        return []
    slots = [schedule.next_slot_at]
    while len(slots) < count:
        following = slot_after(timing_of(schedule), slots[-1])
        if following >= NEVER:
            break
        slots.append(following)
    return slots
