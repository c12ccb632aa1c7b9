"""Notifications in the console: /notifications/ (each notification and its delivery, the
message's operation linked), /settings/notifications/ (a person's channels and quiet hours;
admins' webhooks, their signing secret shown once), and the task page's Watch button."""

from __future__ import annotations

from datetime import time as dtime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.web.views import console_view
from runtime import policy
from runtime.actors import Actor
from runtime.errors import InvalidInput
from runtime.models import NotificationEndpoint
from runtime.models.notifications import Channel, NotificationKind
from runtime.notifications import endpoints, people, trial
from runtime.policy_features import can_manage_notification_endpoints
from runtime.selectors import notifications


@require_GET
@console_view
def notifications_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    rows = notifications.notification_list(actor)
    names = notifications.recipient_names(rows)
    for row in rows:
        row.recipient_name = names.get(row.recipient, row.recipient)  # type: ignore[attr-defined]
        row.delivery_reason = notifications.delivery_reason(row)  # type: ignore[attr-defined]
    return render(request, "console/notifications.html", {"rows": rows})


def _clock(raw: str, field: str) -> dtime | None:
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        return dtime.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(f"{field} must be a time (HH:MM)", field=field) from None


def _settings_page(
    request: HttpRequest,
    actor: Actor,
    *,
    issued: tuple[NotificationEndpoint, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    admin = policy.allowed(can_manage_notification_endpoints, actor)
    context: dict[str, Any] = {
        "pref": notifications.preference_get(actor),
        "account_email": getattr(request.user, "email", ""),
        "admin": admin,
        "endpoints": notifications.endpoint_list(actor) if admin else [],
        "env_endpoints": notifications.env_endpoints_summary() if admin else [],
        "kinds": NotificationKind.ALL,
        "formats": (Channel.WEBHOOK, Channel.SLACK),
        "issued": issued,
    }
    response = render(request, "console/notification_settings.html", context, status=status)
    if issued is not None:
        # The one answer that holds a webhook's signing secret: never cached.
        response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@console_view
def notification_settings(request: HttpRequest, actor: Actor) -> HttpResponse:
    if request.method != "POST":
        return _settings_page(request, actor)
    people.preference_save(
        actor,
        email_enabled=request.POST.get("email_enabled") == "1",
        email=request.POST.get("email", "")[:300],
        quiet_start=_clock(request.POST.get("quiet_start", ""), "quiet_start"),
        quiet_end=_clock(request.POST.get("quiet_end", ""), "quiet_end"),
        tz=request.POST.get("timezone", "UTC").strip()[:64] or "UTC",
    )
    messages.success(request, "Your notification settings are saved.")
    return HttpResponseRedirect("/settings/notifications/")


@require_POST
@console_view
def endpoint_add(request: HttpRequest, actor: Actor) -> HttpResponse:
    endpoint, secret = endpoints.endpoint_create(
        actor,
        name=request.POST.get("name", "")[:200],
        url=request.POST.get("url", "")[:2100],
        fmt=request.POST.get("format", ""),
        kinds=[k for k in request.POST.getlist("kinds") if k][:10],
    )
    return _settings_page(request, actor, issued=(endpoint, secret))


@require_POST
@console_view
def endpoint_remove(request: HttpRequest, actor: Actor, endpoint_id: str) -> HttpResponse:
    endpoints.endpoint_remove(actor, endpoint_id)
    messages.success(request, "The webhook is removed: nothing more is sent to it.")
    return HttpResponseRedirect("/settings/notifications/")


def _said(request: HttpRequest, channel: str, outcome: trial.TrialOutcome) -> None:
    if outcome.delivered:
        messages.success(request, f"Test {channel} delivered to {outcome.where}: {outcome.detail}.")
    else:
        messages.error(request, f"Test {channel} to {outcome.where} failed: {outcome.detail}.")


@require_POST
@console_view
def email_test(request: HttpRequest, actor: Actor) -> HttpResponse:
    try:
        _said(request, "e-mail", trial.email_trial(actor))
    except InvalidInput as exc:
        messages.error(request, f"No test e-mail was sent: {exc.message}.")
    return HttpResponseRedirect("/settings/notifications/")


@require_POST
@console_view
def endpoint_test(request: HttpRequest, actor: Actor, endpoint_id: str) -> HttpResponse:
    _said(request, "post", trial.endpoint_trial(actor, endpoint_id))
    return HttpResponseRedirect("/settings/notifications/")


@require_POST
@console_view
def task_watch(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    watch = request.POST.get("watch") == "1"
    people.task_watch_set(actor, task_id, watch=watch)
    messages.success(
        request,
        "You watch this task: its notifications reach you too."
        if watch
        else "You no longer watch this task.",
    )
    return HttpResponseRedirect(f"/tasks/{task_id}/")
