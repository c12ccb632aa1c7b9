"""The console pages' one gate: a signed-in person with a console role (below the views, which
import it, and the views' helpers, which import it too)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import render

from console.web.interrupted import login_next
from runtime import policy
from runtime.actors import actor_for_user

View = Callable[..., HttpResponse]


def console_view(view: View) -> View:
    """Login required, and a console role (operator, support or admin) to see anything."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            # A form sent signed out goes back to its page after the login, marked not taken
            # (console.web.interrupted); a page comes back to itself.
            return redirect_to_login(login_next(request))
        actor = actor_for_user(int(str(request.user.pk)), request.user.get_username())
        if not policy.allowed(policy.can_use_console, actor):
            return HttpResponseForbidden(
                render(request, "console/forbidden.html", status=403).content
            )
        # Refusals (NotFound, DomainError, DataError) raised here become a 4xx page in
        # console.middleware.ErrorMappingMiddleware, the one mapping pages share with the API.
        return view(request, actor, *args, **kwargs)

    return wrapper
