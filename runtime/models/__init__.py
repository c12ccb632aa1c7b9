from runtime.models.events import Event
from runtime.models.humans import Approval, Signal, TaskCommand
from runtime.models.operations import (
    Execution,
    Invocation,
    Operation,
    RejectedObservation,
    Resolution,
)
from runtime.models.outbox import OutboxMessage
from runtime.models.principals import Agent, ApiToken
from runtime.models.requests import IdempotentRequest
from runtime.models.tasks import Attempt, Task

__all__ = [
    "Agent",
    "ApiToken",
    "Approval",
    "Attempt",
    "Event",
    "Execution",
    "IdempotentRequest",
    "Invocation",
    "Operation",
    "OutboxMessage",
    "RejectedObservation",
    "Resolution",
    "Signal",
    "Task",
    "TaskCommand",
]
