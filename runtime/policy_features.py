"""Rights over the features around a task's work: schedules, notification webhooks and their
delivery, API tokens, the metrics and the Django admin. The contract of runtime.policy: one
function per right, returning None when the actor holds it and raising ``NotAuthorized`` (403)
otherwise; what an actor may not see is left out by a scope (404). Who holds each: the table
in runtime.policy and docs/security.md."""

from __future__ import annotations

from django.db.models import Q

from runtime.actors import ROLE_ADMIN, Actor
from runtime.errors import NotAuthorized
from runtime.models import Schedule
from runtime.policy import fresh
from runtime.schedule_owners import SCHEDULE_OWNER_ROLE


def can_manage_tokens(actor: Actor) -> None:
    if not (actor.kind == "user" and ROLE_ADMIN in fresh(actor).roles):
        raise NotAuthorized("only admins manage API tokens")


def can_mint_user_token(actor: Actor, user_id: int) -> None:
    """A token acting as a console user: an admin, for themself only. A token for someone else
    would let its minter act (and approve) as that person."""
    can_manage_tokens(actor)
    if actor.user_id != user_id:
        raise NotAuthorized("a token may act only as the person who creates it")


def can_mint_agent_token(actor: Actor, *, agent_is_new: bool) -> None:
    """A token acting as an agent: an admin, for a new agent only (its tokens then name the
    admin as minter, and the admin may not decide that agent's requests). An existing agent's
    token would let the admin act as that agent; its tokens come from the shell."""
    can_manage_tokens(actor)
    if not agent_is_new:
        raise NotAuthorized(
            "tokens for an existing agent are issued from the shell (create_agent_token)"
        )


def can_rotate_agent_token(actor: Actor, *, agent_has_token: bool) -> None:
    """A second token for an existing agent (rotation: the old one works until revoked): an
    admin, for an agent that already holds a token (a first token comes from the shell). The
    new token names the admin as minter, so the admin may not decide the requests made through
    it (approval_decision_refusal), as for a new agent's; the mint is audited."""
    can_manage_tokens(actor)
    if not agent_has_token:
        raise NotAuthorized(
            "rotation gives a second token to an agent that holds one; a first token for an "
            "existing agent is issued from the shell (create_agent_token)"
        )


def schedule_scope(actor: Actor) -> Q:
    """The schedules an actor may see: an agent its own; a console role every schedule; a user
    without a role those it owns."""
    if actor.kind == "agent":
        return Q(agent_id=actor.agent_id)
    if actor.kind == "system" or actor.is_console:
        return Q()
    if actor.kind == "user":
        return Q(agent__isnull=True, user_id=actor.user_id)
    return Q(pk__in=[])


def can_create_schedule(actor: Actor) -> None:
    """An agent schedules its own work; a person schedules as an admin (the schedule, and the
    tasks it starts, are then that person's). Operators and support staff read schedules."""
    if actor.kind == "agent" or (
        actor.kind == "user" and fresh(actor).has_role(SCHEDULE_OWNER_ROLE)
    ):
        return
    raise NotAuthorized("schedules are created by agents and admins")


def can_manage_schedule(actor: Actor, schedule: Schedule) -> None:
    """Edit, pause, resume, trigger: the schedule's agent, or an admin (roles read now)."""
    if actor.kind == "agent" and schedule.agent_id is not None:
        if schedule.agent_id == actor.agent_id:
            return
    elif actor.kind == "user" and fresh(actor).has_role(ROLE_ADMIN):
        return
    raise NotAuthorized("a schedule is managed by its agent or an admin")


def can_manage_notification_endpoints(actor: Actor) -> None:
    """Webhooks every notification goes to: admins (roles read fresh)."""
    if not (actor.kind == "user" and fresh(actor).has_role(ROLE_ADMIN)):
        raise NotAuthorized("notification webhooks are configured by admins")


def notification_scope(actor: Actor) -> Q:
    """The notifications an actor may see: a person their own; an admin every one (webhooks'
    included)."""
    if actor.kind == "user" and actor.has_role(ROLE_ADMIN):
        return Q()
    if actor.kind == "user":
        return Q(user_id=actor.user_id)
    return Q(pk__in=[])


# Who presents METRICS_TOKEN: a scraper, not a person nor an agent (console.metrics).
METRICS_SCRAPER = Actor(kind="system", name="metrics-scraper")


def can_read_metrics(actor: Actor) -> None:
    """``/metrics`` shows counts and ages of everyone's work (tools, queues, approvals): the
    scraper holding ``METRICS_TOKEN``, or an admin. Never anonymous, whatever the network: a
    proxy on the same host would make every visitor look local."""
    if actor == METRICS_SCRAPER:
        return
    if actor.kind == "user" and fresh(actor).has_role(ROLE_ADMIN):
        return
    raise NotAuthorized("the metrics are read with METRICS_TOKEN or by an admin")


def can_use_admin(actor: Actor) -> None:
    """The Django admin (a read-only window on every table): admins, roles read now."""
    if not (actor.kind == "user" and fresh(actor).has_role(ROLE_ADMIN)):
        raise NotAuthorized("the admin is for admins")
