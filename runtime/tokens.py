"""API tokens: shown once, stored as a SHA-256 digest (tokens are 256-bit random, so a fast hash is
not brute-forceable), looked up by a non-secret prefix and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor, actor_for_agent, actor_for_user
from runtime.errors import InvalidInput, NotAuthenticated
from runtime.models import Agent, ApiToken

TOKEN_PREFIX = "ac"


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # the only time the plain token exists


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_secret() -> tuple[str, str]:
    prefix = secrets.token_hex(6)
    return prefix, f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"


def token_issue_for_agent(agent_name: str, token_name: str | None = None) -> IssuedToken:
    name = agent_name.strip()
    if not name:
        raise InvalidInput("an agent needs a name")
    with transaction.atomic():
        agent, _ = Agent.objects.get_or_create(name=name)
        prefix, secret = _new_secret()
        token = ApiToken.objects.create(
            name=token_name or name, prefix=prefix, digest=_digest(secret), agent=agent
        )
    return IssuedToken(token, secret)


def token_issue_for_user(username: str, token_name: str | None = None) -> IssuedToken:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise InvalidInput(f"no user named {username!r}")
    prefix, secret = _new_secret()
    token = ApiToken.objects.create(
        name=token_name or f"{username} script", prefix=prefix, digest=_digest(secret), user=user
    )
    return IssuedToken(token, secret)


def token_authenticate(raw: str) -> Actor:
    """The actor a presented token stands for; NotAuthenticated for anything else."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise NotAuthenticated("invalid token")
    token = (
        ApiToken.objects.select_related("agent", "user")
        .filter(prefix=parts[1], revoked_at__isnull=True)
        .first()
    )
    if token is None or not hmac.compare_digest(token.digest, _digest(raw)):
        raise NotAuthenticated("invalid token")
    if token.agent is not None:
        return actor_for_agent(token.agent.pk, token.agent.name)
    assert token.user is not None
    if not token.user.is_active:
        raise NotAuthenticated("invalid token")
    return actor_for_user(token.user.pk, token.user.get_username())


def token_revoke(token_id: str) -> bool:
    return (
        ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        == 1
    )
