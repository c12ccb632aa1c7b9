"""API token management for admins (/tokens/): create (shown once), list, rotate, revoke. The
right is can_manage_tokens, asked here and before each change; a token acts only as the admin
who mints it, as a new agent, or as an agent that holds a token already (rotation; the
policy_features.can_mint_* and can_rotate_* rights); the changes are audited by the token
services."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from console.web.views import console_view
from runtime import token_minting, tokens
from runtime.actors import Actor
from runtime.errors import InvalidInput, NotAuthorized, NotFound
from runtime.models import Agent, ApiToken
from runtime.policy_features import can_manage_tokens


def _page(
    request: HttpRequest, issued: tokens.IssuedToken | None = None, status: int = 200
) -> HttpResponse:
    response = render(
        request,
        "console/tokens.html",
        {"tokens": tokens.token_list(), "issued": issued},
        status=status,
    )
    # The one page that ever holds a token in clear: never cached anywhere.
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@console_view
def token_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    can_manage_tokens(actor)
    if request.method != "POST":
        return _page(request)
    kind = request.POST.get("kind", "")
    subject = request.POST.get("subject", "").strip()
    name = request.POST.get("name", "").strip() or None
    # A person mints only for themself, for a new agent, or a second token for an agent that
    # holds one (rotation); the services ask the policy.
    if kind == "agent":
        try:
            issued = token_minting.token_mint_for_agent(actor, subject, name)
        except NotAuthorized:
            if not Agent.objects.filter(name=subject).exists():
                raise
            # Not a dead end: the page, with the way to what was probably meant.
            messages.error(
                request,
                f"Nothing was created: an agent named '{subject}' exists. To give it a second "
                "token, use “New token” on its row below (rotation: its old token keeps "
                "working until you revoke it).",
            )
            return _page(request, status=403)
    elif kind == "rotate":
        issued = token_minting.token_rotate_for_agent(actor, subject, name)
    elif kind == "user":
        issued = token_minting.token_mint_for_user(actor, subject, name)
    else:
        raise InvalidInput("kind must be agent, rotate or user")
    return _page(request, issued)


@require_POST
@console_view
def token_revoke(request: HttpRequest, actor: Actor, token_id: str) -> HttpResponse:
    can_manage_tokens(actor)
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFound("no such token")
    if tokens.token_revoke(token.pk, revoked_by=actor.label):
        messages.success(
            request,
            f"The token '{token.name}' ({token.prefix}) is revoked: its next request is refused "
            "and its open event streams end.",
        )
    else:
        messages.info(
            request,
            f"The token '{token.name}' ({token.prefix}) was already revoked: nothing changed.",
        )
    return HttpResponseRedirect("/tokens/")
