"""The API's bodies as Pydantic models. Every model accepts fields it does not know (a newer
server adds fields freely; the contract only promises not to remove or change them)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

# Every operation status the contract names.
ALL_STATUSES = frozenset(
    {
        "pending", "waiting_approval", "waiting", "running", "retry_scheduled", "succeeded",
        "failed", "unresolved", "cancelled", "compensating", "compensated", "expired",
        "manual_intervention",
    }
)  # fmt: skip
# Operation statuses after which nothing more happens without a person.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "compensated", "expired"})
# Statuses where the operation waits for a person (an approver, support staff).
HUMAN_STATUSES = frozenset({"waiting_approval", "unresolved", "manual_intervention"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class AttemptRef(_Model):
    id: str
    number: int


class Task(_Model):
    id: str
    name: str = ""
    condition: str = ""
    outcome: str | None = None
    state_version: int = 0
    attempt: AttemptRef | None = None
    cancellation: str = "none"
    paused: bool = False
    deadline: str | None = None
    pending: list[str] = Field(default_factory=list)
    external_id: str | None = None
    created_at: str | None = None


class Approval(_Model):
    id: str
    operation: str = ""
    status: str = ""
    params_hash: str = ""
    proposal_version: int = 1
    params: dict[str, Any] = Field(default_factory=dict)
    requested_by: str | None = None
    edited_by: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    reason: str | None = None
    expires_at: str | None = None


class Operation(_Model):
    id: str
    task: str = ""
    attempt: Any = None
    kind: str = "tool"
    tool: str = ""
    step: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    params_hash: str = ""
    idempotency_key: str = ""
    status: str = ""
    attempts_used: int = 0
    max_attempts: int = 0
    lease_generation: int = 0
    state_version: int = 0
    result: Any = None
    error: Any = None
    approval: Approval | None = None
    invocations: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class LeaseGrant(_Model):
    """A claim's answer. The token is a SecretStr: it never shows in a repr, a log or a dump."""

    lease_generation: int
    lease_expires_at: str
    lease_token: SecretStr


class HeartbeatAnswer(_Model):
    lease_expires_at: str | None = None
    cancel_requested: bool = False


class Event(_Model):
    id: str
    type: str = ""
    at: str | None = None
    state_version: int | None = None
    operation: str | None = None
    actor: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    def concerns(self, operation_id: str) -> bool:
        """Whether this event is about that operation (its own, or named in its data)."""
        return self.operation == operation_id or operation_id in json.dumps(self.data)


class EventPage(_Model):
    events: list[Event] = Field(default_factory=list)
    next: str = "0"


class Meter(_Model):
    limit: float | None = None
    reserved: float = 0
    posted: float = 0
    unknown: float = 0
    available: float | None = None


class Budget(_Model):
    meters: dict[str, Meter] = Field(default_factory=dict)


class Artifact(_Model):
    id: str
    digest: str = ""
    size: int = 0
    status: str = ""


class SignalAnswer(_Model):
    disposition: str = ""


class Page(_Model):
    results: list[dict[str, Any]] = Field(default_factory=list)
    next: str | None = None
