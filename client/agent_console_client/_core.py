"""The one core both clients share, free of I/O: each verb is a ``Call`` (what to send, how to
read the answer), plus the retry rule, the error mapping and the server-sent events parser. The
sync and async clients only move bytes."""

from __future__ import annotations

import email.utils
import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from agent_console_client import errors
from agent_console_client._generated.nullable import NOT_NULLABLE
from agent_console_client.models import (
    Approval,
    Artifact,
    Budget,
    Event,
    EventPage,
    HeartbeatAnswer,
    LeaseGrant,
    Operation,
    SignalAnswer,
    Task,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

API = "/api/v1"
USER_AGENT = "agent-console-client/0.1"
# A stream's read timeout: the server sends a keepalive after 15 quiet seconds.
STREAM_READ_TIMEOUT = 45.0
# Consecutive failed stream connections before following falls back to polling ``?after=``.
STREAM_FAILURES_BEFORE_POLLING = 3


@dataclass
class Call(Generic[T]):
    """One logical call. ``idempotency_key`` is made here, once, before any try: every retry of
    this call sends the same key, so the server answers a replay with its stored response."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    files: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    idempotency_key: str | None = None
    retry: bool = True

    def __post_init__(self) -> None:
        if self.method == "POST" and self.idempotency_key is None:
            self.idempotency_key = uuid.uuid4().hex

    def headers(self) -> dict[str, str]:
        return {"Idempotency-Key": self.idempotency_key} if self.idempotency_key else {}


def model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: cls.model_validate(response.json())


def nothing(response: httpx.Response) -> None:
    return None


def raw_json(response: httpx.Response) -> Any:
    return response.json()


def content(response: httpx.Response) -> bytes:
    return response.content


@dataclass
class RetryPolicy:
    """Retries only what cannot have been refused for its content: connection errors, 5xx,
    429 and 409 ``request_in_progress``; ``Retry-After`` is honoured (capped by ``max_delay``)."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or None to give up (``attempt`` counts
        from 1). ``response`` is None after a connection error."""
        if attempt >= self.attempts:
            return None
        if response is not None and not retryable(response):
            return None
        backoff = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        backoff *= 0.5 + random.random() / 2  # jitter: clients that failed together spread out
        if response is not None:
            after = retry_after(response)
            if after is not None:
                return min(self.max_delay, max(after, 0.0))
        return backoff


def retryable(response: httpx.Response) -> bool:
    if response.status_code >= 500 or response.status_code == 429:
        return True
    return response.status_code == 409 and error_code(response) == "request_in_progress"


RETRYABLE_EXCEPTIONS = (httpx.TransportError,)


def retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_code(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("code", ""))
    return ""


def error_for(response: httpx.Response) -> errors.ConsoleError:
    """The typed error for a non-2xx answer."""
    try:
        body = response.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code", ""))
        message = str(err.get("message", ""))
        field_name = err.get("field")
    else:
        code, message, field_name = "", response.text[:500], None
    cls = errors.error_class(response.status_code, code)
    return cls(
        message or f"HTTP {response.status_code}",
        status=response.status_code,
        code=code or None,
        field=str(field_name) if field_name else None,
        retry_after=retry_after(response),
        body=body,
    )


def transport_error(exc: Exception) -> errors.TransportError:
    return errors.TransportError(f"{type(exc).__name__}: {exc}")


def clean(body: dict[str, Any]) -> dict[str, Any]:
    """A body without the arguments left at None (the server applies its defaults)."""
    return {k: v for k, v in body.items() if v is not None}


# A multipart file part as httpx takes it: the bytes, or (file name, bytes[, media type]).
FileContent = bytes | tuple[str, bytes] | tuple[str, bytes, str]


def body_json(body: BaseModel | dict[str, Any] | None) -> Any:
    """A request body as JSON: a model with the fields it was given (the server applies its
    defaults to the others), less those given as None that the schema does not let be null
    (the models type both kinds ``X | None``); a dict as it is."""
    if not isinstance(body, BaseModel):
        return body
    dumped = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
    refused = NOT_NULLABLE.get(type(body).__name__, frozenset())
    return {k: v for k, v in dumped.items() if v is not None or k not in refused}


def segment(value: str) -> str:
    """A path parameter, quoted: an id with a slash or a space stays one segment."""
    return quote(str(value), safe="")


def url(base_url: str) -> str:
    return base_url.rstrip("/")


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT}


def heartbeat_interval(grant: LeaseGrant, given: float | None) -> float:
    """About a third of the lease (as granted), so two heartbeats can fail before it lapses."""
    if given is not None:
        return given
    lease = (grant.lease_expires_at - datetime.now(UTC)).total_seconds()
    return max(0.2, lease / 3)


# --- server-sent events -----------------------------------------------------------------------


@dataclass
class SSEParser:
    """The text/event-stream format (WHATWG): ``feed`` lines, get the complete events. Comments
    (keepalives) and ``retry:`` lines are read, never returned."""

    _data: list[str] = field(default_factory=list)
    _id: str | None = None
    _type: str = ""
    retry_ms: int | None = None

    def feed(self, line: str) -> dict[str, Any] | None:
        if line == "":
            if not self._data:
                self._id, self._type = None, ""
                return None
            out = {"id": self._id, "event": self._type, "data": "\n".join(self._data)}
            self._data, self._id, self._type = [], None, ""
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "event":
            self._type = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


class StreamRefused(errors.ConsoleError):
    """The stream said ``event: error`` (its principal no longer holds)."""

    code = "stream_refused"


def sse_event(raw: dict[str, Any]) -> Event:
    if raw["event"] == "error":
        try:
            err = json.loads(raw["data"]).get("error", {})
        except (ValueError, AttributeError):
            err = {}
        cls = errors.error_class(403, str(err.get("code", "")))
        raise cls(str(err.get("message", "stream refused")), code=err.get("code"))
    body = json.loads(raw["data"])
    if raw["id"] is not None:
        body.setdefault("id", raw["id"])
    return Event.model_validate(body)


@dataclass
class EventCursor:
    """Where a follower is: the last id seen, and the ids already handed out (a server or proxy
    that resends from an older point must not deliver an event twice)."""

    last: str | None = None
    _seen: set[str] = field(default_factory=set)

    def fresh(self, events: Iterable[Event]) -> Iterator[Event]:
        for event in events:
            if event.id in self._seen or _older(event.id, self.last):
                continue
            self._seen.add(event.id)
            self.last = event.id
            yield event


def _older(candidate: str, last: str | None) -> bool:
    # The server's ids are increasing integers; other ids are compared by the seen set only.
    if last is None:
        return False
    try:
        return int(candidate) <= int(last)
    except ValueError:
        return False


def is_event_stream(response: httpx.Response) -> bool:
    return response.status_code == 200 and response.headers.get("content-type", "").startswith(
        "text/event-stream"
    )


# --- the verbs ----------------------------------------------------------------------------------
# --- the verbs: each builds its Call once; the clients send it ---------------------------------


def create_task(
    name: str,
    input: dict[str, Any] | None = None,
    *,
    deadline_seconds: int | None = None,
    budget: dict[str, float] | None = None,
    parent: str | None = None,
    required_checks: list[dict[str, Any]] | None = None,
    external_id: str | None = None,
    idempotency_key: str | None = None,
) -> Call[Task]:
    body = clean(
        {
            "name": name,
            "input": input or {},
            "deadline_seconds": deadline_seconds,
            "budget": budget,
            "parent": parent,
            "required_checks": required_checks,
            "external_id": external_id,
        }
    )
    return Call("POST", f"{API}/tasks", model(Task), json=body, idempotency_key=idempotency_key)


def get_task(task_id: str) -> Call[Task]:
    return Call("GET", f"{API}/tasks/{task_id}", model(Task))


def find_task(external_id: str) -> Call[Task | None]:
    """The caller's task created under ``external_id`` (one per owner), or None."""

    def parse(response: httpx.Response) -> Task | None:
        rows = response.json().get("results") or []
        return Task.model_validate(rows[0]) if rows else None

    return Call("GET", f"{API}/tasks", parse, params={"external_id": external_id, "limit": 1})


def propose(
    task_id: str,
    tool: str,
    params: dict[str, Any] | None = None,
    *,
    step: str,
    intent_version: int | None = None,
    estimate: dict[str, float] | None = None,
    executor: str | None = None,
    max_attempts: int | None = None,
    approval_timeout_seconds: int | None = None,
    operation_key: str | None = None,
    idempotency_key: str | None = None,
) -> Call[Operation]:
    body = clean(
        {
            "tool": tool,
            "params": params or {},
            "step": step,
            "intent_version": intent_version,
            "estimate": estimate,
            "executor": executor,
            "max_attempts": max_attempts,
            "approval_timeout_seconds": approval_timeout_seconds,
            "idempotency_key": operation_key,
        }
    )
    return Call(
        "POST",
        f"{API}/tasks/{task_id}/operations",
        model(Operation),
        json=body,
        idempotency_key=idempotency_key,
    )


def get_operation(operation_id: str) -> Call[Operation]:
    return Call("GET", f"{API}/operations/{operation_id}", model(Operation))


def claim(operation_id: str) -> Call[LeaseGrant]:
    return Call("POST", f"{API}/operations/{operation_id}/claim", model(LeaseGrant), json={})


def heartbeat(operation_id: str, grant: LeaseGrant) -> Call[HeartbeatAnswer]:
    body = {
        "lease_generation": grant.lease_generation,
        "lease_token": grant.lease_token.get_secret_value(),
    }
    return Call(
        "POST", f"{API}/operations/{operation_id}/heartbeat", model(HeartbeatAnswer), json=body
    )


def complete_operation(
    operation_id: str,
    grant: LeaseGrant,
    outcome: str,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
    usage: dict[str, float] | None = None,
) -> Call[Operation]:
    body = clean(
        {
            "lease_generation": grant.lease_generation,
            "lease_token": grant.lease_token.get_secret_value(),
            "outcome": outcome,
            "result": result,
            "error": error,
            "usage": usage,
        }
    )
    return Call("POST", f"{API}/operations/{operation_id}/complete", model(Operation), json=body)


def complete_task(task_id: str) -> Call[Task]:
    return Call("POST", f"{API}/tasks/{task_id}/complete", model(Task), json={})


def cancel_task(task_id: str, reason: str) -> Call[Task]:
    return Call("POST", f"{API}/tasks/{task_id}/cancel", model(Task), json={"reason": reason})


def send_signal(task_id: str, name: str, payload: Any, event_id: str) -> Call[SignalAnswer]:
    body = {"event_id": event_id, "name": name, "payload": payload}
    return Call("POST", f"{API}/tasks/{task_id}/signals", model(SignalAnswer), json=body)


def get_budget(task_id: str) -> Call[Budget]:
    return Call("GET", f"{API}/tasks/{task_id}/budget", model(Budget))


def events_page(task_id: str, after: str | None, limit: int = 1000) -> Call[EventPage]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    return Call("GET", f"{API}/tasks/{task_id}/events", model(EventPage), params=params)


def upload_artifact(
    task_id: str, name: str, data: bytes, media_type: str = "application/octet-stream"
) -> Call[Artifact]:
    return Call(
        "POST",
        f"{API}/tasks/{task_id}/artifacts",
        model(Artifact),
        files={"file": (name, data, media_type)},
        data={"name": name, "media_type": media_type},
    )


def accept_artifact(artifact_id: str, expected_state_version: int) -> Call[Artifact]:
    return Call(
        "POST",
        f"{API}/artifacts/{artifact_id}/accept",
        model(Artifact),
        json={"expected_state_version": expected_state_version},
    )


def list_approvals(status: str | None = "pending", task: str | None = None) -> Call[list[Approval]]:
    def parse(response: httpx.Response) -> list[Approval]:
        body = response.json()
        rows = body.get("results", body.get("approvals")) if isinstance(body, dict) else body
        return [Approval.model_validate(r) for r in rows or []]

    return Call("GET", f"{API}/approvals", parse, params=clean({"status": status, "task": task}))


def get_approval(approval_id: str) -> Call[Approval]:
    return Call("GET", f"{API}/approvals/{approval_id}", model(Approval))


def decide(
    approval_id: str, decision: str, *, reason: str = "", params_hash: str = ""
) -> Call[Any]:
    body = clean({"decision": decision, "reason": reason, "params_hash": params_hash or None})
    return Call("POST", f"{API}/approvals/{approval_id}/decision", raw_json, json=body)


def edit_approval(approval_id: str, params: dict[str, Any], reason: str) -> Call[Approval]:
    body = {"params": params, "reason": reason}
    return Call("POST", f"{API}/approvals/{approval_id}/edit", model(Approval), json=body)
