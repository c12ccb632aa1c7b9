"""Where notifications go and with which secret, without keeping a secret in clear.

- The environment's endpoints: NOTIFY_WEBHOOK_URL signed with NOTIFY_WEBHOOK_SECRET, and
  NOTIFY_SLACK_WEBHOOK_URL (a Slack URL is itself the credential). Nothing of them is stored.
- An admin's endpoints (``NotificationEndpoint``): the URL is sealed (Fernet, a key derived from
  NOTIFY_KEYS or SECRET_KEY: runtime/keyring.py); the signing secret is never stored: it is an
  HMAC of the server's key over the endpoint's id and secret version, shown to the admin once,
  and rotated by bumping the version.
- Webhooks reach only globally routable addresses unless NOTIFY_ALLOW_PRIVATE_HOSTS=1: the
  address guard of runtime.address_guard (shared with declared HTTP tools; its functions are
  offered here too, as they were first written here)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from cryptography.fernet import InvalidToken, MultiFernet
from django.conf import settings

from runtime.address_guard import (
    PrivateHost,
    address_refused,
    host_addresses,
    url_hint,
    url_validate,
)
from runtime.errors import InvalidInput
from runtime.keyring import keyring, sealer
from runtime.models import NotificationEndpoint
from runtime.models.notifications import Channel

ENV_WEBHOOK = "env-webhook"
ENV_SLACK = "env-slack"
_DOMAIN = b"agent-console notification endpoints"


@dataclass(frozen=True)
class Endpoint:
    id: str
    name: str
    format: str  # webhook | slack
    url: str
    secret: bytes  # empty for Slack (its URL is the credential)
    kinds: tuple[str, ...] = ()


def _keys() -> list[bytes]:
    return keyring("NOTIFY_KEYS", _DOMAIN)


def _fernet() -> MultiFernet:
    return sealer("NOTIFY_KEYS", _DOMAIN)


def url_seal(url: str) -> str:
    return _fernet().encrypt(url.encode()).decode()


def url_open(sealed: str) -> str:
    try:
        return _fernet().decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise InvalidInput("the endpoint's URL cannot be opened with the server's keys") from None


def endpoint_secret(endpoint_id: str, version: int) -> bytes:
    """The signing secret of an admin's endpoint: derived, never stored (hex, as shown)."""
    mac = hmac.new(_keys()[0], f"secret:{endpoint_id}:v{version}".encode(), hashlib.sha256)
    return mac.hexdigest().encode()


def endpoints() -> list[Endpoint]:
    """Every endpoint notifications go to: the environment's, then the admins' active ones."""
    found: list[Endpoint] = []
    if settings.NOTIFY_WEBHOOK_URL:
        found.append(
            Endpoint(
                ENV_WEBHOOK,
                "NOTIFY_WEBHOOK_URL",
                Channel.WEBHOOK,
                settings.NOTIFY_WEBHOOK_URL,
                settings.NOTIFY_WEBHOOK_SECRET.encode(),
            )
        )
    if settings.NOTIFY_SLACK_WEBHOOK_URL:
        found.append(
            Endpoint(
                ENV_SLACK,
                "NOTIFY_SLACK_WEBHOOK_URL",
                Channel.SLACK,
                settings.NOTIFY_SLACK_WEBHOOK_URL,
                b"",
            )
        )
    for row in NotificationEndpoint.objects.filter(active=True).order_by("created_at"):
        found.append(_from_row(row))
    return found


def _from_row(row: NotificationEndpoint) -> Endpoint:
    secret = endpoint_secret(row.pk, row.secret_version) if row.format == Channel.WEBHOOK else b""
    return Endpoint(
        row.pk, row.name, row.format, url_open(row.url_sealed), secret, tuple(row.kinds or ())
    )


def endpoint_get(endpoint_id: str) -> Endpoint | None:
    """One endpoint by id, as it is now (None once it was removed or switched off)."""
    for endpoint in endpoints():
        if endpoint.id == endpoint_id:
            return endpoint
    return None


__all__ = [
    "ENV_SLACK",
    "ENV_WEBHOOK",
    "Endpoint",
    "PrivateHost",
    "address_refused",
    "endpoint_get",
    "endpoint_secret",
    "endpoints",
    "host_addresses",
    "url_hint",
    "url_open",
    "url_seal",
    "url_validate",
]
