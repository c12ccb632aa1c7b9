"""The bodies the hand-written verbs answer: the generated models of docs/openapi.yaml
(``agent_console_client.schema``: date-times as aware datetimes, statuses as StrEnums, which
compare and hash as their strings) with a few helpers, and the lease grant, whose token is a
SecretStr. Every model accepts fields it does not know (a newer server adds fields freely; the
contract only promises not to remove or change them)."""

from __future__ import annotations

import json

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, SecretStr

from agent_console_client._generated import models as schema

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


class Task(schema.Task):
    pass


class Approval(schema.Approval):
    pass


class Operation(schema.Operation):
    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class LeaseGrant(_Model):
    """A claim's answer. The token is a SecretStr: it never shows in a repr, a log or a dump."""

    lease_generation: int
    lease_expires_at: AwareDatetime
    lease_token: SecretStr


class HeartbeatAnswer(schema.Heartbeat):
    pass


class Event(schema.Event):
    def concerns(self, operation_id: str) -> bool:
        """Whether this event is about that operation (its own, or named in its data)."""
        return self.operation == operation_id or operation_id in json.dumps(self.data)


class EventPage(_Model):
    # Not the schema's EventPage: its events are this module's Event (with ``concerns``).
    events: list[Event] = Field(default_factory=list)
    next: str = "0"


class Budget(schema.Budget):
    pass


class Artifact(schema.Artifact):
    pass


class SignalAnswer(schema.SignalAnswer):
    pass
