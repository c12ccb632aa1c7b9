"""Admins' webhooks: added and removed (audited, the URL sealed, the signing secret shown
once), and the environment's endpoints as the settings page shows them."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import InvalidInput, NotFound
from runtime.ids import new_id
from runtime.models import AuditRecord, NotificationEndpoint
from runtime.models.notifications import Channel, NotificationKind
from runtime.notify_secrets import endpoint_secret, url_hint, url_seal, url_validate
from runtime.policy_features import can_manage_notification_endpoints

K = NotificationKind


def endpoint_create(
    actor: Actor, *, name: str, url: str, fmt: str, kinds: list[str]
) -> tuple[NotificationEndpoint, str]:
    """An admin adds a webhook (``fmt`` webhook, signed; or slack). Returns the endpoint and,
    for a signed webhook, its signing secret: shown this once, never stored (derived)."""
    can_manage_notification_endpoints(actor)
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidInput("name is required (at most 100 characters)", field="name")
    if fmt not in (Channel.WEBHOOK, Channel.SLACK):
        raise InvalidInput("format must be webhook or slack", field="format")
    url = url_validate(url)
    unknown = set(kinds) - set(K.ALL)
    if unknown:
        raise InvalidInput(f"unknown kinds: {', '.join(sorted(unknown))}", field="kinds")
    now = timezone.now()
    with transaction.atomic():
        endpoint = NotificationEndpoint.objects.create(
            id=new_id("nep"),
            name=name,
            format=fmt,
            url_sealed=url_seal(url),
            url_hint=url_hint(url),
            kinds=sorted(set(kinds)),
            created_by=actor.label,
            created_at=now,
        )
        _endpoint_audit_txn(actor, "endpoint.added", endpoint, now)
    secret = (
        endpoint_secret(endpoint.pk, endpoint.secret_version).decode()
        if fmt == Channel.WEBHOOK
        else ""
    )
    return endpoint, secret


def endpoint_remove(actor: Actor, endpoint_id: str) -> None:
    can_manage_notification_endpoints(actor)
    with transaction.atomic():
        endpoint = (
            NotificationEndpoint.objects.select_for_update()
            .filter(pk=endpoint_id, active=True)
            .first()
        )
        if endpoint is None:
            raise NotFound("no such endpoint")
        NotificationEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
        _endpoint_audit_txn(actor, "endpoint.removed", endpoint, timezone.now())


def _endpoint_audit_txn(
    actor: Actor, action: str, endpoint: NotificationEndpoint, now: datetime
) -> None:
    """Who changed where notifications go (they carry links to approvals): an access change,
    kept with the tokens' in the audit records, never the URL itself (sealed)."""
    AuditRecord.objects.create(
        at=now,
        actor=actor.label,
        action=action,
        subject=f"endpoint:{endpoint.pk}",
        detail={"name": endpoint.name, "format": endpoint.format, "url": endpoint.url_hint},
    )
