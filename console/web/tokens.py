"""API token management for admins (/tokens/): create (shown once), list, revoke. The right is
can_manage_tokens, asked here and before each change; a token acts only as the admin
who mints it or as a new agent (policy.can_mint_*); the changes are audited by the token
services."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from console.web.views import console_view
from runtime import token_minting, tokens
from runtime.actors import Actor
from runtime.errors import InvalidInput, NotFound
from runtime.models import ApiToken
from runtime.policy_features import can_manage_tokens


def _page(request: HttpRequest, issued: tokens.IssuedToken | None = None) -> HttpResponse:
    response = render(
        request, "console/tokens.html", {"tokens": tokens.token_list(), "issued": issued}
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
    # A person mints only for themself or for a new agent (the services ask the policy).
    if kind == "agent":
        issued = token_minting.token_mint_for_agent(actor, subject, name)
    elif kind == "user":
        issued = token_minting.token_mint_for_user(actor, subject, name)
    else:
        raise InvalidInput("kind must be agent or user")
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
