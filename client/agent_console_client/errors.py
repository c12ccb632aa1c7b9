"""Typed errors, one class per the contract's ``error.code`` (unknown codes get the class for
their HTTP status). Every error body is ``{"error": {"code", "message"}}``."""

from __future__ import annotations

from typing import Any


class ConsoleError(Exception):
    """An error answer from the console (or a transport failure after all retries)."""

    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        self.field = field
        self.retry_after = retry_after
        self.body = body

    def __str__(self) -> str:
        where = f" [{self.status} {self.code}]" if self.status else f" [{self.code}]"
        return f"{self.message}{where}"


class TransportError(ConsoleError):
    code = "transport_error"


class BadRequest(ConsoleError):
    code = "malformed_request"


class InvalidInput(BadRequest):
    code = "invalid_input"


class UnknownTool(BadRequest):
    code = "unknown_tool"


class NotSupportedYet(BadRequest):
    code = "not_supported_yet"


class Unauthenticated(ConsoleError):
    code = "unauthenticated"


class NotAuthorized(ConsoleError):
    code = "not_authorized"


class NotFound(ConsoleError):
    code = "not_found"


class Conflict(ConsoleError):
    code = "conflict"


class StaleLease(Conflict):
    code = "stale_lease"


class NotClaimable(Conflict):
    code = "not_claimable"


class RequestInProgress(Conflict):
    code = "request_in_progress"


class TaskCancelled(Conflict):
    code = "task_cancelled"


class TaskPaused(Conflict):
    code = "task_paused"


class TaskTerminal(Conflict):
    code = "task_terminal"


class DeadlineExceeded(Conflict):
    code = "deadline_exceeded"


class BudgetExhausted(Conflict):
    code = "budget_exhausted"


class ApprovalStale(Conflict):
    code = "approval_stale"


class ApprovalExpired(Conflict):
    code = "approval_expired"


class CompletionRefused(Conflict):
    code = "completion_refused"


class StateVersionMismatch(Conflict):
    code = "state_version_mismatch"


class IdempotencyKeyReused(ConsoleError):
    code = "idempotency_key_reused"


class RateLimited(ConsoleError):
    code = "rate_limited"


class Busy(ConsoleError):
    code = "busy"


class ServerError(ConsoleError):
    code = "server_error"


class NotImplementedYet(ConsoleError):
    code = "not_implemented"


class OperationTimeout(ConsoleError):
    """``wait_operation`` gave up before the operation reached a wanted status."""

    code = "timeout"


_BY_CODE: dict[str, type[ConsoleError]] = {
    cls.code: cls
    for cls in (
        InvalidInput, UnknownTool, NotSupportedYet, NotAuthorized, NotFound, StaleLease,
        NotClaimable, RequestInProgress, TaskCancelled, TaskPaused, TaskTerminal,
        DeadlineExceeded, BudgetExhausted, ApprovalStale, ApprovalExpired, CompletionRefused,
        StateVersionMismatch, IdempotencyKeyReused, Busy, NotImplementedYet,
    )
}  # fmt: skip
_BY_STATUS: dict[int, type[ConsoleError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: NotAuthorized,
    404: NotFound,
    409: Conflict,
    422: IdempotencyKeyReused,
    429: RateLimited,
    501: NotImplementedYet,
    503: Busy,
}


def error_class(status: int, code: str) -> type[ConsoleError]:
    """The class for an answer's code, else for its status."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else ConsoleError
