from runtime.models.budgets import BudgetHold, BudgetMeter, ToolSlot, UsageRecord
from runtime.models.events import Event
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
from runtime.models.tasks import Attempt, Task, TaskCount

__all__ = [
    "Agent",
    "ApiToken",
    "Attempt",
    "BudgetHold",
    "BudgetMeter",
    "Event",
    "Execution",
    "IdempotentRequest",
    "Invocation",
    "Operation",
    "OutboxMessage",
    "RejectedObservation",
    "Resolution",
    "Task",
    "TaskCount",
    "ToolSlot",
    "UsageRecord",
]
