"""The scheduler (the sweeper's part): each due slot claimed by inserting its row, then decided
in a transaction of its own (started, skipped or buffered), the schedule's cursor moved on;
buffered slots started once the live task has ended. Safe in any number of processes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import SCHEDULER, Actor, actor_for_agent, actor_for_user
from runtime.crashpoints import crash_point
from runtime.errors import DomainError, InvalidInput
from runtime.models import Schedule, ScheduleRun, Task
from runtime.models.schedules import Overlap, RunStatus, SkipReason
from runtime.policy import can_create_task
from runtime.rules.statuses import TaskCondition
from runtime.schedule_owners import owner_inactive_reason, owner_pause_txn
from runtime.schedules.specs import template_spec
from runtime.schedules.timing import slot_after, slots_between, timing_of
from runtime.tasks import task_create_txn, task_spec_check

# Slots one sweep decides per schedule (the rest wait for the next sweep), and slots one
# transaction records as skipped: bounded work after a long downtime.
SLOTS_PER_SWEEP = 200


SKIPS_PER_TRANSACTION = 500


SCHEDULES_PER_SWEEP = 500


def _owner(schedule: Schedule) -> Actor:
    """The actor the schedule's tasks are created for: its agent, or the user who owns it."""
    if schedule.agent is not None:
        return actor_for_agent(schedule.agent.pk, schedule.agent.name)
    user = get_user_model().objects.filter(pk=schedule.user_id or 0).first()
    if user is None or not user.is_active:
        raise InvalidInput("the schedule's owner is no longer an active user")
    return actor_for_user(int(str(user.pk)), user.get_username())


def slot_claim_txn(
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


def slot_start_txn(
    schedule: Schedule, run: ScheduleRun, now: datetime, *, journal_actor: str
) -> Task:
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
                run = slot_claim_txn(
                    schedule, read.slot, kind=ScheduleRun.SCHEDULED, actor=SCHEDULER
                )
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
            slot_start_txn(schedule, run, now, journal_actor=SCHEDULER)
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
