"""Notification adapters: a message to a person or a webhook, as an operation like any effect
(claimed under a lease, its key passed to the receiver, retried with backoff, never sent inside
a transaction). The message was rendered into the parameters when it was dispatched
(runtime.notifications), so every retry sends the same thing under the same key.

- ``notify.email``: Django's email framework (SMTP in services mode). The key travels as the
  ``Message-ID`` (derived from it) and an ``Idempotency-Key`` header: a receiver that dedupes by
  either shows a retried message once (contract ``replay``).
- ``notify.webhook``: HTTP POST of JSON, signed (HMAC-SHA256 over ``timestamp.body``), with the
  key in ``Idempotency-Key`` (contract ``replay``: the receiver dedupes by it).
- ``notify.slack``: Slack's incoming-webhook format. Slack keeps no key, so an unconfirmed post
  goes to a person like any receiver without a promise (contract ``none``)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from runtime.notify_secrets import Endpoint, endpoint_get
from runtime.tools.base import Contract, InvocationContext, ToolAdapter, ToolFailure, ToolResult
from runtime.tools.base import register as _register
from runtime.tools.outbound import Answer, answer_check, http_request

SIGNATURE_HEADER = "X-Console-Signature"
TIMESTAMP_HEADER = "X-Console-Timestamp"


def webhook_signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """``v1=<hex>``: HMAC-SHA256 under ``secret`` over ``timestamp`` "." ``body`` (the
    verification recipe in docs/notifications.md and agent_console_client.webhooks)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def message_id(key: str) -> str:
    """A Message-ID made from the idempotency key: a retry is the same message."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:40]
    return f"<{digest}@agent-console>"


_STRING_LIST = {"type": "array", "items": {"type": "string", "maxLength": 300}, "maxItems": 50}


class EmailNotify(ToolAdapter):
    name = "notify.email"
    contract = Contract.REPLAY
    max_attempts = 8
    max_elapsed_seconds = 24 * 3600.0
    tool_class = "notify"
    system_only = True
    description = "Send a notification email (the console's own; dispatched by the runtime)."
    params_schema = {
        "type": "object",
        "required": ["to", "subject", "body"],
        "properties": {
            "to": _STRING_LIST,
            "subject": {"type": "string", "maxLength": 300},
            "body": {"type": "string", "maxLength": 100000},
            "kind": {"type": "string"},
            "notifications": _STRING_LIST,
        },
    }

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        params = ctx.params
        message = EmailMessage(
            subject=str(params["subject"]),
            body=str(params["body"]),
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=list(params["to"]),
            headers={
                "Message-ID": message_id(ctx.idempotency_key),
                "Idempotency-Key": ctx.idempotency_key,
            },
        )
        try:
            connection = get_connection(fail_silently=False)
            sent = connection.send_messages([message])
        except (ConnectionRefusedError, socket.gaierror) as exc:
            # Nothing reached a server: safe to try again later.
            raise ToolFailure(ToolFailure.TRANSIENT, f"mail server unreachable: {exc}") from None
        except Exception as exc:
            # The server may have taken it: unknown, and the contract (replay) retries under the
            # same Message-ID.
            raise ToolFailure(ToolFailure.UNKNOWN, f"sending mail failed: {exc!r}"[:500]) from None
        return ToolResult(
            result={"sent": int(sent or 0), "message_id": message_id(ctx.idempotency_key)},
            receipt={"to": list(params["to"])},
            provider_handle=message_id(ctx.idempotency_key),
        )


def _post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` to ``url`` through the address guard (runtime.tools.outbound), with the
    notifications' switch and timeout; a status other than 2xx raises ToolFailure."""
    answer = http_request(
        "POST",
        url,
        body=body,
        headers=headers,
        timeout=float(settings.NOTIFY_WEBHOOK_TIMEOUT_SECONDS),
    )
    answer_check(answer)
    return answer


def _endpoint(ctx: InvocationContext, fmt: str) -> Endpoint:
    endpoint = endpoint_get(str(ctx.params.get("endpoint", "")))
    if endpoint is None or endpoint.format != fmt:
        raise ToolFailure(ToolFailure.PERMANENT, "the endpoint was removed or switched off")
    return endpoint


class WebhookNotify(ToolAdapter):
    name = "notify.webhook"
    contract = Contract.REPLAY
    max_attempts = 8
    max_elapsed_seconds = 24 * 3600.0
    tool_class = "notify"
    system_only = True
    description = "Post a signed notification to a webhook (dispatched by the runtime)."
    params_schema = {
        "type": "object",
        "required": ["endpoint", "payload"],
        "properties": {"endpoint": {"type": "string"}, "payload": {"type": "object"}},
    }

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        endpoint = _endpoint(ctx, "webhook")
        body = json.dumps(
            {"id": ctx.idempotency_key, **ctx.params["payload"]},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": ctx.idempotency_key,
            TIMESTAMP_HEADER: timestamp,
            "User-Agent": "agent-console-notify/1",
        }
        if endpoint.secret:
            headers[SIGNATURE_HEADER] = webhook_signature(endpoint.secret, timestamp, body)
        answer = _post(endpoint.url, body, headers)
        return ToolResult(result={"status": answer.status}, receipt={"endpoint": endpoint.id})


class SlackNotify(ToolAdapter):
    name = "notify.slack"
    contract = Contract.NONE
    max_attempts = 8
    max_elapsed_seconds = 24 * 3600.0
    tool_class = "notify"
    system_only = True
    description = "Post a notification to a Slack incoming webhook (dispatched by the runtime)."
    params_schema = {
        "type": "object",
        "required": ["endpoint", "text"],
        "properties": {"endpoint": {"type": "string"}, "text": {"type": "string"}},
    }

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        endpoint = _endpoint(ctx, "slack")
        body = json.dumps({"text": ctx.params["text"]}).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": ctx.idempotency_key}
        answer = _post(endpoint.url, body, headers)
        return ToolResult(result={"status": answer.status}, receipt={"endpoint": endpoint.id})


for _adapter in (EmailNotify(), WebhookNotify(), SlackNotify()):
    _register(_adapter)
