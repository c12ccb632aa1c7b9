"""A schedule acts for its owner (issue 33 point 6): once the owner can no longer act (every
token of its agent revoked, its person deactivated or no longer an admin) the schedule starts
nothing more. Revoking an agent's last token pauses its schedules in the revoking transaction;
the sweeper, deciding a slot under the schedule's lock, pauses instead of starting (the
guarantee, also for a deactivated person); each pause is a journal entry naming the scheduler
and the reason. A resume or a trigger is refused (409 ``schedule_owner_inactive``), whoever
asks, until the owner can act again. Time is given (``now=``), never slept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from runtime.actors import SCHEDULER
from runtime.cancellation import task_cancel
from runtime.errors import ScheduleOwnerInactive
from runtime.models import ApiToken, Schedule, ScheduleEvent, ScheduleRun, Task
from runtime.schedule_owners import (
    AGENT_WITHOUT_TOKEN,
    OWNER_DEACTIVATED,
    OWNER_WITHOUT_ROLE,
)
from runtime.schedules.firing import schedule_sweep_one, schedules_sweep
from runtime.schedules.services import schedule_create, schedule_resume, schedule_trigger
from runtime.schedules.specs import ScheduleSpec
from runtime.tasks import TaskSpec
from runtime.tokens import token_issue_for_agent, token_revoke
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock

MINUTE = timedelta(seconds=60)
BASE = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _schedule(owner: factories.Principal, *, overlap: str = "allow") -> Schedule:
    """Every minute from BASE (its first slot), as if created just before it."""
    schedule = schedule_create(
        owner.actor,
        ScheduleSpec(
            task=TaskSpec(name="nightly report"),
            interval_seconds=60,
            overlap=overlap,
            catch_up_seconds=3600,
        ),
        now=BASE - timedelta(seconds=1),
    )
    assert schedule.next_slot_at == BASE
    return schedule


def _token_of(owner: factories.Principal) -> ApiToken:
    return ApiToken.objects.get(prefix=owner.token.split("_")[1])


def _runs(schedule: Schedule) -> list[tuple[str, str, str]]:
    return [
        (r.slot_time.strftime("%H:%M"), r.status, r.reason)
        for r in ScheduleRun.objects.filter(schedule=schedule).order_by("slot_time")
    ]


def _pauses(schedule: Schedule) -> list[ScheduleEvent]:
    return list(ScheduleEvent.objects.filter(schedule=schedule, type="schedule.paused"))


def _paused(schedule: Schedule) -> bool:
    return Schedule.objects.get(pk=schedule.pk).paused


# --- revoking an agent's tokens ----------------------------------------------------------------


@pytest.mark.django_db
def test_revoking_the_agents_only_token_pauses_its_schedule_and_no_due_slot_starts():
    owner = factories.agent()
    schedule = _schedule(owner)
    assert schedules_sweep(BASE + timedelta(seconds=1))["started"] == 1

    assert token_revoke(_token_of(owner).pk, revoked_by="user:boss")

    assert _paused(schedule)
    [pause] = _pauses(schedule)
    assert (pause.actor, pause.data["reason"], pause.data["owner_inactive"]) == (
        SCHEDULER,
        AGENT_WITHOUT_TOKEN,
        True,
    )
    assert (pause.data["token"], pause.data["revoked_by"]) == (_token_of(owner).pk, "user:boss")
    # Eighteen slots fall due; none starts.
    counts = schedules_sweep(BASE + 18 * MINUTE + timedelta(seconds=1))
    assert counts["started"] == 0 and counts["skipped"] == 18
    assert Task.objects.filter(schedule=schedule).count() == 1
    assert {(status, reason) for _, status, reason in _runs(schedule)[1:]} == {
        ("skipped", "paused")
    }


@pytest.mark.django_db
def test_an_agent_with_two_tokens_keeps_its_schedule_running_when_one_is_revoked():
    owner = factories.agent()
    second = token_issue_for_agent(owner.actor.name, "second").token.pk
    schedule = _schedule(owner)

    assert token_revoke(_token_of(owner).pk)

    assert not _paused(schedule) and not _pauses(schedule)
    assert schedules_sweep(BASE + 2 * MINUTE + timedelta(seconds=1))["started"] == 3
    # The second (now its last) revoked: paused, and the next due slot starts nothing.
    assert token_revoke(second)
    assert _paused(schedule) and _pauses(schedule)[0].data["token"] == second
    assert schedules_sweep(BASE + 3 * MINUTE + timedelta(seconds=1))["started"] == 0


@pytest.mark.django_db
def test_the_sweeper_pauses_instead_of_starting_when_the_agent_has_no_live_token():
    """A revocation that did not pause (written outside token_revoke, or two revocations that
    each saw the other's token live): the sweeper's own check, at the slot, is the guarantee."""
    owner = factories.agent()
    schedule = _schedule(owner)
    ApiToken.objects.filter(agent_id=owner.actor.agent_id).update(revoked_at=timezone.now())

    counts = schedules_sweep(BASE + 3 * MINUTE + timedelta(seconds=1))

    assert counts == {"started": 0, "skipped": 4, "buffered": 0}
    assert not Task.objects.exists()
    first = ScheduleRun.objects.get(schedule=schedule, slot_time=BASE)
    assert (first.status, first.reason, first.detail) == ("skipped", "paused", AGENT_WITHOUT_TOKEN)
    assert _paused(schedule)
    [pause] = _pauses(schedule)
    assert (pause.actor, pause.data["reason"]) == (SCHEDULER, AGENT_WITHOUT_TOKEN)
    assert pause.data["slot"].startswith("2026-06-01T12:00:00")


@pytest.mark.django_db
def test_a_buffered_slot_does_not_start_once_the_agent_has_no_live_token():
    owner = factories.agent()
    schedule = _schedule(owner, overlap="buffer_one")
    schedules_sweep(BASE + timedelta(seconds=1))
    assert schedules_sweep(BASE + MINUTE + timedelta(seconds=1))["buffered"] == 1
    ApiToken.objects.filter(agent_id=owner.actor.agent_id).update(revoked_at=timezone.now())
    task_cancel(owner.actor, Task.objects.get(schedule=schedule).pk, reason="done")

    # The live task ended: the buffered slot would start now, but its owner cannot act.
    assert schedules_sweep(BASE + MINUTE + timedelta(seconds=30))["started"] == 0
    assert Task.objects.filter(schedule=schedule).count() == 1
    assert _paused(schedule) and _pauses(schedule)[0].data["reason"] == AGENT_WITHOUT_TOKEN
    assert ScheduleRun.objects.get(schedule=schedule, slot_time=BASE + MINUTE).status == "buffered"


# --- a person who owns a schedule ----------------------------------------------------------------


@pytest.mark.django_db
def test_a_deactivated_owner_pauses_its_schedule_at_the_next_slot_with_no_task_started():
    admin = factories.console_user("admin")
    schedule = _schedule(admin)
    get_user_model().objects.filter(pk=admin.actor.user_id).update(is_active=False)

    assert schedules_sweep(BASE + timedelta(seconds=1)) == {
        "started": 0,
        "skipped": 1,
        "buffered": 0,
    }
    assert not Task.objects.exists()
    assert _runs(schedule) == [("12:00", "skipped", "paused")]
    assert _paused(schedule)
    [pause] = _pauses(schedule)
    assert (pause.actor, pause.data["reason"]) == (SCHEDULER, OWNER_DEACTIVATED)
    assert schedules_sweep(BASE + 5 * MINUTE + timedelta(seconds=1))["started"] == 0

    # Reactivated: another admin may resume it, and its slots start again.
    get_user_model().objects.filter(pk=admin.actor.user_id).update(is_active=True)
    other = factories.console_user("admin")
    _, changed = schedule_resume(other.actor, schedule.pk, now=BASE + 6 * MINUTE)
    assert changed
    assert schedules_sweep(BASE + 7 * MINUTE + timedelta(seconds=1))["started"] == 1


@pytest.mark.django_db
def test_an_owner_who_lost_the_admin_role_pauses_its_schedule():
    admin = factories.console_user("admin")
    schedule = _schedule(admin)
    factories.console_user("operator", admin.actor.name)  # the same person, now an operator

    assert schedules_sweep(BASE + timedelta(seconds=1))["started"] == 0
    assert _paused(schedule)
    assert _pauses(schedule)[0].data["reason"] == OWNER_WITHOUT_ROLE


# --- resume and trigger while the owner cannot act -----------------------------------------------


@pytest.mark.django_db
def test_resume_is_refused_whoever_asks_until_the_agent_has_a_new_token():
    owner = factories.agent()
    admin = factories.console_user("admin")
    schedule = _schedule(owner)
    token_revoke(_token_of(owner).pk)
    later = BASE + 10 * MINUTE

    for who in (admin, owner):
        with pytest.raises(ScheduleOwnerInactive) as refused:
            schedule_resume(who.actor, schedule.pk, now=later)
        assert refused.value.code == "schedule_owner_inactive" and refused.value.status == 409
        assert refused.value.details["reason"] == AGENT_WITHOUT_TOKEN
        assert "new token" in refused.value.message
    assert _paused(schedule)
    assert not ScheduleEvent.objects.filter(schedule=schedule, type="schedule.resumed").exists()

    token_issue_for_agent(owner.actor.name, "replacement")
    schedule, changed = schedule_resume(admin.actor, schedule.pk, now=later)
    assert changed and not schedule.paused
    assert schedules_sweep(later + MINUTE + timedelta(seconds=1))["started"] == 1


@pytest.mark.django_db
def test_a_trigger_is_refused_while_the_owner_cannot_act_and_records_nothing():
    owner = factories.agent()
    admin = factories.console_user("admin")
    schedule = _schedule(owner)
    # Revoked behind token_revoke's back: the schedule is still running, the owner cannot act.
    ApiToken.objects.filter(agent_id=owner.actor.agent_id).update(revoked_at=timezone.now())

    with pytest.raises(ScheduleOwnerInactive) as refused:
        schedule_trigger(admin.actor, schedule.pk, now=BASE)
    assert refused.value.code == "schedule_owner_inactive"
    assert not ScheduleRun.objects.exists() and not Task.objects.exists()
    assert not ScheduleEvent.objects.filter(schedule=schedule, type="schedule.triggered").exists()


# --- revocation racing the sweeper (real concurrent transactions) -------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_revocation_during_a_slots_decision_waits_for_it_and_only_that_slot_starts():
    """The sweeper has locked the schedule and found the token live, and not committed; the
    revocation commits its token, then waits for the schedule's lock to pause it. The slot
    decided before the revocation starts; nothing after it does."""
    owner = factories.agent()
    schedule = _schedule(owner)
    token_id = _token_of(owner).pk
    now = BASE + timedelta(seconds=3)

    with gate_at("schedule.owner_checked", "sweeper") as gate:
        sweeper, swept = in_thread(lambda: schedule_sweep_one(schedule.pk, now), "sweeper")
        assert gate.reached.wait(30), "the sweeper never checked the owner"
        revoker, revoked = in_thread(lambda: token_revoke(token_id), "revoker")
        wait_until_blocked_on_a_lock("the revocation waiting for the schedule's lock")
        assert not revoked.done()
        gate.release()
        sweeper.join(30)
        revoker.join(30)
    assert swept.result(timeout=1)["started"] == 1
    assert revoked.result(timeout=1) is True
    assert _paused(schedule) and _pauses(schedule)[0].data["reason"] == AGENT_WITHOUT_TOKEN
    assert schedules_sweep(BASE + 5 * MINUTE)["started"] == 0
    assert Task.objects.filter(schedule=schedule).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_slot_decided_while_a_revocation_is_uncommitted_waits_for_it_and_starts_nothing():
    """The revocation has paused the schedule and not committed; the sweeper, which read the
    schedule running, claims the slot and waits for the schedule's lock; once the revocation
    commits it finds the schedule paused and starts nothing."""
    owner = factories.agent()
    schedule = _schedule(owner)
    token_id = _token_of(owner).pk
    now = BASE + timedelta(seconds=3)

    with gate_at("token.revoked", "revoker") as gate:
        revoker, revoked = in_thread(lambda: token_revoke(token_id), "revoker")
        assert gate.reached.wait(30), "the revocation never wrote"
        sweeper, swept = in_thread(lambda: schedule_sweep_one(schedule.pk, now), "sweeper")
        wait_until_blocked_on_a_lock("the sweeper waiting for the schedule's lock")
        assert not swept.done()
        gate.release()
        revoker.join(30)
        sweeper.join(30)
    assert revoked.result(timeout=1) is True
    assert swept.result(timeout=1)["started"] == 0
    assert not Task.objects.exists()
    assert _runs(schedule) == [("12:00", "skipped", "paused")]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_revocations_of_an_agents_last_two_tokens_at_once_pause_its_schedule():
    """Each revocation alone leaves the other token live; run at once, the second waits for the
    first (the agent's row) and then sees none left, so the schedule is paused by it."""
    owner = factories.agent()
    second = token_issue_for_agent(owner.actor.name, "second").token.pk
    schedule = _schedule(owner)
    first = _token_of(owner).pk

    with gate_at("token.revoked", "first") as gate:
        one, one_done = in_thread(lambda: token_revoke(first, revoked_by="user:a"), "first")
        assert gate.reached.wait(30), "the first revocation never wrote"
        two, two_done = in_thread(lambda: token_revoke(second, revoked_by="user:b"), "second")
        wait_until_blocked_on_a_lock("the second revocation waiting for the first")
        gate.release()
        one.join(30)
        two.join(30)
    assert one_done.result(timeout=1) is True and two_done.result(timeout=1) is True
    assert _paused(schedule)
    [pause] = _pauses(schedule)
    assert (pause.data["token"], pause.data["revoked_by"]) == (second, "user:b")
