"""Lease tokens, derived rather than random, so that no copy of one is ever kept.

A claim's token is ``<key id>.<HMAC-SHA256(key, operation, claim nonce, execution)>`` under the
first key of ``LEASE_TOKEN_KEYS``. The operation row keeps only its SHA-256 digest (fencing
compares digests); a stored idempotent response keeps a placeholder naming the public inputs
(``lease_token_placeholder``), and a replay derives the same token again
(``lease_token_restore``). Neither the database nor a log ever holds the token itself: without
the server key the placeholder and the digest are useless.

The nonce stands in for the lease generation: the common claim is one statement that computes
the next generation itself, and it must be handed the token's digest before it runs. The nonce
is random per claim, so two claims never share a token, and the generation is fenced
separately by every check anyway.

Rotation: the first key signs, every listed key verifies. Add the new key first and keep the
old one for as long as a lease or a replayable claim may last; dropping a key ends every token
it signed (their next heartbeat or report is a stale lease, 409)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

from runtime.keyring import key_id as keyring_key_id
from runtime.keyring import keyring

PLACEHOLDER = "$derived"
KIND = "lease_token"
# Never a stored digest (those start "sha256:"): what a token of a dropped key compares as.
RETIRED = "retired"


class LeaseToken(str):
    """A lease token (a plain string to every caller) that also knows its ``placeholder``: the
    public inputs it was derived from, which is what a stored response keeps instead of it."""

    placeholder: dict[str, str]


# The domain tag of the lease-token keys (runtime.keyring): keys and key ids as before the
# key-list rule moved there, so tokens already issued stay valid.
_DOMAIN = b"runtime.lease-token-key"


def _keys() -> list[bytes]:
    """The keys, signing key first (LEASE_TOKEN_KEYS, else derived from SECRET_KEY)."""
    return keyring("LEASE_TOKEN_KEYS", _DOMAIN)


def _key_id(key: bytes) -> str:
    # Public: names which key signed, and reveals nothing of it.
    return keyring_key_id(key, _DOMAIN)


def _derive(key: bytes, key_id: str, operation: str, nonce: str, execution: str) -> LeaseToken:
    message = "\x00".join(("lease", operation, nonce, execution)).encode()
    mac = hmac.new(key, message, hashlib.sha256).digest()
    token = LeaseToken(f"{key_id}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}")
    token.placeholder = {
        PLACEHOLDER: KIND,
        "operation": operation,
        "nonce": nonce,
        "execution": execution,
        "key": key_id,
    }
    return token


def lease_token_mint(operation: str, execution: str) -> LeaseToken:
    """A fresh token for a claim of ``operation`` (a batch claim passes "") by ``execution``,
    signed with the current signing key."""
    key = _keys()[0]
    return _derive(key, _key_id(key), operation, secrets.token_urlsafe(16), execution)


def lease_token_digest(token: str) -> str:
    """What the operation row keeps and fencing compares. A token whose key is no longer listed
    gets ``RETIRED``, which matches no row, so the caller's lease is stale. Tokens without a key
    id (random ones issued before tokens were derived) compare by their digest alone."""
    key_id, dot, _ = token.partition(".")
    if dot and key_id not in {_key_id(k) for k in _keys()}:
        return RETIRED
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def lease_token_placeholder(value: Any) -> Any:
    """``value`` (a response body) with every lease token replaced by its placeholder: what may
    be stored."""
    if isinstance(value, LeaseToken):
        return dict(value.placeholder)
    if isinstance(value, dict):
        return {k: lease_token_placeholder(v) for k, v in value.items()}
    if isinstance(value, list):
        return [lease_token_placeholder(v) for v in value]
    return value


def lease_token_restore(value: Any) -> tuple[Any, bool]:
    """``value`` (a stored body) with every placeholder derived into its token again, and
    whether all could be: False when a placeholder's key was dropped (or the placeholder
    was written for a token that was never kept), so the token it stood for no longer works."""
    if isinstance(value, dict):
        if value.get(PLACEHOLDER) == KIND:
            keys = {_key_id(k): k for k in _keys()}
            key = keys.get(str(value.get("key", "")))
            if key is None:
                return None, False
            fields = [str(value.get(f, "")) for f in ("operation", "nonce", "execution")]
            return str(_derive(key, _key_id(key), *fields)), True
        restored: dict[str, Any] = {}
        whole = True
        for k, v in value.items():
            restored[k], ok = lease_token_restore(v)
            whole = whole and ok
        return restored, whole
    if isinstance(value, list):
        items = [lease_token_restore(v) for v in value]
        return [v for v, _ in items], all(ok for _, ok in items)
    return value, True
