"""Tokens a person mints in the console (/tokens/). A token acts as whoever it names, so a
person may mint one only for themself or for a NEW agent (created here): a token acting as
another person or as an existing agent would let its minter act, and approve, as them. Every
token records its minter (``ApiToken.minted_by``), and an approval requested through it may
not be decided by that minter (runtime.policy.approval_decision_refusal). The shell's
``create_agent_token`` stays free to mint for anyone (runtime.tokens, minted by CLI)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from runtime.actors import Actor
from runtime.errors import InvalidInput, NotFound
from runtime.models import Agent, ApiToken
from runtime.policy_features import (
    can_manage_tokens,
    can_mint_agent_token,
    can_mint_user_token,
    can_rotate_agent_token,
)
from runtime.tokens import IssuedToken, agent_name_checked, token_issue_txn, token_name_checked


def token_mint_for_agent(minter: Actor, agent_name: str, token_name: str | None) -> IssuedToken:
    """A token acting as a new agent ``agent_name``, created with it; NotAuthorized when an
    agent of that name exists (or the minter may not manage tokens), and nothing is created.

    Preconditions: ``minter`` is the authenticated caller."""
    can_manage_tokens(minter)
    name = agent_name_checked(agent_name)
    token_name = token_name_checked(token_name)
    with transaction.atomic():
        # The name's unique constraint decides between concurrent mints: only the one that
        # created the agent gets a token.
        try:
            with transaction.atomic():
                agent, created = Agent.objects.get_or_create(name=name)
        except IntegrityError:
            agent, created = None, False
        can_mint_agent_token(minter, agent_is_new=created)
        return token_issue_txn(
            name=token_name or name,
            created_by=minter.label,
            minted_by=minter.key,
            acts_as=f"agent:{name}",
            agent=agent,
        )


def token_rotate_for_agent(minter: Actor, agent_id: str, token_name: str | None) -> IssuedToken:
    """A second token acting as the existing agent ``agent_id`` (rotation; by id, which a form
    carries without the hidden characters a stored name may hold): its tokens keep
    working until revoked, so the agent switches over and the old one is revoked after.
    NotFound for no such agent; NotAuthorized (nothing created) unless the minter may rotate
    (runtime.policy_features.can_rotate_agent_token). Preconditions as for
    ``token_mint_for_agent``."""
    can_manage_tokens(minter)
    token_name = token_name_checked(token_name)
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None:
        raise NotFound(f"no agent {agent_id!r}")
    name = agent.name
    can_rotate_agent_token(minter, agent_has_token=ApiToken.objects.filter(agent=agent).exists())
    with transaction.atomic():
        return token_issue_txn(
            name=token_name or f"{name} (rotation)",
            created_by=minter.label,
            minted_by=minter.key,
            acts_as=f"agent:{name}",
            agent=agent,
        )


def token_mint_for_user(minter: Actor, username: str, token_name: str | None) -> IssuedToken:
    """A token acting as ``minter`` themself (``username`` must be theirs); NotAuthorized for
    anyone else, and nothing is created. Preconditions as for ``token_mint_for_agent``."""
    can_manage_tokens(minter)
    token_name = token_name_checked(token_name)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise InvalidInput(f"no user named {username!r}")
    can_mint_user_token(minter, user.pk)
    with transaction.atomic():
        return token_issue_txn(
            name=token_name or f"{username} script",
            created_by=minter.label,
            minted_by=minter.key,
            acts_as=f"user:{username}",
            user=user,
        )
