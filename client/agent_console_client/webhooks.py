"""Checking a notification webhook's signature (docs/notifications.md).

The console signs each POST with HMAC-SHA256 under the webhook's secret over the
``X-Console-Timestamp`` header, a ``.`` and the raw body, sent as ``X-Console-Signature:
v1=<hex>``. A receiver recomputes it over the bytes it received, compares in constant time, and
refuses a timestamp older (or newer) than its tolerance, so a captured request cannot be
replayed later. Deduplicate by the ``Idempotency-Key`` header: a retry carries the same one."""

from __future__ import annotations

import hashlib
import hmac
import time

DEFAULT_TOLERANCE_SECONDS = 300


def webhook_signature_valid(
    secret: str | bytes,
    *,
    timestamp: str,
    body: bytes,
    signature: str,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether ``signature`` (the X-Console-Signature header, ``v1=<hex>``; several
    comma-separated values are accepted) signs ``body`` at ``timestamp`` under ``secret``, and
    ``timestamp`` is within ``tolerance_seconds`` of ``now``."""
    key = secret.encode() if isinstance(secret, str) else secret
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - sent_at) > tolerance_seconds:
        return False
    expected = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    for part in (signature or "").split(","):
        scheme, _, value = part.strip().partition("=")
        if scheme == "v1" and hmac.compare_digest(value, expected):
            return True
    return False
