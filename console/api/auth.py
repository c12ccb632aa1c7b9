"""Bearer tokens for agents and scripts, each held to its rate (runtime.throttle); sessions (with
CSRF) for people in the browser, which are not. Either way the view gets an ``Actor`` from
``actor_of(request)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from runtime.actors import Actor, actor_for_user
from runtime.errors import NotAuthenticated
from runtime.throttle import token_throttle
from runtime.tokens import token_authenticate


@dataclass(frozen=True)
class TokenPrincipal:
    """What DRF sees as ``request.user`` for a token: authenticated, not a Django user."""

    actor: Actor
    is_authenticated: bool = True
    is_active: bool = True

    @property
    def pk(self) -> str:
        return self.actor.key


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Actor] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        raw = raw.strip()
        if not raw:
            raise exceptions.AuthenticationFailed("empty bearer token")
        try:
            actor = token_authenticate(raw, address=client_address(request))
        except NotAuthenticated as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        # The token's rate, counted here once per request: every token-authenticated request
        # passes here exactly once (DRF asks once per request; a body's request is asked by
        # console.edge from its head, before the body is read, and the view takes the
        # principal it found instead of asking again). RateLimited is the 429.
        assert actor.token_id is not None
        token_throttle(actor.token_id)
        return TokenPrincipal(actor), actor

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Publishes the bearer scheme in the OpenAPI document (registered on import)."""

    target_class = "console.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}


def client_address(request: Any) -> str:
    """The peer's address as the server saw it: REMOTE_ADDR, which uvicorn takes from
    X-Forwarded-For only behind --proxy-headers and only from FORWARDED_ALLOW_IPS (a header
    any client sends is not believed: it could name anyone and escape its limits)."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")[:64]


def actor_of(request: Request) -> Actor:
    """The acting principal of an authenticated DRF request."""
    if isinstance(request.auth, Actor):
        return request.auth
    user = request.user
    cached = getattr(request, "_console_actor", None)
    if cached is None:
        cached = actor_for_user(int(str(user.pk)), user.get_username())
        request._console_actor = cached  # type: ignore[attr-defined]
    return cached
