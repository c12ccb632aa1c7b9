from runtime.models.artifacts import (
    Artifact,
    ArtifactStatus,
    CheckResult,
    ContentKey,
    RequiredCheck,
)
from runtime.models.budgets import BudgetHold, BudgetMeter, ToolSlot, UsageRecord
from runtime.models.events import Event
from runtime.models.humans import Approval, ApprovalVote, Signal, TaskCommand
from runtime.models.notifications import (
    Notification,
    NotificationEndpoint,
    NotificationEvent,
    NotificationPreference,
    NotificationStream,
    NotificationTask,
    TaskWatch,
)
from runtime.models.operations import (
    Execution,
    Invocation,
    Operation,
    RejectedObservation,
    Resolution,
)
from runtime.models.outbox import OutboxMessage
from runtime.models.presence import Presence
from runtime.models.principals import Agent, ApiToken, AuditRecord, RateCounter
from runtime.models.requests import IdempotentRequest
from runtime.models.schedules import Schedule, ScheduleEvent, ScheduleRun
from runtime.models.tasks import Attempt, Task, TaskCount
from runtime.models.tools import DeclaredTool, DeclaredToolVersion
from runtime.models.views import SavedView
from runtime.models.worklist import Claim

__all__ = [
    "Agent",
    "ApiToken",
    "Approval",
    "ApprovalVote",
    "Artifact",
    "ArtifactStatus",
    "Attempt",
    "AuditRecord",
    "BudgetHold",
    "BudgetMeter",
    "CheckResult",
    "Claim",
    "ContentKey",
    "DeclaredTool",
    "DeclaredToolVersion",
    "Event",
    "Execution",
    "IdempotentRequest",
    "Invocation",
    "Notification",
    "NotificationEndpoint",
    "NotificationEvent",
    "NotificationPreference",
    "NotificationStream",
    "NotificationTask",
    "Operation",
    "OutboxMessage",
    "Presence",
    "RateCounter",
    "RejectedObservation",
    "RequiredCheck",
    "Resolution",
    "SavedView",
    "Schedule",
    "ScheduleEvent",
    "ScheduleRun",
    "Signal",
    "Task",
    "TaskCommand",
    "TaskCount",
    "TaskWatch",
    "ToolSlot",
    "UsageRecord",
]
