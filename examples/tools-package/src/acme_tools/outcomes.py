"""How an answer (or its absence) becomes a result or a classified failure, the one decision the
console cannot make for a tool: retry (transient), give up (permanent), or hand to a person
because the effect may have happened (unknown; a ``lookup`` or ``replay`` contract lets the
console settle it itself)."""

from __future__ import annotations

from typing import Any

from acme_tools.receivers import ReceiverTimeout, Response
from runtime.tools import ToolFailure, ToolResult


def outcome(response: Response, usage: dict[str, float] | None = None) -> ToolResult:
    receipt = {"status": response.status, "body": response.body}
    if response.ok:
        return ToolResult(
            result=response.body,
            usage={"tool_calls": 1, **(usage or {})},
            receipt=receipt,
            provider_handle=str(response.body.get("id", "")),
        )
    message = f"{response.status}: {response.body.get('error', '')}"
    if response.status == 429 or response.status >= 500:
        raise ToolFailure(ToolFailure.TRANSIENT, message, receipt=receipt)
    # 4xx: this request will never succeed as it is (a stale fencing token included: a newer
    # holder of the operation's lease acted under the same key).
    raise ToolFailure(ToolFailure.PERMANENT, message, receipt=receipt)


def unanswered(exc: Exception, *, sent: bool) -> ToolFailure:
    """A call without an answer: nothing happened if it was never sent (connection refused),
    something may have if it was (a timeout, a reset)."""
    if not sent:
        return ToolFailure(ToolFailure.TRANSIENT, f"not sent: {exc}")
    return ToolFailure(ToolFailure.UNKNOWN, f"sent, no answer: {exc}")


def call(request: Any) -> Response:
    """Run ``request`` (a call to a receiver) and classify a missing answer."""
    try:
        return request()
    except ConnectionRefusedError as exc:
        raise unanswered(exc, sent=False) from exc
    except (ReceiverTimeout, ConnectionResetError) as exc:
        raise unanswered(exc, sent=True) from exc
