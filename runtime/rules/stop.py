"""The stop rule, written once: when a task admits no more covered work, and what a stop makes of
work that has not finished. Every writer applies it to the task row it read *under that row's
lock* (DESIGN.md, "one writer per transition"); the one-statement forms (runtime.transitions) render
its SQL from here, so no path can spell it differently. (``runtime.stoprule`` adds what needs a
query or the tools: the unconfirmed calls of a stop's work and its target by tool.)

A stop never turns a possible effect into ``cancelled``: work with a call whose outcome nobody
confirmed (unknown, lost with its lease, terminated, never reported) goes to a person as
``unresolved``, with its invocations as evidence and its budget hold left unknown until that
person resolves it; only a pure call (no effect to fear) is simply cancelled."""

from __future__ import annotations

from typing import Protocol

from runtime.models import Invocation
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition

S = OperationStatus

# What a call's recorded outcome must be for its effect to be known (it happened, or it did
# not): any other outcome, or none yet, leaves an effect possible.
CONFIRMED_OUTCOMES = (
    Invocation.OUTCOME_SUCCEEDED,
    Invocation.OUTCOME_FAILED_TRANSIENT,
    Invocation.OUTCOME_FAILED_PERMANENT,
    Invocation.OUTCOME_REFUSED,
    "no_record",  # a person's lookup: the receiver has no record of the key
)

# The journal event of a stop that hands unconfirmed work to a person.
STOPPED_UNCONFIRMED_EVENT = "operation.stopped_unconfirmed"


class _TaskState(Protocol):
    @property
    def cancellation(self) -> str: ...

    @property
    def condition(self) -> str: ...


def stopping(cancellation: str, condition: str) -> bool:
    """Whether a task in this state admits no covered work: its cancellation was requested, or
    it has ended. Nothing is claimed, retried or re-pended for it except its compensations
    (``stop_covers``)."""
    return cancellation != Cancellation.NONE or condition == TaskCondition.TERMINAL


def task_stopping(task: _TaskState) -> bool:
    """``stopping`` of a task row (a Task, or the TaskRow a journal statement returned). The
    caller must hold the task's row lock for the answer to decide anything."""
    return stopping(task.cancellation, task.condition)


class _TaskActivity(_TaskState, Protocol):
    @property
    def ops_active(self) -> int: ...


def rest_due(task: _TaskActivity) -> bool:
    """Whether a task comes to rest now (``runtime.reactor.task_rest_txn``): its cancellation
    was acknowledged (every running call was asked to stop) or it ended, and nothing of it is
    active any more. Narrower than ``stopping``: a cancellation only requested is still being
    carried out. The caller holds the task's row lock."""
    settling = (
        task.cancellation == Cancellation.ACKNOWLEDGED or task.condition == TaskCondition.TERMINAL
    )
    return settling and task.ops_active == 0


def not_stopping_sql(alias: str) -> str:
    """The rule as a SQL predicate over the task row ``alias`` (constants only)."""
    return (
        f"{alias}.cancellation = '{Cancellation.NONE}' "
        f"AND {alias}.condition <> '{TaskCondition.TERMINAL}'"
    )


def stop_covers(compensates_id: str | None) -> bool:
    """Whether a stop of its task covers an operation (given its ``compensates_id``): every
    operation but a compensation, which outlives the stop it serves (a saga runs in an ended
    task). Covered work is not claimed, retried or re-pended once its task stops, and a running
    call of it is asked to stop; a compensation is claimed and kept running, and only a cancel of
    the compensation itself (``cancel_requested`` on its own row) asks it to stop."""
    return compensates_id is None


def stop_asked(*, cancel_requested: bool, covered: bool, cancellation: str, condition: str) -> bool:
    """Whether a running call is asked to stop: its own cancel was requested, or its task is
    stopping and the stop covers it (``covered``: ``stop_covers``). What a heartbeat answers and
    the cancel watch looks for."""
    return cancel_requested or (covered and stopping(cancellation, condition))


def stop_reason(task: _TaskState) -> str:
    return (
        "the task was cancelled" if task.cancellation != Cancellation.NONE else "the task has ended"
    )


def stop_settles_to(*, pure: bool, unconfirmed: bool) -> str:
    """What a stop makes of covered work that is not running: ``cancelled``, unless a call of it
    may have had an effect nobody confirmed (``unconfirmed``) and its tool is not ``pure``:
    then ``unresolved``, for a person (who may look it up, mark it, or compensate it)."""
    if unconfirmed and not pure:
        return S.UNRESOLVED
    return S.CANCELLED
