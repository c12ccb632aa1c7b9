"""API tokens: shown once, stored as a SHA-256 digest (tokens are 256-bit random, so a fast hash is
not brute-forceable), looked up by a non-secret prefix and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor, actor_for_agent, actor_for_user
from runtime.crashpoints import crash_point
from runtime.db import db_datetime, fetchone_named, prepared_cursor
from runtime.errors import InvalidInput, NotAuthenticated
from runtime.models import Agent, ApiToken, AuditRecord
from runtime.ratelimits import failure_count, token_limits
from runtime.schedule_owners import agent_has_live_token, agent_schedules_pause_txn
from runtime.sqlfiles import queries
from runtime.text import name_check

TOKEN_PREFIX = "ac"
CLI = "system:cli"  # tokens issued or revoked from a shell (manage.py)
LAST_USED_GRANULARITY = timedelta(seconds=60)

# The token's read on every API request (runtime/sql/requests.sql); the user model is
# swappable, so its table and columns are the model's.
_USER = get_user_model()
_SQL = queries(
    "token_live",
    slots={
        "user_table": _USER._meta.db_table,
        "user_pk_column": _USER._meta.pk.column,
        "username_column": getattr(
            _USER._meta.get_field(_USER.USERNAME_FIELD), "column", "username"
        ),
    },
)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # the only time the plain token exists


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# Compared against when no token has the presented prefix (a digest no secret has).
_NO_DIGEST = "0" * 64


def _new_secret() -> tuple[str, str]:
    prefix = secrets.token_hex(6)
    return prefix, f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"


def _audit_txn(*, actor: str, action: str, token: ApiToken, **detail: Any) -> None:
    AuditRecord.objects.create(
        at=timezone.now(),
        actor=actor,
        action=action,
        subject=f"token:{token.pk}",
        detail={"name": token.name, "prefix": token.prefix, **detail},
    )


def token_issue_txn(
    *,
    name: str,
    created_by: str,
    minted_by: str,
    acts_as: str,
    agent: Agent | None = None,
    user: Any = None,
) -> IssuedToken:
    """Create a token acting as ``agent`` or ``user``, recording who minted it (``minted_by``,
    an Actor.key or CLI), and audit it. Preconditions: inside the caller's transaction, which
    decided the minter may mint this token (a shell is trusted; a person asks the policy:
    runtime.token_minting)."""
    prefix, secret = _new_secret()
    token = ApiToken.objects.create(
        name=name[:200],
        prefix=prefix,
        digest=_digest(secret),
        agent=agent,
        user=user,
        created_by=created_by,
        minted_by=minted_by,
    )
    _audit_txn(actor=created_by, action="token.issued", token=token, acts_as=acts_as)
    return IssuedToken(token, secret)


def agent_name_checked(agent_name: str) -> str:
    """The agent name, stripped; InvalidInput when empty, over 200 characters, or holding a
    character that hides or reorders text (runtime.text.name_check, the one rule for names: an
    agent's name is its actor label on every page and in every journal event)."""
    name = agent_name.strip()
    if not name or len(name) > 200:
        raise InvalidInput("an agent needs a name of 1 to 200 characters")
    return name_check(name, "agent name")


def token_name_checked(token_name: str | None) -> str | None:
    """A token name given by its minter, as given (None when none); InvalidInput when it holds a
    hidden character (runtime.text.name_check: it names the token on /tokens/ and in the
    audit, and revoking asks by it)."""
    return name_check(token_name, "token name") if token_name else None


def token_issue_for_agent(
    agent_name: str, token_name: str | None = None, *, issued_by: str = CLI
) -> IssuedToken:
    """From a shell: a new token acting as agent ``agent_name`` (created when new), minted by
    CLI; audited. Preconditions: the caller is the operator at the shell (a person in the
    console mints through runtime.token_minting)."""
    name = agent_name_checked(agent_name)
    token_name = token_name_checked(token_name)
    with transaction.atomic():
        agent, _ = Agent.objects.get_or_create(name=name)
        return token_issue_txn(
            name=token_name or name,
            created_by=issued_by,
            minted_by=CLI,
            acts_as=f"agent:{name}",
            agent=agent,
        )


def token_issue_for_user(
    username: str, token_name: str | None = None, *, issued_by: str = CLI
) -> IssuedToken:
    """From a shell: a new token acting as console user ``username`` with that user's role,
    minted by CLI; audited. Preconditions as for ``token_issue_for_agent``."""
    token_name = token_name_checked(token_name)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise InvalidInput(f"no user named {username!r}")
    with transaction.atomic():
        return token_issue_txn(
            name=token_name or f"{username} script",
            created_by=issued_by,
            minted_by=CLI,
            acts_as=f"user:{username}",
            user=user,
        )


@dataclass(frozen=True)
class _Presented:
    id: str
    digest: str
    last_used_at: datetime | None
    agent_id: str | None
    agent_name: str | None
    user_id: int | None
    username: str | None
    user_active: bool
    minted_by: str | None


def _live_token(prefix: str) -> _Presented | None:
    """The unrevoked token with this prefix and what it acts as, in one hand-written query: it
    runs on every API request, where compiling the equivalent queryset (two joins) cost more
    CPU than running it."""
    with prepared_cursor() as cur:
        cur.execute(_SQL["token_live"], [prefix])
        row = fetchone_named(cur)
    if row is None:
        return None
    return _Presented(
        id=row["id"],
        digest=row["digest"],
        last_used_at=db_datetime(row["last_used_at"]),
        agent_id=row["agent_id"],
        agent_name=row["agent_name"],
        user_id=row["user_id"],
        username=row["username"],
        user_active=bool(row["user_active"]),
        minted_by=row["minted_by"],
    )


def token_authenticate(raw: str, *, address: str | None = None) -> Actor:
    """The actor a presented token stands for; NotAuthenticated for anything else. The token is
    checked first: a good one is never limited (a 256-bit secret cannot be guessed, and an
    agent's parallel calls must not lock it out). With the client's ``address``, a failure is
    counted per address and, for a well-formed token, per prefix, and answered RateLimited
    (429) once either is over its limit."""
    parts = raw.split("_", 2)
    well_formed = len(parts) == 3 and parts[0] == TOKEN_PREFIX
    token = _live_token(parts[1]) if well_formed else None
    # The digest is computed and compared whether or not the prefix exists, and a failure is
    # counted the same way either way: the answer (and its timing) must not tell them apart.
    good = hmac.compare_digest(token.digest if token else _NO_DIGEST, _digest(raw))
    if token is None or not good or (token.user_id is not None and not token.user_active):
        if address is not None:
            per_prefix, per_address = token_limits()
            checks = [(per_address, address)]
            if well_formed:
                checks.append((per_prefix, parts[1][:16]))
            failure_count(checks)
        raise NotAuthenticated("invalid token")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_GRANULARITY:
        # Coarse on purpose: one write a minute per token, not one per request.
        ApiToken.objects.filter(pk=token.id).update(last_used_at=now)
    if token.agent_id is not None:
        agent = actor_for_agent(token.agent_id, token.agent_name or "")
        return replace(agent, token_id=token.id, minted_by=token.minted_by)
    assert token.user_id is not None
    actor = actor_for_user(token.user_id, token.username or "")
    return replace(actor, token_id=token.id, minted_by=token.minted_by)


def token_is_live(token_id: str) -> bool:
    """Whether the token still works (open streams re-check this and end when it does not)."""
    return ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).exists()


def token_revoke(token_id: str, *, revoked_by: str = CLI) -> bool:
    """Revoke a token: its next request fails, its open streams end. Audited; False when it
    was already revoked or never existed. When it was its agent's last live token, the agent's
    schedules are paused in the same transaction (runtime.schedule_owners: they act for an
    agent that can no longer act). Preconditions as for ``token_issue_for_agent``."""
    now = timezone.now()
    with transaction.atomic():
        agent_id = ApiToken.objects.filter(pk=token_id).values_list("agent_id", flat=True).first()
        if agent_id is not None:
            # Revocations of one agent's tokens, one at a time: two at once would each see the
            # other's token still live, and neither would pause its schedules. (Key-share
            # locks, taken by rows that reference the agent, never wait on this one.)
            list(Agent.objects.select_for_update(no_key=True).filter(pk=agent_id).values("pk"))
        touched = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=revoked_by
        )
        if touched:
            _audit_txn(
                actor=revoked_by, action="token.revoked", token=ApiToken.objects.get(pk=token_id)
            )
            if agent_id is not None and not agent_has_live_token(agent_id):
                agent_schedules_pause_txn(agent_id, now, token=token_id, revoked_by=revoked_by)
            crash_point("token.revoked")
    return touched == 1


def token_list(limit: int = 500) -> list[ApiToken]:
    """Every token, newest first, with what it acts as (for the admins' page)."""
    return list(
        ApiToken.objects.select_related("agent", "user").order_by("-created_at", "-id")[:limit]
    )
