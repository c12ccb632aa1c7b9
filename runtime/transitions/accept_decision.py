"""What one report does to a running operation, decided in Python (pure): the report
(``Report``), the retry's backoff, and the decision (``report_decision``, an ``Acceptance``) both
acceptance paths apply, the general writer and the one statement; and whether the one statement
may write it (``fast_acceptable``, ``accept_facts``: runtime.rules.general_writer)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from runtime import dialect
from runtime.budgets import task_budget
from runtime.models import Invocation, Operation
from runtime.rules.general_writer import ACCEPT, FastFacts, general_writer_needed
from runtime.rules.statuses import OPERATION, OperationStatus
from runtime.stoprule import stop_target
from runtime.tools import Contract, ToolAdapter, ToolFailure
from runtime.transitions.status import fast_ending_allowed

S = OperationStatus


@dataclass(frozen=True)
class Report:
    """What one invocation produced, as the worker (or agent) reports it."""

    outcome: str  # succeeded | failed | unknown
    result: Any = None
    error_kind: str = ""  # transient | permanent (for failed)
    message: str = ""
    usage: dict[str, float] = field(default_factory=dict)
    receipt: dict[str, Any] | None = None
    provider_handle: str = ""


def backoff_delay(attempts_used: int, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter: uniform over [0, min(cap, base * 2^(n-1))] for the n-th retry. Pure."""
    envelope = min(cap, base * math.pow(2, max(0, attempts_used - 1)))
    return rng.uniform(0, envelope)


def _max_elapsed(op: Operation, adapter: ToolAdapter | None) -> datetime | None:
    """The end of the retry time allowance, counted from the first attempt (stored, so a
    replacement worker never gets a fresh allowance)."""
    seconds = adapter.max_elapsed_seconds if adapter is not None else None
    if seconds is None or op.first_attempt_at is None:
        return None
    return op.first_attempt_at + timedelta(seconds=seconds)


def report_decision(
    op: Operation,
    report: Report,
    *,
    adapter: ToolAdapter | None,
    stopping: bool,
    now: datetime,
    rng: random.Random,
    unconfirmed_before: bool = False,
) -> Acceptance:
    """What one report does to a running operation (pure: from the operation as claimed, the
    tool's contract, whether its task is stopping, read under the task's lock, and whether an
    earlier call of it is unconfirmed). Both acceptance paths apply it."""
    result = report.result if report.outcome == "succeeded" else None
    target, error, invocation_outcome, next_at = _outcome(op, report, adapter, now=now, rng=rng)
    reason: str | None = None
    if target == S.FAILED and op.compensates_id:
        # A compensation that cannot finish is handed to a person, never lost as "failed".
        target = S.UNRESOLVED
    if target == S.RETRY_SCHEDULED and stopping and not op.compensates_id:
        # Nothing is retried for a stopping task: work that failed is simply cancelled; an
        # outcome nobody can confirm (this call's or an earlier one's) stays with a person
        # (runtime.stoprule: unless repeating it is harmless).
        next_at = None
        unconfirmed = report.outcome == "unknown" or unconfirmed_before
        target = stop_target(op.tool, unconfirmed=unconfirmed)
        reason = "stopped with the task"
    return Acceptance(
        target=target,
        edge=OPERATION.check(S.RUNNING, target),
        result=result,
        error=error,
        next_attempt_at=next_at,
        invocation_outcome=invocation_outcome,
        receipt=report.receipt,
        provider_handle=report.provider_handle,
        data=_event_data(op, report, stopping=stopping, next_at=next_at, error=error),
        status_reason=reason,
    )


Outcome = tuple[str, dict[str, Any] | None, str, datetime | None]


def _outcome(
    op: Operation,
    report: Report,
    adapter: ToolAdapter | None,
    *,
    now: datetime,
    rng: random.Random,
) -> Outcome:
    """The report's target, error, invocation outcome and retry time, before the rules of
    compensations and of a stopping task."""
    contract = adapter.contract if adapter is not None else Contract.NONE
    if report.outcome == "succeeded":
        return S.SUCCEEDED, None, Invocation.OUTCOME_SUCCEEDED, None
    if report.outcome == "failed" and report.error_kind == ToolFailure.PERMANENT:
        error = {"kind": "permanent", "message": report.message}
        return S.FAILED, error, Invocation.OUTCOME_FAILED_PERMANENT, None
    if report.outcome == "unknown" and contract == Contract.NONE:
        # The effect may have happened and the receiver offers no way to tell or to dedupe:
        # a person decides, with the invocations as evidence. Never invoked again by a machine.
        error = {"kind": "unknown", "message": report.message}
        return S.UNRESOLVED, error, Invocation.OUTCOME_UNKNOWN, None
    return _retry_or_end(op, report, adapter, now=now, rng=rng)


def _retry_or_end(
    op: Operation,
    report: Report,
    adapter: ToolAdapter | None,
    *,
    now: datetime,
    rng: random.Random,
) -> Outcome:
    """A transient failure; or an unknown outcome where repeating under the same key is safe
    (replay: the receiver returns the first result; lookup: the next attempt asks first): a
    retry, unless no attempt, deadline or retry time allowance is left for one."""
    transient = report.outcome == "failed"
    invocation_outcome = (
        Invocation.OUTCOME_FAILED_TRANSIENT if transient else Invocation.OUTCOME_UNKNOWN
    )
    error = {"kind": "transient" if transient else "unknown", "message": report.message}
    delay = backoff_delay(
        op.attempts_used, settings.RETRY_BASE_SECONDS, settings.RETRY_CAP_SECONDS, rng
    )
    retry_at = now + timedelta(seconds=delay)
    elapsed_limit = _max_elapsed(op, adapter)
    next_at: datetime | None = None
    if op.attempts_used >= op.max_attempts:
        target = S.FAILED
        error["message"] = f"{report.message} (attempts exhausted: {op.attempts_used})"
    elif op.deadline is not None and retry_at >= op.deadline and not op.compensates_id:
        target = S.FAILED
        error["message"] = f"{report.message} (no retry fits before the deadline)"
    elif elapsed_limit is not None and retry_at >= elapsed_limit:
        target = S.FAILED
        error["message"] = f"{report.message} (retry time allowance used up)"
    else:
        target, next_at = S.RETRY_SCHEDULED, retry_at
    if target == S.FAILED and report.outcome == "unknown":
        # Out of retries with the effect still unconfirmed: not a failure anyone can assert.
        target = S.UNRESOLVED
    return target, error, invocation_outcome, next_at


def _event_data(
    op: Operation,
    report: Report,
    *,
    stopping: bool,
    next_at: datetime | None,
    error: dict[str, Any] | None,
) -> dict[str, Any]:
    """The acceptance's journal data (beside the move's own ``from``, ``to``, ``status``)."""
    data: dict[str, Any] = {
        "lease_generation": op.lease_generation,
        "attempts_used": op.attempts_used,
    }
    if op.cancel_requested or stopping:
        # The result committed before any stop could end the call: it wins, and says so.
        data["completed_after_cancel_request"] = True
    if report.usage:
        data["usage"] = dict(report.usage)
    if next_at is not None:
        data["retry_at"] = next_at.isoformat()
    if error:
        data["error"] = error
    return data


@dataclass(frozen=True)
class Acceptance:
    """What one report does to a running operation, decided in Python from the claim's snapshot
    (``report_decision``) and written by one statement."""

    target: str
    edge: str
    result: Any
    error: Any
    next_attempt_at: datetime | None
    invocation_outcome: str
    receipt: Any
    provider_handle: str
    data: dict[str, Any]
    status_reason: str | None = None


def fast_acceptable(snapshot: Operation, lease_generation: int, state_version: int) -> bool:
    """Whether the claim's snapshot may decide the acceptance in one statement: it is the claim
    reported under, and nothing about the work needs the general writer (rules.general_writer:
    a compensation, a task with a ledger to settle)."""
    return (
        dialect.one_statement_forms()
        and snapshot.lease_generation == lease_generation
        and snapshot.state_version == state_version
        and general_writer_needed(ACCEPT, accept_facts(snapshot)) is None
    )


def accept_facts(
    op: Operation, decision: Acceptance | None = None, *, form: str = ACCEPT
) -> FastFacts:
    """What an acceptance knows before it writes: the claim's snapshot and, once decided, the
    report's target and whether the one statement writes what the possible-effect rule would
    (runtime.transitions.status.fast_ending_allowed)."""
    return FastFacts(
        compensates_id=op.compensates_id,
        attempts_used=op.attempts_used,
        budget=lambda: task_budget(op.task_id),
        target=None if decision is None else decision.target,
        ending_allowed=decision is None
        or fast_ending_allowed(op, decision.target, decision.invocation_outcome),
    )
