"""A test message on each channel, sent at once from /settings/notifications/, so whoever sets a
channel up sees whether it works (and why not) before a real notification depends on it.

It goes through the channel's own adapter (runtime/tools/notify.py: the address guard, the
signature, the mail backend), under a key of its own, but as no operation: a test is no work of
any task and is never retried. Each test is audited with who sent it and what came of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import InvalidInput, NotFound
from runtime.ids import new_id
from runtime.models import AuditRecord, NotificationPreference
from runtime.models.notifications import Channel
from runtime.notifications.people import email_address
from runtime.notify_secrets import endpoint_get, url_hint
from runtime.policy_features import can_manage_notification_endpoints
from runtime.selectors.notifications import person_of
from runtime.tools.base import InvocationContext, ToolFailure
from runtime.tools.notify import EmailNotify, SlackNotify, WebhookNotify

_TEXT = "Test from the agent console, sent by {who}: this channel works."


@dataclass(frozen=True)
class TrialOutcome:
    """What came of a test: ``delivered`` or not, to ``where`` (an address or a host), and
    ``detail`` (the receiver's answer, or why it failed, in the adapter's words)."""

    delivered: bool
    where: str
    detail: str


def _context(params: dict[str, Any]) -> InvocationContext:
    return InvocationContext(
        operation_id="",
        task_id="",
        step="notify.test",
        idempotency_key=new_id("ntest"),
        params=dict(params),
        fencing_token=0,
        invocation_number=1,
        deadline=None,
    )


def _audit(actor: Actor, subject: str, channel: str, outcome: TrialOutcome) -> None:
    AuditRecord.objects.create(
        at=timezone.now(),
        actor=actor.label,
        action="notification.test",
        subject=subject,
        detail={
            "channel": channel,
            "where": outcome.where,
            "delivered": outcome.delivered,
            "detail": outcome.detail[:500],
        },
    )


def email_trial(actor: Actor) -> TrialOutcome:
    """A test e-mail to the person's own address (their settings', else their account's).
    Preconditions: a console person; InvalidInput when they have no address or switched e-mail
    off."""
    user_id = person_of(actor)
    user = get_user_model().objects.get(pk=user_id)
    pref = NotificationPreference.objects.filter(user_id=user_id).first()
    address = email_address(user, pref)
    if not address:
        raise InvalidInput(
            "there is no address to send to: switch e-mail on and give an address first",
            field="email",
        )
    ctx = _context(
        {"to": [address], "subject": "[agent console] Test", "body": _TEXT.format(who=actor.label)}
    )
    try:
        EmailNotify().invoke(ctx)
        outcome = TrialOutcome(True, address, _mailbox())
    except ToolFailure as exc:
        outcome = TrialOutcome(False, address, exc.message)
    _audit(actor, f"user:{user_id}", Channel.EMAIL, outcome)
    return outcome


def _mailbox() -> str:
    """Where a sent message went, in words (the file backend's directory in `make run`)."""
    if settings.EMAIL_BACKEND.endswith("filebased.EmailBackend"):
        return f"written to {settings.EMAIL_FILE_PATH}"
    if settings.EMAIL_BACKEND.endswith("smtp.EmailBackend"):
        return f"accepted by {settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
    return "handed to the mail backend"


def endpoint_trial(actor: Actor, endpoint_id: str) -> TrialOutcome:
    """A signed test post to one webhook (an admin's or the environment's). Preconditions: the
    actor manages notification endpoints; NotFound for an endpoint that is not active."""
    can_manage_notification_endpoints(actor)
    endpoint = endpoint_get(endpoint_id)
    if endpoint is None:
        raise NotFound("no such endpoint")
    text = _TEXT.format(who=actor.label)
    adapter: WebhookNotify | SlackNotify
    params: dict[str, Any]
    if endpoint.format == Channel.SLACK:
        adapter, params = SlackNotify(), {"endpoint": endpoint.id, "text": text}
    else:
        payload = {"kind": "test", "digest": False, "text": text, "items": []}
        adapter, params = WebhookNotify(), {"endpoint": endpoint.id, "payload": payload}
    where = url_hint(endpoint.url)
    try:
        result = adapter.invoke(_context(params))
        outcome = TrialOutcome(True, where, f"it answered HTTP {result.result['status']}")
    except ToolFailure as exc:
        outcome = TrialOutcome(False, where, exc.message)
    _audit(actor, f"endpoint:{endpoint.id}", endpoint.format, outcome)
    return outcome
