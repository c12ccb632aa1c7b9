"""Changes to schedules by people and agents: create, edit (a new version), pause, resume and
trigger, each journaled, each in its own transaction, the schedule row locked FOR NO KEY
UPDATE (a trigger claims its slot first, as the sweeper does: slot rows before the schedule
row)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import Conflict, TransitionRejected
from runtime.models import Schedule, ScheduleEvent, ScheduleRun
from runtime.models.schedules import Overlap, RunStatus, SkipReason
from runtime.policy_features import can_create_schedule, can_manage_schedule
from runtime.schedule_owners import owner_can_act_check
from runtime.schedules.firing import slot_claim_txn, slot_start_txn
from runtime.schedules.specs import (
    ScheduleSpec,
    schedule_changes_check,
    schedule_definition,
    template_check,
    template_spec,
)
from runtime.schedules.timing import (
    catch_up_check,
    overlap_check,
    slot_after,
    timing_check,
    timing_of,
)
from runtime.selectors.schedules import schedule_get


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
            run = slot_claim_txn(schedule, now, kind=ScheduleRun.MANUAL, actor=actor.label)
            schedule = _locked_txn(actor, schedule_id)
            owner_can_act_check(schedule, "triggering the schedule")
            run.schedule_version = schedule.version
            slot_start_txn(schedule, run, now, journal_actor=actor.label)
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
