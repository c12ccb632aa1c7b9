"""Schedules (issue 26 point 2): tasks started at the times a cron expression or an interval
names. Services (writes) and selectors (reads).

How a slot starts exactly once: the schedule's cursor (``next_slot_at``) names the earliest slot
not yet decided. Whoever decides a slot first inserts its ScheduleRun row, unique on (schedule,
slot time): a second sweeper (or the same one after a restart) that read the same cursor fails
that insert and decides nothing. Only then is the schedule row locked, to recheck that the
cursor, the version and the paused flag are still what the decision was made on, and moved on;
a change in between rolls the claim back. Every writer takes its locks in that order (slot rows
first, then the schedule row), and the ones that touch no new slot (edit, pause, resume, a
buffered slot's start, a token's revocation) lock the schedule row first and insert nothing,
so no two wait on each other in a cycle. The schedule row is locked FOR NO KEY UPDATE (its key
never changes), so the key-share locks that rows referencing it take (slots, tasks, journal
entries) never wait on it.

Each due slot is decided in a transaction of its own: started (a task created through
runtime.tasks' own path: the same validation, budgets and deadline as ``POST /tasks``), skipped
(``overlap``, ``missed`` when it is older than the catch-up window, ``paused``, ``refused`` when
the runtime would not create the task) or ``buffered`` (overlap ``buffer_one``: one slot waits
for the live task to end, and the sweeper starts it then). A schedule whose owner can no
longer act (runtime.schedule_owners) is paused by the decision instead, which starts nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadDateError
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from runtime.actors import SCHEDULER, Actor, actor_for_agent, actor_for_user
from runtime.crashpoints import crash_point
from runtime.errors import Conflict, DomainError, InvalidInput, NotFound, TransitionRejected
from runtime.models import Schedule, ScheduleEvent, ScheduleRun, Task
from runtime.models.schedules import Overlap, RunStatus, SkipReason
from runtime.policy import (
    can_create_schedule,
    can_create_task,
    can_manage_schedule,
    schedule_scope,
)
from runtime.rules.statuses import TaskCondition
from runtime.schedule_owners import owner_can_act_check, owner_inactive_reason, owner_pause_txn
from runtime.tasks import TaskSpec, task_create_txn, task_spec_check

MIN_INTERVAL_SECONDS = 60
MAX_INTERVAL_SECONDS = 366 * 24 * 3600
# A window shorter than the sweeper's period would miss slots the sweeper was merely late for.
MIN_CATCH_UP_SECONDS = 10
MAX_CATCH_UP_SECONDS = 366 * 24 * 3600
DEFAULT_CATCH_UP_SECONDS = 60
# Slots one sweep decides per schedule (the rest wait for the next sweep), and slots one
# transaction records as skipped: bounded work after a long downtime.
SLOTS_PER_SWEEP = 200
SKIPS_PER_TRANSACTION = 500
SCHEDULES_PER_SWEEP = 500
# The cursor of a cron expression that matches no later time.
NEVER = datetime(9999, 1, 1, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CRON_MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
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


@dataclass(frozen=True)
class Timing:
    """When a schedule's slots fall: a cron expression read in ``timezone``, or every
    ``interval_seconds`` counted from the Unix epoch (so slots do not drift with restarts)."""

    cron: str
    interval_seconds: int | None
    timezone: str


def timing_of(schedule: Schedule) -> Timing:
    return Timing(schedule.cron, schedule.interval_seconds, schedule.timezone)


# --- checks (pure) ------------------------------------------------------------------------


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


# --- slots (pure) -------------------------------------------------------------------------


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


# --- reads --------------------------------------------------------------------------------


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


# --- changes by people and agents -----------------------------------------------------------


def _journal_txn(
    schedule: Schedule, type: str, actor: str, now: datetime, data: dict[str, Any]
) -> None:
    ScheduleEvent.objects.create(
        schedule=schedule, type=type, at=now, actor=actor, version=schedule.version, data=data
    )


def schedule_create(actor: Actor, spec: ScheduleSpec, *, now: datetime | None = None) -> Schedule:
    """Create a schedule owned by ``actor`` (its tasks are the actor's), journaled as
    ``schedule.created``. Preconditions: ``spec`` was parsed by the transport (types checked);
    the domain's limits are checked here (400 naming the field)."""
    can_create_schedule(actor)
    now = now or timezone.now()
    timing = timing_check(spec.cron, spec.interval_seconds, spec.timezone, now)
    overlap_check(spec.overlap)
    catch_up_check(spec.catch_up_seconds)
    template = template_check(spec.task)
    with transaction.atomic():
        schedule = Schedule.objects.create(
            agent_id=actor.agent_id if actor.kind == "agent" else None,
            user_id=actor.user_id if actor.kind == "user" else None,
            created_by=actor.label,
            cron=timing.cron,
            interval_seconds=timing.interval_seconds,
            timezone=timing.timezone,
            template=template,
            overlap=spec.overlap,
            catch_up_seconds=spec.catch_up_seconds,
            paused=spec.paused,
            next_slot_at=slot_after(timing, now),
            created_at=now,
            updated_at=now,
        )
        _journal_txn(schedule, "schedule.created", actor.label, now, schedule_definition(schedule))
    return schedule_get(actor, schedule.pk)


def _locked_txn(actor: Actor, schedule_id: str) -> Schedule:
    """The schedule, visible to the actor and locked, with the right to manage it checked on
    the roles held now (inside the caller's transaction)."""
    schedule_get(actor, schedule_id)
    schedule = (
        Schedule.objects.select_for_update(of=("self",), no_key=True)
        .select_related("agent", "user")
        .get(pk=schedule_id)
    )
    can_manage_schedule(actor, schedule)
    return schedule


def _drop_buffered_txn(schedule: Schedule, now: datetime, why: str) -> None:
    ScheduleRun.objects.filter(schedule=schedule, status=RunStatus.BUFFERED).update(
        status=RunStatus.SKIPPED, reason=SkipReason.OVERLAP, detail=why, decided_at=now
    )


def schedule_edit(
    actor: Actor,
    schedule_id: str,
    changes: dict[str, Any],
    *,
    version: int | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Edit a schedule: a new version, journaled as ``schedule.edited`` with what changed.

    ``changes`` holds fields of EDITABLE (``task`` a partial template, merged over the stored
    one and checked whole); giving ``cron`` or ``interval_seconds`` replaces the timing. With
    ``version``, refused (409 state_version_mismatch) unless it is the current one. Tasks
    already started keep what they were started with; a new timing counts from now. No change
    makes no new version. Preconditions: the transport checked types."""
    schedule_changes_check(changes)
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _locked_txn(actor, schedule_id)
        if version is not None and version != schedule.version:
            raise TransitionRejected(
                f"the schedule is at version {schedule.version}, not {version}",
                code="state_version_mismatch",
            )
        before = schedule_definition(schedule)
        cron, interval = schedule.cron, schedule.interval_seconds
        if "cron" in changes or "interval_seconds" in changes:
            cron = changes.get("cron") or ""
            interval = changes.get("interval_seconds")
        timing = timing_check(cron, interval, changes.get("timezone", schedule.timezone), now)
        if "overlap" in changes:
            schedule.overlap = overlap_check(changes["overlap"])
        if "catch_up_seconds" in changes:
            schedule.catch_up_seconds = catch_up_check(changes["catch_up_seconds"])
        if "task" in changes:
            merged = {**schedule.template, **changes["task"]}
            schedule.template = template_check(template_spec(merged))
        timing_changed = timing != timing_of(schedule)
        schedule.cron, schedule.interval_seconds = timing.cron, timing.interval_seconds
        schedule.timezone = timing.timezone
        after = schedule_definition(schedule)
        changed = {k: {"from": before[k], "to": after[k]} for k in after if before[k] != after[k]}
        if not changed:
            return schedule
        if timing_changed:
            schedule.next_slot_at = slot_after(timing, now)
        if before["overlap"] == Overlap.BUFFER_ONE and schedule.overlap != Overlap.BUFFER_ONE:
            _drop_buffered_txn(schedule, now, "the overlap policy changed")
        schedule.version += 1
        schedule.updated_at = now
        schedule.save()
        _journal_txn(schedule, "schedule.edited", actor.label, now, {"changes": changed})
    return schedule


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


def schedule_pause(
    actor: Actor, schedule_id: str, *, reason: str = "", now: datetime | None = None
) -> tuple[Schedule, bool]:
    """Pause: its slots are recorded skipped (``paused``) and nothing starts until resumed.
    Returns the schedule and whether anything changed (pausing a paused schedule does not)."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _locked_txn(actor, schedule_id)
        if schedule.paused:
            return schedule, False
        schedule.paused = True
        schedule.updated_at = now
        schedule.save(update_fields=["paused", "updated_at"])
        _journal_txn(schedule, "schedule.paused", actor.label, now, {"reason": reason})
    return schedule, True


def schedule_resume(
    actor: Actor, schedule_id: str, *, reason: str = "", now: datetime | None = None
) -> tuple[Schedule, bool]:
    """Resume: slots from now on start again. Slots that fell due while it was paused and that
    the sweeper had not yet recorded are passed over (the journal entry names them by their
    range), never started late. Returns the schedule and whether anything changed. Refused
    (409 ``schedule_owner_inactive``) while its owner cannot act, whoever asks."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _locked_txn(actor, schedule_id)
        if not schedule.paused:
            return schedule, False
        owner_can_act_check(schedule, "resuming the schedule")
        data: dict[str, Any] = {"reason": reason}
        if schedule.next_slot_at <= now:
            data["passed_over"] = {"from": schedule.next_slot_at.isoformat(), "to": now.isoformat()}
            schedule.next_slot_at = slot_after(timing_of(schedule), now)
        schedule.paused = False
        schedule.updated_at = now
        schedule.save(update_fields=["paused", "next_slot_at", "updated_at"])
        _journal_txn(schedule, "schedule.resumed", actor.label, now, data)
    return schedule, True


def schedule_trigger(actor: Actor, schedule_id: str, *, now: datetime | None = None) -> ScheduleRun:
    """Start the schedule's task now, whatever its timing, pause and overlap policy say (a
    person or its agent asked for it explicitly): a slot of kind ``manual`` at this moment,
    journaled as ``schedule.triggered``. The task is refused (and nothing recorded) as
    ``POST /tasks`` would refuse it, and (409 ``schedule_owner_inactive``) while the owner
    cannot act."""
    schedule = schedule_get(actor, schedule_id)
    can_manage_schedule(actor, schedule)
    now = now or timezone.now()
    if now.microsecond == 0:
        # Scheduled slots fall on whole seconds: a manual one never takes a slot's time (its
        # claim would then be refused to the sweeper on every sweep).
        now += timedelta(microseconds=1)
    try:
        with transaction.atomic():
            # The claim first, as the sweeper's: slot rows before the schedule row.
            run = _claim_txn(schedule, now, kind=ScheduleRun.MANUAL, actor=actor.label)
            schedule = _locked_txn(actor, schedule_id)
            owner_can_act_check(schedule, "triggering the schedule")
            run.schedule_version = schedule.version
            _start_txn(schedule, run, now, journal_actor=actor.label)
            run.save()
            _journal_txn(
                schedule,
                "schedule.triggered",
                actor.label,
                now,
                {"run": run.pk, "task": run.task_id},
            )
    except IntegrityError:
        # Another slot at this very microsecond: the caller may ask again.
        raise Conflict("another start of this schedule was recorded at the same moment") from None
    return run


# --- the scheduler (the sweeper's part) -----------------------------------------------------


def _owner(schedule: Schedule) -> Actor:
    """The actor the schedule's tasks are created for: its agent, or the user who owns it."""
    if schedule.agent is not None:
        return actor_for_agent(schedule.agent.pk, schedule.agent.name)
    user = get_user_model().objects.filter(pk=schedule.user_id or 0).first()
    if user is None or not user.is_active:
        raise InvalidInput("the schedule's owner is no longer an active user")
    return actor_for_user(int(str(user.pk)), user.get_username())


def _claim_txn(
    schedule: Schedule, slot: datetime, *, kind: str, actor: str, version: int | None = None
) -> ScheduleRun:
    """Insert the slot's row: the claim. Raises IntegrityError when the slot is someone
    else's (committed, or committing: the insert waits for that transaction's end). Its status
    is set by the caller before the transaction commits."""
    run = ScheduleRun(
        schedule_id=schedule.pk,
        slot_time=slot,
        kind=kind,
        status=RunStatus.SKIPPED,
        schedule_version=version or schedule.version,
        actor=actor,
        decided_at=slot,
    )
    with transaction.atomic():
        run.save(force_insert=True)
    return run


def _start_txn(schedule: Schedule, run: ScheduleRun, now: datetime, *, journal_actor: str) -> Task:
    """Create the slot's task for the schedule's owner, by the path every task takes
    (runtime.tasks: the same checks, budget ledger and deadline), and mark the run started."""
    owner = _owner(schedule)
    can_create_task(owner)
    checked = task_spec_check(template_spec(schedule.template))
    task = task_create_txn(
        owner, checked, now=now, journal_actor=journal_actor, schedule_id=schedule.pk
    )
    run.status, run.reason, run.task, run.decided_at = RunStatus.STARTED, "", task, now
    return task


def _live_task_exists(schedule_id: str) -> bool:
    return (
        Task.objects.filter(schedule_id=schedule_id)
        .exclude(condition=TaskCondition.TERMINAL)
        .exists()
    )


class _Moved(Exception):
    """The schedule changed between the read a decision was made on and its lock."""


@dataclass(frozen=True)
class _Read:
    """What a slot's decision is made on (read without a lock, rechecked under it)."""

    slot: datetime
    version: int
    paused: bool
    catch_up_seconds: int

    def matches(self, schedule: Schedule) -> bool:
        return (schedule.next_slot_at, schedule.version, schedule.paused) == (
            self.slot,
            self.version,
            self.paused,
        )


def _skip_passed(schedule_id: str, read: _Read, now: datetime) -> int:
    """Record as skipped, in one transaction, the run of due slots from the cursor that are
    paused, or missed (older than the catch-up window); move the cursor past them. Returns
    how many, or 0 when another sweeper (or an edit) got there first."""
    try:
        with transaction.atomic():
            schedule = Schedule.objects.get(pk=schedule_id)
            timing = timing_of(schedule)
            # Paused: every due slot. Missed: those strictly older than the window (a slot at
            # its very edge is still run).
            until = (
                now
                if read.paused
                else now - timedelta(seconds=read.catch_up_seconds, microseconds=1)
            )
            slots = slots_between(timing, read.slot, until, SKIPS_PER_TRANSACTION)
            if not slots:
                return 0
            reason = SkipReason.PAUSED if read.paused else SkipReason.MISSED
            detail = (
                "the schedule was paused"
                if read.paused
                else f"older than the catch-up window ({read.catch_up_seconds} s)"
            )
            with transaction.atomic():
                ScheduleRun.objects.bulk_create(
                    ScheduleRun(
                        schedule_id=schedule_id,
                        slot_time=slot,
                        status=RunStatus.SKIPPED,
                        reason=reason,
                        detail=detail,
                        schedule_version=read.version,
                        actor=SCHEDULER,
                        decided_at=now,
                    )
                    for slot in slots
                )
            locked = Schedule.objects.select_for_update(no_key=True).get(pk=schedule_id)
            if not read.matches(locked):
                raise _Moved
            locked.next_slot_at = slot_after(timing, slots[-1])
            locked.save(update_fields=["next_slot_at"])
    except (IntegrityError, _Moved):
        return 0
    return len(slots)


def _slot_decide(schedule_id: str, read: _Read, now: datetime) -> str | None:
    """Decide the due slot ``read.slot`` within the catch-up window of an unpaused schedule,
    in a transaction of its own: claim it, then start its task or skip or buffer it by the
    overlap policy; or, when its owner can no longer act, skip it and pause the schedule.
    Returns the run's status, or None when the slot was someone else's."""
    try:
        with transaction.atomic():
            schedule = Schedule(pk=schedule_id, version=read.version)
            try:
                run = _claim_txn(schedule, read.slot, kind=ScheduleRun.SCHEDULED, actor=SCHEDULER)
            except IntegrityError:
                return None
            crash_point("schedule.slot_claimed")
            schedule = (
                Schedule.objects.select_for_update(of=("self",), no_key=True)
                .select_related("agent", "user")
                .get(pk=schedule_id)
            )
            if not read.matches(schedule):
                raise _Moved
            run.decided_at = now
            # Asked under the schedule's lock, in the transaction that starts the task: a
            # revocation that commits after this read waits for the lock, and pauses after.
            inactive = owner_inactive_reason(schedule)
            crash_point("schedule.owner_checked")
            live = inactive is None and _live_task_exists(schedule_id)
            if inactive is not None:
                owner_pause_txn(schedule, inactive, now, slot=read.slot.isoformat())
                run.reason, run.detail = SkipReason.PAUSED, inactive
            elif live and schedule.overlap == Overlap.SKIP:
                run.reason, run.detail = SkipReason.OVERLAP, "an earlier run's task is still live"
            elif live and schedule.overlap == Overlap.BUFFER_ONE:
                if ScheduleRun.objects.filter(
                    schedule_id=schedule_id, status=RunStatus.BUFFERED
                ).exists():
                    run.reason = SkipReason.OVERLAP
                    run.detail = "an earlier run's task is still live and a slot already waits"
                else:
                    run.status = RunStatus.BUFFERED
            else:
                _start_or_refuse_txn(schedule, run, now)
            run.save()
            schedule.next_slot_at = slot_after(timing_of(schedule), read.slot)
            schedule.save(update_fields=["next_slot_at"])
    except _Moved:
        return None
    return run.status


def _start_or_refuse_txn(schedule: Schedule, run: ScheduleRun, now: datetime) -> None:
    """Start the run's task; a refusal of the runtime (a template today's rules refuse, an
    owner gone) records the slot skipped with the reason instead of failing every sweep."""
    try:
        with transaction.atomic():
            _start_txn(schedule, run, now, journal_actor=SCHEDULER)
    except DomainError as exc:
        run.status, run.task = RunStatus.SKIPPED, None
        run.reason, run.detail = SkipReason.REFUSED, exc.message[:2000]


def _buffered_start(schedule_id: str, now: datetime) -> bool:
    """Start the schedule's buffered slot once no task of it is live (and it is not paused).
    Locks the schedule row first: the buffered row is never a new slot."""
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(of=("self",), no_key=True)
            .select_related("agent", "user")
            .filter(pk=schedule_id)
            .first()
        )
        if schedule is None or schedule.paused:
            return False
        run = (
            ScheduleRun.objects.select_for_update()
            .filter(schedule_id=schedule_id, status=RunStatus.BUFFERED)
            .first()
        )
        if run is None or _live_task_exists(schedule_id):
            return False
        inactive = owner_inactive_reason(schedule)
        if inactive is not None:
            # Paused instead; the slot waits, as a paused schedule's buffered slot does.
            owner_pause_txn(schedule, inactive, now, slot=run.slot_time.isoformat())
            return False
        # Started by the schedule as it stands now (an edit since it was buffered applies).
        run.schedule_version = schedule.version
        _start_or_refuse_txn(schedule, run, now)
        run.decided_at = now
        run.save()
    return run.status == RunStatus.STARTED


def schedule_sweep_one(schedule_id: str, now: datetime) -> dict[str, int]:
    """Decide the schedule's due slots (at most SLOTS_PER_SWEEP), oldest first, each in its own
    transaction. Safe to run in any number of processes at once."""
    counts = {"started": 0, "skipped": 0, "buffered": 0}
    for _ in range(SLOTS_PER_SWEEP):
        row = (
            Schedule.objects.filter(pk=schedule_id)
            .values_list("next_slot_at", "version", "paused", "catch_up_seconds")
            .first()
        )
        if row is None or row[0] > now:
            break
        read = _Read(*row)
        crash_point("schedule.slot_read")
        if read.paused or read.slot < now - timedelta(seconds=read.catch_up_seconds):
            counts["skipped"] += _skip_passed(schedule_id, read, now)
            continue
        status = _slot_decide(schedule_id, read, now)
        if status is not None:
            counts[status] += 1
    return counts


def schedules_sweep(now: datetime | None = None) -> dict[str, int]:
    """The sweeper's pass over schedules: first buffered slots whose live task has ended, then
    every due slot. Returns counts by decision."""
    now = now or timezone.now()
    counts = {"started": 0, "skipped": 0, "buffered": 0}
    waiting = list(
        ScheduleRun.objects.filter(status=RunStatus.BUFFERED, schedule__paused=False)
        .order_by("slot_time")
        .values_list("schedule_id", flat=True)[:SCHEDULES_PER_SWEEP]
    )
    for schedule_id in waiting:
        counts["started"] += int(_buffered_start(schedule_id, now))
    due = list(
        Schedule.objects.filter(next_slot_at__lte=now)
        .order_by("next_slot_at")
        .values_list("pk", flat=True)[:SCHEDULES_PER_SWEEP]
    )
    for schedule_id in due:
        for key, n in schedule_sweep_one(schedule_id, now).items():
            counts[key] += n
    return counts
