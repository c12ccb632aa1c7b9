"""Who is acting: an agent, a console user with a role, or the system itself. Built by the
transport layer, checked by the domain (authority is rechecked inside the deciding transaction)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model

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
    # The API token the request came with, if any: a revoked token ends its open streams.
    token_id: str | None = None
    # Who minted that token (ApiToken.minted_by: an Actor.key, or None when unknown).
    minted_by: str | None = None

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
# Journal actors of the machinery itself (an event always names who or what caused it).
SWEEPER = "system:sweeper"
SAGA = "system:saga"
RUNTIME = "system:runtime"
SCHEDULER = "system:scheduler"  # the sweeper deciding a schedule's slots
RETENTION = "system:retention"  # removal of ended work (an audit record per batch)


def execution_actor(execution_id: str | None) -> str:
    """The journal actor of a worker execution (a process that claimed and ran the work)."""
    return f"execution:{execution_id}" if execution_id else "system:runtime"


def actor_for_agent(agent_id: str, name: str) -> Actor:
    return Actor(kind="agent", name=name, agent_id=agent_id)


def user_roles(user_id: int) -> frozenset[str]:
    """The user's current roles, read now (not cached), for rechecks inside a transaction."""

    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    return frozenset() if user is None else roles_of_user(user)


def roles_of_user(user: Any) -> frozenset[str]:
    """The roles of an account already read (its groups are read now)."""
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    if user.is_superuser:
        names.add(ROLE_ADMIN)
    return frozenset(names)


def actor_for_user(user_id: int, username: str) -> Actor:
    return Actor(kind="user", name=username, user_id=user_id, roles=user_roles(user_id))
