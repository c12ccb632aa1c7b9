"""Logging in, limited per account and per client address (runtime/ratelimits.py): a refused
attempt is a 429 with Retry-After and the password is not even checked."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.api.auth import client_address
from runtime.ratelimits import RateLimited, attempt_begin, attempt_succeeded, login_limits


class LoginView(auth_views.LoginView):
    template_name = "console/login.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        per_account, per_address = login_limits()
        account = str(request.POST.get("username", "")).strip().lower()[:150] or "-"
        try:
            held = attempt_begin([(per_account, account), (per_address, client_address(request))])
        except RateLimited as exc:
            response = render(
                request,
                "console/login.html",
                {"rate_limited": exc.retry_after, "next": request.POST.get("next", "/")},
                status=429,
            )
            response["Retry-After"] = str(exc.retry_after)
            return response
        response = super().post(request, *args, **kwargs)
        if request.user.is_authenticated:
            attempt_succeeded(held)
        return response
