"""Helpers shared by the API tests: the error format check and JSON requests."""

from __future__ import annotations

import json
from typing import Any

from rest_framework.test import APIClient

TASK_FIELDS = {
    "id",
    "name",
    "condition",
    "outcome",
    "state_version",
    "attempt",
    "cancellation",
    "paused",
    "deadline",
    "pending",
    "created_at",
}

OPERATION_FIELDS = {
    "id",
    "task",
    "attempt",
    "kind",
    "tool",
    "step",
    "params",
    "params_hash",
    "idempotency_key",
    "status",
    "attempts_used",
    "max_attempts",
    "lease_generation",
    "state_version",
    "result",
    "error",
    "approval",
    "invocations",
}


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is ``status`` with the contract's error body (and ``code`` when given)."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


def post_raw(client: APIClient, path: str, raw: str | bytes, **headers: Any) -> Any:
    """POST a body exactly as given (malformed on purpose, or with a chosen encoding)."""
    return client.post(path, data=raw, content_type="application/json", **headers)


def post_json(client: APIClient, path: str, body: Any, **headers: Any) -> Any:
    return post_raw(client, path, json.dumps(body), **headers)
