from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest

from runtime import policy
from runtime.actors import actor_for_user
from runtime.policy_features import can_manage_tokens


def console_context(request: HttpRequest) -> dict[str, Any]:
    """What the navigation shows; each flag asks the policy (the views check again)."""
    user = getattr(request, "user", None)
    if not isinstance(user, AbstractBaseUser) or not user.is_authenticated:
        # Anonymous, or an API token principal on a page DRF renders (the API docs).
        return {"roles": frozenset()}
    actor = getattr(request, "_console_nav_actor", None)
    if actor is None:
        actor = actor_for_user(user.pk, user.get_username())
        request._console_nav_actor = actor  # type: ignore[attr-defined]
    return {
        "roles": actor.roles,
        "is_operator": actor.has_role("operator"),
        "is_support": policy.allowed(policy.can_resolve, actor),
        "is_admin": policy.allowed(can_manage_tokens, actor),
    }
