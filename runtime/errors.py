"""The one error hierarchy of the domain. Transport maps it once: ``status`` and ``code`` are the
HTTP status and the contract's error code (API.md); websocket consumers use ``code``."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str = "", *, code: str | None = None, **details: Any) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        if code is not None:
            self.code = code
        self.message = message or (self.__class__.__doc__ or self.code).strip()
        self.details = details


class InvalidInput(DomainError):
    """The request is malformed."""

    status = 400
    code = "invalid_input"


class UnknownTool(InvalidInput):
    """No tool adapter is registered under that name."""

    code = "unknown_tool"


class NotAuthenticated(DomainError):
    """Authentication is required."""

    status = 401
    code = "not_authenticated"


class NotAuthorized(DomainError):
    """The caller lacks the right for this action."""

    status = 403
    code = "not_authorized"


class NotFound(DomainError):
    """No such object, or not visible to the caller."""

    status = 404
    code = "not_found"


class Conflict(DomainError):
    """The object is not in a state that allows this."""

    status = 409
    code = "conflict"


class TransitionRejected(Conflict):
    """A guarded state change touched no row: someone else changed the object first."""

    code = "state_version_mismatch"


class InvalidTransition(Conflict):
    """The transition table does not allow this edge."""

    code = "invalid_transition"


class StaleLease(Conflict):
    """The lease generation is not the current one."""

    code = "stale_lease"


class NotClaimable(Conflict):
    """The operation cannot be claimed now."""

    code = "not_claimable"


class TaskRefused(Conflict):
    """The task does not admit new work (cancelled, paused, terminal, past deadline, no budget)."""


class BudgetExhausted(Conflict):
    """The attempt's ledger cannot cover this reservation."""

    code = "budget_exhausted"


class QueueFull(DomainError):
    """The tool class admits no more waiting work now; ``retry_after`` says when to try again."""

    status = 429
    code = "queue_full"

    def __init__(self, message: str, *, retry_after: int, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = max(1, int(retry_after))


class IdempotencyKeyReused(DomainError):
    """The idempotency key was used before with different parameters."""

    status = 422
    code = "idempotency_key_reused"


class RequestInProgress(Conflict):
    """A request with this idempotency key is still in progress."""

    code = "request_in_progress"


class NotImplementedRoute(DomainError):
    """A route of the contract that is not built yet."""

    status = 501
    code = "not_implemented"


class PayloadTooLarge(DomainError):
    """The upload is larger than the configured limit."""

    status = 413
    code = "artifact_too_large"


class UnsupportedMediaType(DomainError):
    """The media type is not one the configuration allows."""

    status = 415
    code = "unsupported_media_type"


class DatabaseBusy(DomainError):
    """The database gave up on this request's transaction because of concurrent ones (a
    deadlock it broke, a lock it would not wait longer for, a busy SQLite file). The transaction
    rolled back, so nothing changed and the same request may simply be sent again."""

    status = 503
    code = "busy"
    retry_after = 1


class StorageUnavailable(DomainError):
    """The artifact storage could not be reached or did not keep the bytes."""

    status = 503
    code = "storage_unavailable"


class UnknownChecker(InvalidInput):
    """No completion checker is registered under that name."""

    code = "unknown_checker"


class CompletionRefused(Conflict):
    """The task cannot succeed yet: a required check has not passed on the current artifacts, or
    covered work is still running, waiting or unresolved. ``details`` names them."""

    code = "completion_refused"
    # The reasons (which checks, which operations) are part of the answer to the caller.
    public_details = True


class ScheduleOwnerInactive(Conflict):
    """The schedule's owner can no longer act (its agent has no live token, its account is
    deactivated or lost the role): nothing starts in its name, and it is not resumed."""

    code = "schedule_owner_inactive"
    # The reason (which of the above) is part of the answer: the caller must know what to fix.
    public_details = True


class ApprovalStale(Conflict):
    """The decision names a parameter hash that is not the current proposal's."""

    code = "approval_stale"


class ApprovalExpired(Conflict):
    """The approval's validity period ended before the decision reached the gate."""

    code = "approval_expired"


class ApprovalDecided(Conflict):
    """Someone already decided this approval (or it was superseded by an edit)."""

    code = "approval_decided"


class ApprovalAlreadyApproved(Conflict):
    """This person's approval of the request is recorded already: it waits for another
    approver (the two-person rule counts each person once)."""

    code = "approval_already_approved"


class WaitNotExpired(Conflict):
    """Only an expired wait can be renewed, transformed or ended this way."""

    code = "wait_not_expired"
