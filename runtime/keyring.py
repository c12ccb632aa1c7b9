"""Key lists for the server's HMACs (lease tokens, approval seals) and seals (Fernet: admins'
webhook URLs, declared tools' secrets): one rule for where keys come from and how a key is
named, so every keyed digest and every seal rotates the same way.

A list setting holds the keys: the first signs, every listed key verifies. Unset, the keys are
derived from ``SECRET_KEY`` and its ``SECRET_KEY_FALLBACKS`` under a domain tag (so two uses
never share a key, and Django's own rotation of SECRET_KEY carries them over)."""

from __future__ import annotations

import base64
import hashlib
import hmac

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings


def keyring(setting: str, domain: bytes) -> list[bytes]:
    """The keys of ``setting`` (a list of strings), signing key first; when it is empty, one key
    per SECRET_KEY (current first, then its fallbacks) derived under ``domain``."""
    configured = list(getattr(settings, setting, None) or [])
    if not configured:
        bases = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
        configured = [hmac.new(str(b).encode(), domain, hashlib.sha256).hexdigest() for b in bases]
    return [str(k).encode() for k in configured]


def key_id(key: bytes, domain: bytes) -> str:
    """A public name for ``key`` within ``domain``: says which key signed, reveals nothing of it."""
    return hashlib.sha256(domain + b"-id:" + key).hexdigest()[:10]


def sealer(setting: str, domain: bytes) -> MultiFernet:
    """Fernet over the keys of ``setting`` (``keyring``): the first seals, every one opens, so
    a new key is put first and the old one kept until what it sealed was sealed again."""
    return MultiFernet(
        [
            Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"seal:" + key).digest()))
            for key in keyring(setting, domain)
        ]
    )
