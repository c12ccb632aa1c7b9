"""Logging in, limited per client address and, with growing delays, per username
(runtime/ratelimits.py). Only failures count; while a limit is in force every attempt under it
is a 429 with Retry-After, the right password too (a right guess must look like a wrong one)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.api.auth import client_address
from console.web.interrupted import after_login
from runtime.ratelimits import (
    RateLimited,
    backoff_check,
    backoff_clear,
    backoff_failed,
    failure_count,
    limit_check,
    login_limits,
)


class LoginView(auth_views.LoginView):
    template_name = "console/login.html"

    def get_success_url(self) -> str:
        # A form sent while signed out comes back to its page with a message saying it was
        # not taken (console.web.interrupted).
        return after_login(super().get_success_url(), self.request)

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        per_account, per_address = login_limits()
        account = str(request.POST.get("username", "")).strip().lower()[:150] or "-"
        address = client_address(request)
        form = self.get_form()
        try:
            # While a limit is in force every attempt under it is refused, so the password is
            # not even hashed then (a flood costs no CPU); otherwise it is checked first.
            limit_check([(per_address, address)])
            backoff_check(per_account, account)
            if form.is_valid():
                backoff_clear(per_account, account)
                return self.form_valid(form)
            # The address first: a failure refused there (a flood from one address) does not
            # count against the account, so it cannot keep the account's owner waiting.
            failure_count([(per_address, address)])
            backoff_failed(per_account, account)
        except RateLimited as exc:
            response = render(
                request,
                "console/login.html",
                {"rate_limited": exc.retry_after, "next": request.POST.get("next", "/")},
                status=429,
            )
            response["Retry-After"] = str(exc.retry_after)
            return response
        return self.form_invalid(form)


class LogoutView(auth_views.LogoutView):
    """POST logs out (Django's: a link must not log anyone out); GET, a link or a typed
    address, shows a page with the button instead of a blank 405."""

    http_method_names = ["get", "post", "options"]

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return render(request, "console/logout.html")
