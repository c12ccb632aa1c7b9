"""Who is acting: an agent, a console user with a role, or the system itself. Built by the
transport layer, checked by the domain (authority is rechecked inside the deciding transaction)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Q

ROLE_OPERATOR = "operator"
ROLE_SUPPORT = "support"
ROLE_ADMIN = "admin"
ROLES = (ROLE_OPERATOR, ROLE_SUPPORT, ROLE_ADMIN)


@dataclass(frozen=True)
class Actor:
    kind: str  # "agent" | "user" | "system"
    name: str
    agent_id: str | None = None
    user_id: int | None = None
    roles: frozenset[str] = field(default_factory=frozenset)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def key(self) -> str:
        """A stable identity for scoping (idempotent requests, audit)."""
        if self.kind == "agent":
            return f"agent:{self.agent_id}"
        if self.kind == "user":
            return f"user:{self.user_id}"
        return "system"

    def has_role(self, role: str) -> bool:
        # Admins hold every console right.
        return role in self.roles or ROLE_ADMIN in self.roles

    @property
    def is_console(self) -> bool:
        return self.kind == "user" and bool(self.roles)


SYSTEM = Actor(kind="system", name="runtime")


def actor_for_agent(agent_id: str, name: str) -> Actor:
    return Actor(kind="agent", name=name, agent_id=agent_id)


def user_roles(user_id: int) -> frozenset[str]:
    """The user's current roles, read now (not cached), for rechecks inside a transaction."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return frozenset()
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    if user.is_superuser:
        names.add(ROLE_ADMIN)
    return frozenset(names)


def actor_for_user(user_id: int, username: str) -> Actor:
    return Actor(kind="user", name=username, user_id=user_id, roles=user_roles(user_id))


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
