"""Rights: who may do what. One function per right, consulted by every entry point (REST views,
console pages, websocket consumers) and by the services themselves, so a new entry point cannot
grant more than the domain allows.

Each ``can_*`` returns None when the actor holds the right and raises ``NotAuthorized`` (403)
otherwise; ``allowed()`` turns one into a bool for pages that only show or hide a button.
Visibility is different from a right: what an actor may not *see* is a 404 (``task_scope``),
so a refusal never reveals that another agent's task exists. The rights over the features
around the work (schedules, notification webhooks and their delivery, API tokens, the metrics,
the Django admin) are in runtime.policy_features, by the same contract.

| right | who |
|---|---|
| see a task | its agent; the user who created it; every console role (operator, support, admin) |
| create a task | an agent; a user (a token acting for a user, or a signed-in person); the runtime |
| propose an operation | the task's agent; for a task a user created, that user |
| claim / heartbeat / complete an agent-run operation | the task's agent only |
| cancel or fail a task | the task's agent; the user who created it; an admin |
| start a new attempt of a task | the task's agent; an admin |
| create a child task | the parent's agent |
| read a task's budget | whoever sees the task |
| resolve an unresolved operation; requeue or | support staff, admins (roles read fresh) |
|   abandon one waiting for manual intervention |   |
| approve or deny an action | the tool's approver role (operators); never the requester, the |
|   | editor, nor the minter of the requesting token |
| be offered the approval tools of the MCP gateway (``/mcp``) | a person with a console role |
|   | (roles read fresh); each decision still passes the release gate above |
| edit a pending proposal | operators, admins |
| take, hand over, release, comment on an item of a | operators for approval requests, support |
|   people's queue (runtime.worklist); be handed one |   staff for unresolved operations, admins |
|   |   both (roles read fresh) |
| read who holds an item and its comments | a person with a console role (roles read fresh) |
| be recorded as having a queue's page open, and told who else | those who work the queue |
|   has it open (presence, runtime.presence) |   (``can_work_on``, roles read fresh) |
| renew, transform or end an expired wait or approval | admins |
| send a signal to a task | its agent; for a task a user created, that user |
| pause, resume, steer a task | its agent (or the user who created it), operators, admins |
| use the console | a signed-in person with a console role |
| save and remove views of the console's lists | that person, their own views only |
| read the metrics (``/metrics``) | the holder of ``METRICS_TOKEN``; admins (roles read fresh) |
| use the Django admin (``/admin/``, read-only) | admins (roles read fresh) |
| manage API tokens | admins (roles read fresh); a token acts as the admin or a new agent |
| keep an open event stream or live socket | its opener, while ``can_keep_streaming`` holds |
| read the tool catalogue | every authenticated caller (agents, users, console roles) |
| declare, edit or read the declarations of tools without code (HTTP, agent-run) | admins |
|   | (roles read fresh) |
| propose into the runtime's own tasks (notifications) | the runtime itself (system actor) |
| choose one's notification channels and quiet hours | every console role, for themself |
| watch a task (hear of its notifications) | a console role that sees the task |
| see notifications and their delivery | each person their own; admins every one |
| configure notification webhooks | admins (roles read fresh) |
| see a schedule | its agent; the user who owns it; every console role |
| create a schedule | an agent (it owns it and the tasks it starts); an admin (owns it) |
| edit, pause, resume, trigger a schedule | its agent; admins (roles read fresh) |
| have a schedule start, trigger or resume | only while its owner can act: an agent with a live |
|   | token, an active admin (``runtime.schedule_owners.owner_inactive_reason``; 409) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q

from runtime.accounts import session_signed_in_as
from runtime.actors import ROLE_ADMIN, ROLE_OPERATOR, ROLE_SUPPORT, Actor, roles_of_user, user_roles
from runtime.crashpoints import crash_point
from runtime.errors import NotAuthenticated, NotAuthorized, NotFound
from runtime.models import Approval, Operation, Task
from runtime.models.worklist import QUEUE_APPROVALS, QUEUE_UNRESOLVED
from runtime.tokens import token_is_live


def task_scope(actor: Actor, prefix: str = "") -> Q:
    """The tasks an actor may see: an agent its own; a console role every task; a user without
    a role only what it created. ``prefix`` applies the rule across a relation ("task__")."""
    if actor.kind == "agent":
        return Q(**{f"{prefix}agent_id": actor.agent_id})
    if actor.kind == "system" or actor.is_console:
        return Q()
    if actor.kind == "user":
        return Q(**{f"{prefix}created_by_id": actor.user_id})
    return Q(**{f"{prefix}pk__in": []})


def task_scope_sql(actor: Actor, alias: str) -> tuple[str, list[Any]]:
    """``task_scope`` as an SQL condition on the task table under ``alias`` (for the hot path's
    hand-written reads, where compiling a queryset would cost more than running it). The same
    rule: tests/runtime/test_policy.py checks both forms select the same tasks."""
    if actor.kind == "agent":
        return f"{alias}.agent_id = %s", [actor.agent_id]
    if actor.kind == "system" or actor.is_console:
        return "1 = 1", []
    if actor.kind == "user":
        return f"{alias}.created_by_id = %s", [actor.user_id]
    return "1 = 0", []


def fresh(actor: Actor) -> Actor:
    """The actor with its roles read now: a right decided for a person is decided on the roles it
    holds at that moment, not the ones cached when its session or request began."""
    if actor.kind == "user" and actor.user_id is not None:
        return replace(actor, roles=user_roles(actor.user_id))
    return actor


def _owns(actor: Actor, task: Task) -> bool:
    if actor.kind == "agent":
        return task.agent_id is not None and task.agent_id == actor.agent_id
    if actor.kind == "user":
        # Only tasks a user created itself; an agent's task is never a user's.
        return task.agent_id is None and task.created_by_id == actor.user_id
    return False


def can_use_console(actor: Actor) -> None:
    if not (actor.kind == "user" and actor.is_console):
        raise NotAuthorized("the console is for operators, support staff and admins")


def can_keep_views(actor: Actor) -> None:
    """Saving and removing views of the console's lists: a console person, their own only."""
    if not (actor.kind == "user" and actor.is_console and actor.user_id is not None):
        raise NotAuthorized("saved views belong to console users")


def can_review_approvals(actor: Actor) -> None:
    """Listing approvals to decide and deciding them through a tool (the MCP gateway's): a
    person holding a console role now, who may be some tool's approver. Each decision is still
    the release gate's (``can_decide_approval``), and each list the caller's scope."""
    if not (actor.kind == "user" and fresh(actor).is_console):
        raise NotAuthorized("reviewing approvals needs a console role")


def can_read_tool_catalogue(actor: Actor) -> None:
    """The catalogue describes tools, not anyone's work: every authenticated caller reads it."""
    if actor.kind not in ("agent", "user", "system"):
        raise NotAuthorized("the tool catalogue is for authenticated callers")


def can_declare_tools(actor: Actor) -> None:
    """Declaring a tool (an HTTP endpoint the workers call with a sealed credential, or an
    agent-run step) and editing one, and reading the declarations (their URLs): admins, roles
    read now. What agents may call is the catalogue's (``can_read_tool_catalogue``)."""
    if not (actor.kind == "user" and fresh(actor).has_role(ROLE_ADMIN)):
        raise NotAuthorized("tools are declared by admins")


def can_create_task(actor: Actor) -> None:
    """Agents and users; and the runtime itself, for its own tasks (the notifications' days)."""
    if actor.kind not in ("agent", "user", "system"):
        raise NotAuthorized("only agents and users create tasks")


def can_propose(actor: Actor, task: Task) -> None:
    """Proposing work is the task's owner's right, never a side effect of seeing the task. The
    runtime's own tasks (no agent, no creating user: the notifications' days) are the system's."""
    if actor.kind == "system" and task.agent_id is None and task.created_by_id is None:
        return
    if not _owns(actor, task):
        raise NotAuthorized("only the task's agent may propose operations in it")


def can_claim(actor: Actor, operation: Operation) -> None:
    """Claiming, heartbeating and completing an agent-run operation: the task's agent only."""
    task = operation.task
    if not (actor.kind == "agent" and task.agent_id == actor.agent_id):
        raise NotAuthorized("only the task's agent may run its operations")


def can_cancel(actor: Actor, task: Task) -> None:
    if _owns(actor, task) or fresh(actor).has_role(ROLE_ADMIN):
        return
    raise NotAuthorized("only the task's agent or an admin may stop it")


def can_start_attempt(actor: Actor, task: Task) -> None:
    """A new attempt (a new pursuit with its own allocation): the task's agent, or an admin."""
    if actor.kind == "agent" and task.agent_id is not None and task.agent_id == actor.agent_id:
        return
    if fresh(actor).has_role(ROLE_ADMIN):
        return
    raise NotAuthorized("only the task's agent or an admin may start a new attempt")


def can_create_child(actor: Actor, parent: Task) -> None:
    """A child task draws on its parent's allowance: only the parent's agent may create one."""
    can_create_task(actor)
    if not (
        actor.kind == "agent" and parent.agent_id is not None and parent.agent_id == actor.agent_id
    ):
        raise NotAuthorized("only the parent task's agent may create a child task")


def can_read_budget(actor: Actor, task: Task) -> None:
    """A task's ledger is read by whoever sees the task (``task_scope``; an unseen task is a
    404 before this is asked, so this refuses only a task read outside that scope)."""
    if _sees(actor, task):
        return
    raise NotAuthorized("the budget is read by those who see the task")


def _sees(actor: Actor, task: Task) -> bool:
    """``task_scope`` for one task already read (no statement)."""
    if actor.kind == "agent":
        return task.agent_id == actor.agent_id
    if actor.kind == "system" or actor.is_console:
        return True
    if actor.kind == "user":
        return task.created_by_id == actor.user_id
    return False


def can_follow_task(actor: Actor, task: Task) -> None:
    """Following a task's journal (an event stream): whoever sees the task. Asked again of an
    open stream, where a refusal is a 403: the stream already knows the task exists."""
    if not _sees(actor, task):
        raise NotAuthorized("only those who see the task may follow it")


def can_keep_streaming(
    actor: Actor, right: Callable[[Actor], None], *, session_key: str | None = None
) -> None:
    """The one recheck of every open event stream and live socket, every
    ``TOKEN_RECHECK_SECONDS``: the principal that opened it must still hold. NotAuthenticated
    (401) once its token is revoked, its browser session ended (logged out, expired, outdated
    by a password change) or its user is deactivated; NotAuthorized (403) once ``right``, the
    right the stream was opened under, no longer holds with the roles held now (a role
    removed). ``session_key``: the browser session a person's stream came with (None with a
    token)."""
    if actor.token_id is not None and not token_is_live(actor.token_id):
        raise NotAuthenticated("the token was revoked")
    if actor.kind != "user":
        right(actor)
        return
    user = get_user_model().objects.filter(pk=actor.user_id or 0).first()
    if user is None or not user.is_active:
        raise NotAuthenticated("the account is no longer active")
    if actor.token_id is None and not session_signed_in_as(session_key, user):
        raise NotAuthenticated("the session ended")
    crash_point("stream.user_read")
    # The roles of the account as read above: reading it again could find it deactivated
    # meanwhile, and an account that ended must end the stream as 401, never as a lost right.
    right(replace(actor, roles=roles_of_user(user)))


def can_write_outcomes(actor: Actor, task: Task) -> None:
    """Artifacts, checks and completion: the task's owner, or an admin."""
    if _owns(actor, task) or fresh(actor).has_role(ROLE_ADMIN):
        return
    raise NotAuthorized("only the task's agent or an admin may change its outcomes")


def can_resolve(actor: Actor) -> None:
    if not (actor.kind == "user" and fresh(actor).has_role(ROLE_SUPPORT)):
        raise NotAuthorized("only support staff may resolve operations")


def can_decide_approval(actor: Actor, approval: Approval) -> None:
    """For the release gate: a person holding, now, the role the tool's policy names, who is
    neither the requester (nor the user it acts for, nor the minter of the token it came
    with) nor the editor of this proposal."""
    refusal = approval_decision_refusal(fresh(actor), approval)
    if refusal is not None:
        raise NotAuthorized(refusal)


def approval_decision_refusal(actor: Actor, approval: Approval) -> str | None:
    """The rule of ``can_decide_approval`` on the roles ``actor`` carries (pure): why it may not
    decide, or None. A page listing many requests reads the person's roles once (``fresh``)
    and asks this per row; the gate itself always goes through ``can_decide_approval``."""
    if actor.kind != "user" or not actor.has_role(approval.approver_role):
        return f"deciding needs the {approval.approver_role} role"
    if actor.key in (approval.requester_key, approval.requested_for_key):
        return "the requester may not approve its own request"
    if approval.requester_minted_by and actor.key == approval.requester_minted_by:
        return "the person who minted the requesting token may not approve its request"
    if approval.editor_key and actor.key == approval.editor_key:
        return "the editor of a proposal may not approve it"
    return None


def can_edit_approval(actor: Actor) -> None:
    """Editing a pending proposal's parameters: operators (and admins)."""
    if not (actor.kind == "user" and fresh(actor).has_role(ROLE_OPERATOR)):
        raise NotAuthorized("editing a proposal needs the operator role")


# Who works each people's queue: those who settle its items.
_QUEUE_ROLES = {QUEUE_APPROVALS: ROLE_OPERATOR, QUEUE_UNRESOLVED: ROLE_SUPPORT}


def can_work_on(actor: Actor, queue: str) -> None:
    """Taking an item of a people's queue, handing it over, releasing it, commenting on it, and
    being handed it: operators for approval requests, support staff for unresolved operations,
    admins both (roles read now). An unknown queue is refused like a missing role."""
    role = _QUEUE_ROLES.get(queue)
    if role is None or not (actor.kind == "user" and fresh(actor).has_role(role)):
        who = "operators" if queue == QUEUE_APPROVALS else "support staff"
        raise NotAuthorized(f"the {queue} queue is worked by {who} and admins")


def can_read_worklist(actor: Actor) -> None:
    """Who holds an item of a people's queue and its comments: a person with a console role
    now (the queue pages show them to every console role; acting needs ``can_work_on``)."""
    if not (actor.kind == "user" and fresh(actor).is_console):
        raise NotAuthorized("who works on what is read by people with a console role")


def can_manage_waits(actor: Actor) -> None:
    """Renew, transform or end expired waits and expired approvals: admins."""
    if not (actor.kind == "user" and fresh(actor).has_role(ROLE_ADMIN)):
        raise NotAuthorized("expired waits are handled by admins")


def can_signal(actor: Actor, task: Task) -> None:
    """Signals address the task's own execution: its agent (or the user who created it)."""
    if not _owns(actor, task):
        raise NotAuthorized("only the task's agent may signal it")


def can_control_task(actor: Actor, task: Task) -> None:
    """Pause, resume, steer: the task's agent (or the user who created it), operators, admins."""
    if _owns(actor, task) or (actor.kind == "user" and fresh(actor).has_role(ROLE_OPERATOR)):
        return
    raise NotAuthorized("pause, resume and steer need the task's agent, an operator or an admin")


def can_watch_task(actor: Actor, task: Task) -> None:
    """Watching a task (its notifications reach the watcher): a console person who sees it."""
    if not (actor.kind == "user" and actor.is_console and _sees(actor, task)):
        raise NotAuthorized("watching a task is for console users who see it")


def effects_visible(actor: Actor, key: str) -> None:
    """A receiver's records under ``key`` are visible through the operation that owns the key:
    an actor that may see no operation with that key gets NotFound, like any unseen object."""
    if (
        not key
        or not Operation.objects.filter(task_scope(actor, "task__"), idempotency_key=key).exists()
    ):
        raise NotFound("no such key")


def allowed(right: Callable[..., None], *args: Any, **kwargs: Any) -> bool:
    try:
        right(*args, **kwargs)
    except NotAuthorized:
        return False
    return True
