"""Whether a schedule's owner can still act (issue 33 point 6), and the pause when it cannot.

A schedule acts for a principal: its agent, or the person (an admin) who created it; every task
it starts is that principal's. Once the principal can no longer act (every token of the agent
revoked, the person's account deactivated or its admin role taken away), nothing more may
start in its name: the schedule is paused, journaled with the reason, and neither a trigger
nor a resume is accepted until the principal can act again.

Two paths pause: a revocation of an agent's last live token, in its own transaction
(runtime.tokens), and the sweeper, under the schedule's lock in the transaction that decides a
slot (runtime.schedules). The sweeper's is the guarantee: it also covers a deactivation (no
service of the runtime makes one) and revocations that raced each other. This module sits
below both (it imports models and actors only), so each can use the one rule."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model

from runtime.actors import ROLE_ADMIN, SCHEDULER, roles_of_user
from runtime.errors import ScheduleOwnerInactive
from runtime.models import ApiToken, Schedule, ScheduleEvent

# The role a person needs to own a schedule: policy_features.can_create_schedule asks for it at
# creation, and the owner keeps acting through its schedules only while it holds it.
SCHEDULE_OWNER_ROLE = ROLE_ADMIN

AGENT_WITHOUT_TOKEN = "its agent has no live token"
OWNER_DEACTIVATED = "its owner's account is deactivated"
OWNER_WITHOUT_ROLE = f"its owner no longer holds the {SCHEDULE_OWNER_ROLE} role schedules need"
# What makes each reason go away (said with a refusal).
_REMEDY = {
    AGENT_WITHOUT_TOKEN: "issue the agent a new token (manage.py create_agent_token) first",
    OWNER_DEACTIVATED: "reactivate the account first",
    OWNER_WITHOUT_ROLE: f"give the account the {SCHEDULE_OWNER_ROLE} role back first",
}


def agent_has_live_token(agent_id: str) -> bool:
    """Whether an unrevoked token acts as the agent. Tokens do not expire: revocation is the
    only way one ends."""
    return ApiToken.objects.filter(agent_id=agent_id, revoked_at__isnull=True).exists()


def owner_inactive_reason(schedule: Schedule) -> str | None:
    """Why the schedule's owner can no longer act, or None while it can: an agent while at
    least one of its tokens is unrevoked; a person while the account is active and holds
    SCHEDULE_OWNER_ROLE (read now). The one rule, asked by the sweeper before it decides a
    slot and by trigger and resume before they act. Preconditions: inside the deciding
    transaction, the schedule row locked when the answer decides a start."""
    if schedule.agent_id is not None:
        return None if agent_has_live_token(schedule.agent_id) else AGENT_WITHOUT_TOKEN
    user = get_user_model().objects.filter(pk=schedule.user_id or 0).first()
    if user is None or not user.is_active:
        return OWNER_DEACTIVATED
    if SCHEDULE_OWNER_ROLE not in roles_of_user(user):
        return OWNER_WITHOUT_ROLE
    return None


def owner_can_act_check(schedule: Schedule, doing: str) -> None:
    """Refuse (409 ``schedule_owner_inactive``) ``doing`` (e.g. "resuming") while the owner
    cannot act, whoever asks: an admin's trigger or resume would act in that owner's name."""
    reason = owner_inactive_reason(schedule)
    if reason is not None:
        raise ScheduleOwnerInactive(
            f"{doing} is refused: {reason}, and the schedule acts in its owner's name; "
            f"{_REMEDY[reason]}",
            reason=reason,
        )


def owner_pause_txn(schedule: Schedule, reason: str, now: datetime, **cause: Any) -> None:
    """Pause the schedule because its owner cannot act: journaled ``schedule.paused`` by the
    scheduler (SCHEDULER) with the reason, ``owner_inactive`` and what caused it (``cause``).
    Preconditions: the caller's transaction holds the schedule's row lock, and it is not
    paused."""
    schedule.paused = True
    schedule.updated_at = now
    schedule.save(update_fields=["paused", "updated_at"])
    ScheduleEvent.objects.create(
        schedule=schedule,
        type="schedule.paused",
        at=now,
        actor=SCHEDULER,
        version=schedule.version,
        data={"reason": reason, "owner_inactive": True, **cause},
    )


def agent_schedules_pause_txn(agent_id: str, now: datetime, **cause: Any) -> int:
    """Pause every running schedule of an agent left without a live token (owner_pause_txn
    each); returns how many. Locks them in id order, FOR NO KEY UPDATE as every writer of a
    schedule does, inserting no slot: a sweeper deciding one of them finishes first (its
    start committed before this revocation), or finds it paused. Preconditions: inside the
    revoking transaction."""
    locked = list(
        Schedule.objects.select_for_update(no_key=True)
        .filter(agent_id=agent_id, paused=False)
        .order_by("pk")
    )
    for schedule in locked:
        owner_pause_txn(schedule, AGENT_WITHOUT_TOKEN, now, **cause)
    return len(locked)
