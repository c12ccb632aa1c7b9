"""Typed errors: one class per ``error.code`` the console sends (docs/api.md, "Error codes"), each
a subclass of the class for its HTTP status, so ``except Conflict`` catches every 409. A code this
client does not know gets its status's class (with the code as sent). Every error body is
``{"error": {"code", "message"}}``; tests/client/test_client_errors.py checks the table against
the documented codes and the server's own."""

from __future__ import annotations

from typing import Any


class ConsoleError(Exception):
    """An error answer from the console (or a transport failure after all retries)."""

    code: str = "error"
    # The HTTP status the console sends this code with (None: not an answer of the console).
    http_status: int | None = None

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
    """No answer after every retry (connection refused, reset, timed out)."""

    code = "transport_error"


class OperationTimeout(ConsoleError):
    """``wait_operation`` gave up before the operation reached a wanted status."""

    code = "timeout"


# --- 400 ---------------------------------------------------------------------------------------


class BadRequest(ConsoleError):
    """400: the request is malformed (the class of every 400 code)."""

    code = "bad_request"
    http_status = 400


class InvalidInput(BadRequest):
    code = "invalid_input"


class MalformedRequest(BadRequest):
    code = "malformed_request"


class UnknownTool(BadRequest):
    code = "unknown_tool"


class UnknownChecker(BadRequest):
    code = "unknown_checker"


class NotSupportedYet(BadRequest):
    code = "not_supported_yet"


class DisallowedHost(BadRequest):
    code = "disallowed_host"


# --- 401, 403, 404, 405, 406 -------------------------------------------------------------------


class NotAuthenticated(ConsoleError):
    """401: no token, or a bad one."""

    code = "not_authenticated"
    http_status = 401


# The name before the class took the server's code (kept for code that imports it).
Unauthenticated = NotAuthenticated


class NotAuthorized(ConsoleError):
    """403: the caller lacks the right."""

    code = "not_authorized"
    http_status = 403


class KeyOutsideNamespace(NotAuthorized):
    code = "key_outside_namespace"


class NotFound(ConsoleError):
    """404: no such object, or not one the caller may see."""

    code = "not_found"
    http_status = 404


class MethodNotAllowed(ConsoleError):
    code = "method_not_allowed"
    http_status = 405


class NotAcceptable(ConsoleError):
    code = "not_acceptable"
    http_status = 406


# --- 409 ---------------------------------------------------------------------------------------


class Conflict(ConsoleError):
    """409: the object is not in a state that allows this (the class of every 409 code)."""

    code = "conflict"
    http_status = 409


class ToolExists(Conflict):
    code = "tool_exists"


class StateVersionMismatch(Conflict):
    code = "state_version_mismatch"


class InvalidTransition(Conflict):
    code = "invalid_transition"


class StaleLease(Conflict):
    code = "stale_lease"


class NotClaimable(Conflict):
    code = "not_claimable"


class BudgetExhausted(Conflict):
    code = "budget_exhausted"


class RequestInProgress(Conflict):
    code = "request_in_progress"


class CompletionRefused(Conflict):
    code = "completion_refused"


class ApprovalStale(Conflict):
    code = "approval_stale"


class ApprovalExpired(Conflict):
    code = "approval_expired"


class ApprovalDecided(Conflict):
    code = "approval_decided"


class ApprovalAlreadyApproved(Conflict):
    """Your approval of a request that needs two approvers is recorded already: it waits for
    another approver."""

    code = "approval_already_approved"


class WaitNotExpired(Conflict):
    code = "wait_not_expired"


class ScheduleOwnerInactive(Conflict):
    code = "schedule_owner_inactive"


class TaskTerminal(Conflict):
    code = "task_terminal"


class TaskCancelled(Conflict):
    code = "task_cancelled"


class TaskPaused(Conflict):
    code = "task_paused"


class DeadlineExceeded(Conflict):
    code = "deadline_exceeded"


class PossibleEffect(Conflict):
    code = "possible_effect"


class CompensationNotPossible(Conflict):
    code = "compensation_not_possible"


class ResolutionNotAllowed(Conflict):
    code = "resolution_not_allowed"


class NotUnresolved(Conflict):
    code = "not_unresolved"


class NotManualIntervention(Conflict):
    code = "not_manual_intervention"


class ItemTaken(Conflict):
    """Someone else holds the item of a people's queue (the message names them)."""

    code = "item_taken"


class NotHolder(Conflict):
    """The item is not the caller's to release."""

    code = "not_holder"


class ItemSettled(Conflict):
    """The item waits in that queue no more (someone settled it)."""

    code = "item_settled"


# --- 413, 415, 422, 429, 431 -------------------------------------------------------------------


class RequestTooLarge(ConsoleError):
    """413 (the class of both 413 codes)."""

    code = "request_too_large"
    http_status = 413


class ArtifactTooLarge(RequestTooLarge):
    code = "artifact_too_large"


class UnsupportedMediaType(ConsoleError):
    code = "unsupported_media_type"
    http_status = 415


class IdempotencyKeyReused(ConsoleError):
    """422: the key was used before for another request (a header key, an operation's key, a
    task's ``external_id``)."""

    code = "idempotency_key_reused"
    http_status = 422


class RateLimited(ConsoleError):
    """429, with ``retry_after`` (the class of every 429 code)."""

    code = "rate_limited"
    http_status = 429


class QueueFull(RateLimited):
    code = "queue_full"


class Throttled(RateLimited):
    code = "throttled"


class RequestHeaderTooLarge(ConsoleError):
    code = "request_header_too_large"
    http_status = 431


# --- 5xx ---------------------------------------------------------------------------------------


class ServerError(ConsoleError):
    """A 5xx answer (the class of every 5xx code)."""

    code = "server_error"
    http_status = 500


class InternalError(ServerError):
    code = "internal_error"


class NotImplementedYet(ServerError):
    code = "not_implemented"
    http_status = 501


class Busy(ServerError):
    """503 with ``Retry-After``: nothing changed, send it again (the client does)."""

    code = "busy"
    http_status = 503


class StorageUnavailable(Busy):
    code = "storage_unavailable"


def _answers(base: type[ConsoleError]) -> list[type[ConsoleError]]:
    """``base``'s subclasses that are answers of the console (they have a status)."""
    found = []
    for cls in base.__subclasses__():
        if cls.http_status is not None:
            found.append(cls)
        found.extend(_answers(cls))
    return found


# Each code's class; a status's class is the base that first carries it.
_BY_CODE: dict[str, type[ConsoleError]] = {}
_BY_STATUS: dict[int, type[ConsoleError]] = {}
for _cls in _answers(ConsoleError):
    _BY_CODE.setdefault(_cls.code, _cls)
    _BY_STATUS.setdefault(_cls.http_status or 0, _cls)


def error_class(status: int, code: str) -> type[ConsoleError]:
    """The class for an answer's code, else for its status."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else ConsoleError


def by_code() -> dict[str, type[ConsoleError]]:
    """Every code this client has a class for, with its class."""
    return dict(_BY_CODE)


# What the console refuses about a proposed call itself (its parameters, the policy, the
# budget): the agent adapters tell the model why, as a failed tool result, instead of ending
# the run with a traceback.
REFUSALS: tuple[type[ConsoleError], ...] = (BadRequest, NotAuthorized, BudgetExhausted)
