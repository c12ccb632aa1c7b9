from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from runtime.actors import ROLE_ADMIN, ROLE_OPERATOR, ROLE_SUPPORT, user_roles


def console_context(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"roles": frozenset()}
    roles = getattr(request, "_console_roles", None)
    if roles is None:
        roles = user_roles(user.pk)
        request._console_roles = roles  # type: ignore[attr-defined]
    return {
        "roles": roles,
        "is_operator": ROLE_OPERATOR in roles or ROLE_ADMIN in roles,
        "is_support": ROLE_SUPPORT in roles or ROLE_ADMIN in roles,
        "is_admin": ROLE_ADMIN in roles,
    }
