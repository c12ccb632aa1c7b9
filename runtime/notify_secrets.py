"""Where notifications go and with which secret, without keeping a secret in clear.

- The environment's endpoints: NOTIFY_WEBHOOK_URL signed with NOTIFY_WEBHOOK_SECRET, and
  NOTIFY_SLACK_WEBHOOK_URL (a Slack URL is itself the credential). Nothing of them is stored.
- An admin's endpoints (``NotificationEndpoint``): the URL is sealed (Fernet, a key derived from
  NOTIFY_KEYS or SECRET_KEY: runtime/keyring.py); the signing secret is never stored: it is an
  HMAC of the server's key over the endpoint's id and secret version, shown to the admin once,
  and rotated by bumping the version.
- Webhooks never reach private, loopback or link-local addresses (every address the host
  resolves to is checked, and the connection goes to a checked address) unless
  NOTIFY_ALLOW_PRIVATE_HOSTS=1."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from runtime.errors import InvalidInput
from runtime.keyring import keyring
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
    return MultiFernet(
        [
            Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"seal:" + key).digest()))
            for key in _keys()
        ]
    )


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


def url_validate(url: str) -> str:
    """An http(s) URL with a host, returned stripped; InvalidInput naming ``url`` otherwise."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
        raise InvalidInput("url must be an http:// or https:// URL with a host", field="url")
    return url


def url_hint(url: str) -> str:
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/…"


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


class PrivateHost(Exception):
    """The host resolves to an address notifications may not reach."""


def _private(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def host_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, each checked: PrivateHost when any of them is
    private, loopback or link-local (a name that resolves to both kinds is refused too),
    unless NOTIFY_ALLOW_PRIVATE_HOSTS. OSError when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not settings.NOTIFY_ALLOW_PRIVATE_HOSTS:
        refused = [a for a in addresses if _private(a)]
        if refused:
            raise PrivateHost(
                f"{host} resolves to a private, loopback or link-local address ({refused[0]}); "
                "set NOTIFY_ALLOW_PRIVATE_HOSTS=1 to allow it"
            )
    return addresses
