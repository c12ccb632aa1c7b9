"""The rights of the human side (approvals, waits, signals, task control), in one place so every
entry point (REST, pages, websockets) asks the same question. Roles are read from the database
at the moment of the check, so a right removed a second ago is gone."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from runtime.actors import ROLE_ADMIN, ROLE_OPERATOR, Actor, user_roles

if TYPE_CHECKING:
    from runtime.models import Approval, Task


def current(actor: Actor) -> Actor:
    """The actor with its roles as they are now (not as the session cached them)."""
    if actor.kind == "user" and actor.user_id is not None:
        return replace(actor, roles=user_roles(actor.user_id))
    return actor


def approval_refusal(actor: Actor, approval: Approval) -> str | None:
    """Why ``actor`` may not decide ``approval`` now, or None. The requester (and the user it acts
    for) and the editor of the proposal never decide it; the approver needs the role the tool's
    policy names, held now."""
    now_actor = current(actor)
    if now_actor.kind != "user" or not now_actor.has_role(approval.approver_role):
        return f"deciding needs the {approval.approver_role} role"
    if now_actor.key in (approval.requester_key, approval.requested_for_key):
        return "the requester may not approve its own request"
    if approval.editor_key and now_actor.key == approval.editor_key:
        return "the editor of a proposal may not approve it"
    return None


def can_edit_approval(actor: Actor) -> bool:
    return current(actor).kind == "user" and current(actor).has_role(ROLE_OPERATOR)


def can_manage_waits(actor: Actor) -> bool:
    """Renew, transform or end expired waits: admins."""
    return current(actor).kind == "user" and current(actor).has_role(ROLE_ADMIN)


def can_control_task(actor: Actor, task: Task) -> bool:
    """Pause, resume, steer: the task's own agent, operators and admins."""
    if actor.kind == "agent":
        return task.agent_id == actor.agent_id
    return current(actor).kind == "user" and current(actor).has_role(ROLE_OPERATOR)


def can_signal(actor: Actor, task: Task) -> bool:
    """Send a signal to a task the actor may see: its agent, or any console role."""
    if actor.kind == "agent":
        return task.agent_id == actor.agent_id
    return actor.kind == "user"
