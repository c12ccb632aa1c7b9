"""Schedules (issue 26 point 2): each slot starts once, however many sweepers race for it or
restart; a slot missed by more than the catch-up window is recorded as skipped, not run; the
overlap policies (skip, buffer_one, allow) hold across a restart of the sweeper (a fresh
sweep called after a simulated downtime with its own ``now``); a paused schedule starts
nothing; an edit is a new version and tasks already started keep theirs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runtime.cancellation import task_cancel
from runtime.errors import InvalidInput, TransitionRejected
from runtime.models import Event, Schedule, ScheduleEvent, ScheduleRun, Task
from runtime.rules.statuses import TaskCondition
from runtime.schedules.firing import schedule_sweep_one, schedules_sweep
from runtime.schedules.services import (
    schedule_create,
    schedule_edit,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
)
from runtime.schedules.specs import ScheduleSpec
from runtime.schedules.timing import Timing, slot_after, timing_check
from runtime.tasks import TaskSpec
from tests import factories
from tests.concurrency import barrier_at, gate_at, in_thread, wait_until_blocked_on_a_lock

MINUTE = timedelta(seconds=60)
# A whole minute in the past, so interval slots (counted from the epoch) fall on it.
BASE = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _schedule(owner, *, overlap="skip", catch_up=3600, interval=60, **task) -> Schedule:
    """An interval schedule whose cursor is set to BASE (its first slot), as if created just
    before it."""
    task.setdefault("name", "nightly report")
    schedule = schedule_create(
        owner.actor,
        ScheduleSpec(
            task=TaskSpec(**task),
            interval_seconds=interval,
            overlap=overlap,
            catch_up_seconds=catch_up,
        ),
        now=BASE - timedelta(seconds=1),
    )
    assert schedule.next_slot_at == BASE
    return schedule


def _runs(schedule: Schedule) -> list[tuple[str, str, str]]:
    """(slot as HH:MM, status, reason) of every decided slot, oldest first."""
    return [
        (r.slot_time.strftime("%H:%M"), r.status, r.reason)
        for r in ScheduleRun.objects.filter(schedule=schedule).order_by("slot_time")
    ]


def _end(owner, task_id: str) -> None:
    task_cancel(owner.actor, task_id, reason="done")
    assert Task.objects.get(pk=task_id).condition == TaskCondition.TERMINAL


# --- timing (pure) ----------------------------------------------------------------------------


def test_interval_slots_count_from_the_epoch_and_come_strictly_after():
    every_5 = Timing("", 300, "UTC")
    assert slot_after(every_5, BASE) == BASE + timedelta(minutes=5)
    assert slot_after(every_5, BASE - timedelta(microseconds=1)) == BASE
    assert slot_after(every_5, BASE + timedelta(seconds=1)) == BASE + timedelta(minutes=5)


def test_cron_is_read_in_the_schedules_time_zone_across_a_clock_change():
    # 02:30 in Paris does not exist on 2026-03-29 (clocks go 02:00 -> 03:00): croniter runs it
    # at the first moment after; on the next days it is 02:30 local, 00:30 UTC (summer time).
    daily = Timing("30 2 * * *", None, "Europe/Paris")
    start = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)
    first = slot_after(daily, start)
    second = slot_after(daily, first)
    assert first == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert second == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)
    winter = slot_after(daily, datetime(2026, 1, 10, tzinfo=UTC))
    assert winter == datetime(2026, 1, 10, 1, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "interval", "zone", "field"),
    [
        ("61 * * * *", None, "UTC", "cron"),
        ("* * * * * *", None, "UTC", "cron"),  # seconds: not a five-field expression
        ("@reboot", None, "UTC", "cron"),
        ("0 0 30 2 *", None, "UTC", "cron"),  # 30 February: never
        ("0 * * * *", 60, "UTC", "cron"),  # both
        ("", None, "UTC", "cron"),  # neither
        ("", 59, "UTC", "interval_seconds"),
        ("0 * * * *", None, "Mars/Olympus_Mons", "timezone"),
        ("0 * * * *", None, "../etc/passwd", "timezone"),
    ],
)
def test_timing_refusals_name_the_field(cron, interval, zone, field):
    with pytest.raises(InvalidInput) as refused:
        timing_check(cron, interval, zone, BASE)
    assert refused.value.details["field"] == field


# --- slots decided by the sweeper -------------------------------------------------------------


@pytest.mark.django_db
def test_a_due_slot_starts_one_task_through_the_task_path_and_only_once():
    owner = factories.agent()
    schedule = _schedule(owner, budget={"cost_cents": 500}, deadline_seconds=600, input={"k": 1})
    assert schedules_sweep(BASE - timedelta(seconds=1))["started"] == 0  # not due yet

    assert schedules_sweep(BASE + timedelta(seconds=2))["started"] == 1
    task = Task.objects.get(schedule=schedule)
    # The owner's task, with the template's input, budget ledger and deadline from its start.
    assert (task.agent_id, task.name, task.input) == (
        owner.actor.agent_id,
        "nightly report",
        {"k": 1},
    )
    assert task.budget == {"cost_cents": 500}
    assert task.deadline == BASE + timedelta(seconds=2) + timedelta(seconds=600)
    created = Event.objects.get(task=task, type="task.created")
    assert created.actor == "system:scheduler"
    assert created.data["schedule"] == schedule.pk
    run = ScheduleRun.objects.get(schedule=schedule)
    assert (run.status, run.task_id, run.slot_time, run.schedule_version) == (
        "started",
        task.pk,
        BASE,
        1,
    )
    # The same moment swept again (a second sweeper, or this one restarted): nothing more.
    assert schedules_sweep(BASE + timedelta(seconds=2)) == {
        "started": 0,
        "skipped": 0,
        "buffered": 0,
    }
    assert Task.objects.filter(schedule=schedule).count() == 1
    assert Schedule.objects.get(pk=schedule.pk).next_slot_at == BASE + MINUTE


@pytest.mark.django_db
def test_after_a_downtime_slots_beyond_the_catch_up_window_are_recorded_skipped_not_run():
    owner = factories.agent()
    # Every minute, allowed to overlap, a window of two and a half minutes.
    schedule = _schedule(owner, overlap="allow", catch_up=150)
    # The sweeper was down from before 12:00 until 12:10:30; it restarts and sweeps.
    after_downtime = BASE + timedelta(minutes=10, seconds=30)
    counts = schedules_sweep(after_downtime)

    # 12:00 .. 12:07 are older than 12:08:00 (now - 150 s): missed. 12:08 .. 12:10 start.
    assert counts == {"started": 3, "skipped": 8, "buffered": 0}
    runs = _runs(schedule)
    assert runs[:8] == [(f"12:0{m}", "skipped", "missed") for m in range(8)]
    assert runs[8:] == [(f"12:{m:02}", "started", "") for m in (8, 9, 10)]
    assert Task.objects.filter(schedule=schedule).count() == 3
    # Restarted again at the same moment: every slot is decided already.
    assert schedules_sweep(after_downtime)["started"] == 0
    assert schedules_sweep(BASE + timedelta(minutes=11, seconds=1))["started"] == 1
    assert Task.objects.filter(schedule=schedule).count() == 4


@pytest.mark.django_db
def test_overlap_skip_records_the_slot_skipped_while_a_task_is_live_across_a_restart():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="skip")
    assert schedules_sweep(BASE + timedelta(seconds=1))["started"] == 1
    first = Task.objects.get(schedule=schedule)
    # A fresh sweep a minute later (a restarted sweeper): the first task is still live.
    assert schedules_sweep(BASE + MINUTE + timedelta(seconds=1))["skipped"] == 1
    _end(owner, first.pk)
    assert schedules_sweep(BASE + 2 * MINUTE + timedelta(seconds=1))["started"] == 1
    assert _runs(schedule) == [
        ("12:00", "started", ""),
        ("12:01", "skipped", "overlap"),
        ("12:02", "started", ""),
    ]


@pytest.mark.django_db
def test_overlap_buffer_one_keeps_one_slot_waiting_and_starts_it_when_the_live_task_ends():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="buffer_one")
    schedules_sweep(BASE + timedelta(seconds=1))
    first = Task.objects.get(schedule=schedule)
    # Two more slots while it runs, each swept by a fresh call: one waits, the other is skipped.
    assert schedules_sweep(BASE + MINUTE + timedelta(seconds=1))["buffered"] == 1
    assert schedules_sweep(BASE + 2 * MINUTE + timedelta(seconds=1))["skipped"] == 1
    assert Task.objects.filter(schedule=schedule).count() == 1
    # Nothing starts while the first is live, however often the sweeper comes.
    assert schedules_sweep(BASE + 2 * MINUTE + timedelta(seconds=20))["started"] == 0

    _end(owner, first.pk)
    counts = schedules_sweep(BASE + 2 * MINUTE + timedelta(seconds=30))
    assert counts["started"] == 1
    assert _runs(schedule) == [
        ("12:00", "started", ""),
        ("12:01", "started", ""),  # the buffered slot, started once the first task ended
        ("12:02", "skipped", "overlap"),
    ]
    second = ScheduleRun.objects.get(schedule=schedule, slot_time=BASE + MINUTE)
    assert second.task is not None and second.task.condition != TaskCondition.TERMINAL
    # It is live now: the next slot waits for it in turn.
    assert schedules_sweep(BASE + 3 * MINUTE + timedelta(seconds=1))["buffered"] == 1


@pytest.mark.django_db
def test_a_paused_schedule_starts_nothing_and_resuming_does_not_start_what_it_passed_over():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="allow")
    schedule_pause(owner.actor, schedule.pk, reason="maintenance", now=BASE)
    counts = schedules_sweep(BASE + 3 * MINUTE + timedelta(seconds=1))
    assert counts == {"started": 0, "skipped": 4, "buffered": 0}
    assert {status for _, status, _ in _runs(schedule)} == {"skipped"}
    assert {reason for _, _, reason in _runs(schedule)} == {"paused"}
    assert not Task.objects.filter(schedule=schedule).exists()

    # Paused again over a downtime nobody swept: resuming passes over those slots.
    resumed_at = BASE + 10 * MINUTE + timedelta(seconds=5)
    schedule, changed = schedule_resume(owner.actor, schedule.pk, now=resumed_at)
    assert changed and schedule.next_slot_at == BASE + 11 * MINUTE
    assert schedules_sweep(resumed_at)["started"] == 0
    assert schedules_sweep(BASE + 11 * MINUTE + timedelta(seconds=1))["started"] == 1
    journal = list(ScheduleEvent.objects.filter(schedule=schedule).order_by("id"))
    assert [(e.type, e.actor) for e in journal] == [
        ("schedule.created", owner.actor.label),
        ("schedule.paused", owner.actor.label),
        ("schedule.resumed", owner.actor.label),
    ]
    assert journal[2].data["passed_over"]["from"].startswith("2026-06-01T12:04:00")


@pytest.mark.django_db
def test_an_edit_is_a_new_version_and_tasks_already_started_keep_theirs():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="allow", input={"v": 1})
    schedules_sweep(BASE + timedelta(seconds=1))
    edited = schedule_edit(
        owner.actor, schedule.pk, {"task": {"input": {"v": 2}}}, version=1, now=BASE
    )
    assert edited.version == 2 and edited.template["name"] == "nightly report"
    schedules_sweep(BASE + MINUTE + timedelta(seconds=1))
    started = list(Task.objects.filter(schedule=schedule).order_by("created_at"))
    assert [t.input for t in started] == [{"v": 1}, {"v": 2}]
    versions = ScheduleRun.objects.filter(schedule=schedule).order_by("slot_time")
    assert [r.schedule_version for r in versions] == [1, 2]
    event = ScheduleEvent.objects.get(schedule=schedule, type="schedule.edited")
    assert event.actor == owner.actor.label and event.version == 2
    assert event.data["changes"]["task"]["from"]["input"] == {"v": 1}
    # An edit based on an older version is refused; one changing nothing makes no version.
    with pytest.raises(TransitionRejected) as stale:
        schedule_edit(owner.actor, schedule.pk, {"overlap": "skip"}, version=1)
    assert stale.value.code == "state_version_mismatch"
    same = schedule_edit(owner.actor, schedule.pk, {"overlap": "allow"})
    assert same.version == 2


@pytest.mark.django_db
def test_a_template_the_runtime_refuses_at_start_is_recorded_skipped_with_the_reason():
    admin = factories.console_user("admin")
    schedule = _schedule(admin, overlap="allow")
    # Stored before today's rules refused it (an owner who can no longer act pauses the
    # schedule instead: tests/runtime/test_schedule_owners.py).
    Schedule.objects.filter(pk=schedule.pk).update(
        template={**schedule.template, "deadline_seconds": 0}
    )
    assert schedules_sweep(BASE + timedelta(seconds=1))["skipped"] == 1
    run = ScheduleRun.objects.get(schedule=schedule)
    assert (run.status, run.reason) == ("skipped", "refused")
    assert "deadline_seconds" in run.detail
    assert not Task.objects.exists() and not Schedule.objects.get(pk=schedule.pk).paused


# --- two sweepers racing one slot (real concurrent transactions) ------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_sweepers_racing_the_same_due_slot_start_one_task():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="allow")
    now = BASE + timedelta(seconds=3)

    # Both read the cursor (12:00, due) before either claims it.
    with barrier_at("schedule.slot_read", 2):
        racers = [
            in_thread(lambda: schedule_sweep_one(schedule.pk, now), f"sweeper-{n}")
            for n in range(2)
        ]
        for thread, _ in racers:
            thread.join(30)
    results = [future.result(timeout=1) for _, future in racers]
    assert sorted(r["started"] for r in results) == [0, 1]
    assert Task.objects.filter(schedule=schedule).count() == 1
    assert _runs(schedule) == [("12:00", "started", "")]
    assert Schedule.objects.get(pk=schedule.pk).next_slot_at == BASE + MINUTE


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_claim_is_the_slots_unique_row_a_second_sweeper_waits_on_then_yields():
    """The first sweeper has inserted the slot's row and not committed, and has locked nothing
    else yet: the second waits on that row's unique key (not on the schedule's row), and once
    the first commits it finds the slot taken and starts nothing."""
    owner = factories.agent()
    schedule = _schedule(owner, overlap="allow")
    now = BASE + timedelta(seconds=3)

    with gate_at("schedule.slot_claimed", "first") as gate:
        first, first_done = in_thread(lambda: schedule_sweep_one(schedule.pk, now), "first")
        assert gate.reached.wait(30), "the first sweeper never claimed the slot"
        second, second_done = in_thread(lambda: schedule_sweep_one(schedule.pk, now), "second")
        wait_until_blocked_on_a_lock("the second sweeper waiting on the claimed slot")
        assert not second_done.done()
        gate.release()
        first.join(30)
        second.join(30)
    assert first_done.result(timeout=1)["started"] == 1
    assert second_done.result(timeout=1)["started"] == 0
    assert Task.objects.filter(schedule=schedule).count() == 1
    assert ScheduleRun.objects.filter(schedule=schedule).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_edit_between_a_claim_and_its_lock_neither_waits_nor_lets_the_old_version_start():
    """The sweeper has claimed the 12:00 slot (its row inserted, uncommitted) under version 1;
    an edit to a two-minute interval commits meanwhile without waiting for it (slot rows,
    then the schedule row: the edit locks only the schedule, FOR NO KEY UPDATE); the sweeper
    then finds version 2 under its lock and rolls its claim back: nothing starts."""
    owner = factories.agent()
    schedule = _schedule(owner, overlap="allow")
    now = BASE + timedelta(seconds=3)

    with gate_at("schedule.slot_claimed", "sweeper") as gate:
        sweeper, swept = in_thread(lambda: schedule_sweep_one(schedule.pk, now), "sweeper")
        assert gate.reached.wait(30), "the sweeper never claimed the slot"
        edited, done = in_thread(
            lambda: schedule_edit(owner.actor, schedule.pk, {"interval_seconds": 120}, now=now),
            "editor",
        )
        assert edited.join(30) is None and done.result(timeout=30).version == 2
        gate.release()
        sweeper.join(30)
    assert swept.result(timeout=1)["started"] == 0
    assert not ScheduleRun.objects.exists() and not Task.objects.exists()
    assert Schedule.objects.get(pk=schedule.pk).next_slot_at == BASE + 2 * MINUTE


@pytest.mark.django_db
def test_a_manual_trigger_starts_now_even_when_paused_and_never_takes_a_slots_time():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="skip")
    schedule_pause(owner.actor, schedule.pk, now=BASE - timedelta(seconds=1))
    run = schedule_trigger(owner.actor, schedule.pk, now=BASE)
    assert run.kind == "manual" and run.status == "started" and run.slot_time != BASE
    assert run.task is not None and run.task.schedule_id == schedule.pk
    assert Event.objects.get(task=run.task, type="task.created").actor == owner.actor.label
    schedule_resume(owner.actor, schedule.pk, now=BASE - timedelta(seconds=1))
    # The 12:00 slot is the sweeper's still (its row was not taken by the trigger).
    schedules_sweep(BASE + timedelta(seconds=1))
    assert ScheduleRun.objects.get(schedule=schedule, slot_time=BASE).reason == "overlap"
    event = ScheduleEvent.objects.get(schedule=schedule, type="schedule.triggered")
    assert event.actor == owner.actor.label and event.data["task"] == run.task_id
