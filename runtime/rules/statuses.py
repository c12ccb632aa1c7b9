"""Transition tables as data, checked by pure functions (no database here).

Each machine is a list of named edges. ``Machine.check`` answers whether an edge exists and what
it is called; the guarded UPDATE in ``runtime.transitions.status`` is the only writer of status.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from runtime.errors import InvalidTransition


@dataclass(frozen=True)
class Edge:
    name: str
    source: str
    target: str


@dataclass(frozen=True)
class Machine:
    name: str
    states: tuple[str, ...]
    edges: tuple[Edge, ...]
    _index: dict[tuple[str, str], str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for edge in self.edges:
            if edge.source not in self.states or edge.target not in self.states:
                raise ValueError(f"{self.name}: edge {edge} names an unknown state")
            if (edge.source, edge.target) in self._index:
                raise ValueError(f"{self.name}: duplicate edge {edge.source}->{edge.target}")
            self._index[(edge.source, edge.target)] = edge.name

    def allows(self, source: str, target: str) -> bool:
        return (source, target) in self._index

    def check(self, source: str, target: str) -> str:
        """Return the edge's name, or raise InvalidTransition when the table has no such edge."""
        try:
            return self._index[(source, target)]
        except KeyError:
            raise InvalidTransition(
                f"{self.name} cannot go from {source} to {target}",
                source=source,
                target=target,
            ) from None

    def targets(self, source: str) -> set[str]:
        return {t for (s, t) in self._index if s == source}

    def sources_of(self, target: str) -> set[str]:
        return {s for (s, t) in self._index if t == target}


def _edges(name: str, sources: Iterable[str], target: str) -> list[Edge]:
    return [Edge(name, s, target) for s in sources]


class OperationStatus:
    PENDING = "pending"
    WAITING_APPROVAL = "waiting_approval"
    WAITING = "waiting"  # a signal or a timer
    RUNNING = "running"
    RETRY_SCHEDULED = "retry_scheduled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNRESOLVED = "unresolved"
    CANCELLED = "cancelled"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    EXPIRED = "expired"
    MANUAL_INTERVENTION = "manual_intervention"

    ALL = (
        PENDING,
        WAITING_APPROVAL,
        WAITING,
        RUNNING,
        RETRY_SCHEDULED,
        SUCCEEDED,
        FAILED,
        UNRESOLVED,
        CANCELLED,
        COMPENSATING,
        COMPENSATED,
        EXPIRED,
        MANUAL_INTERVENTION,
    )
    CLAIMABLE = (PENDING, RETRY_SCHEDULED)
    # Settled: no machine will move these again without a person.
    FINAL = (SUCCEEDED, FAILED, CANCELLED, COMPENSATED)
    # What keeps a task "waiting": a dependency outside the workers.
    BLOCKED = (WAITING_APPROVAL, WAITING, UNRESOLVED, MANUAL_INTERVENTION, EXPIRED)
    ACTIVE = (RUNNING, COMPENSATING)


S = OperationStatus
_CANCELLABLE = (S.PENDING, S.WAITING_APPROVAL, S.WAITING, S.RETRY_SCHEDULED, S.MANUAL_INTERVENTION)

OPERATION = Machine(
    "operation",
    S.ALL,
    (
        *[
            Edge("claimed", S.PENDING, S.RUNNING),
            Edge("claimed", S.RETRY_SCHEDULED, S.RUNNING),
            Edge("approval_granted", S.WAITING_APPROVAL, S.PENDING),
            Edge("approval_denied", S.WAITING_APPROVAL, S.FAILED),
            Edge("approval_expired", S.WAITING_APPROVAL, S.EXPIRED),
            # At release the approver no longer holds the right: the action waits for a
            # person's decision again (runtime.approval_gate).
            Edge("approval_reopened", S.PENDING, S.WAITING_APPROVAL),
            Edge("wait_satisfied", S.WAITING, S.SUCCEEDED),
            Edge("wait_expired", S.WAITING, S.EXPIRED),
            Edge("renewed", S.EXPIRED, S.WAITING_APPROVAL),
            Edge("wait_renewed", S.EXPIRED, S.WAITING),
            Edge("terminated", S.EXPIRED, S.CANCELLED),
            Edge("succeeded", S.RUNNING, S.SUCCEEDED),
            Edge("failed", S.RUNNING, S.FAILED),
            Edge("retry_scheduled", S.RUNNING, S.RETRY_SCHEDULED),
            Edge("outcome_unknown", S.RUNNING, S.UNRESOLVED),
            # Lease expiry hands the work to a new generation; it never proves the old worker
            # stopped, which is why every acceptance is fenced.
            Edge("lease_expired", S.RUNNING, S.PENDING),
            Edge("cancel_acknowledged", S.RUNNING, S.CANCELLED),
            Edge("attempts_exhausted", S.RETRY_SCHEDULED, S.FAILED),
            Edge("attempts_exhausted", S.PENDING, S.FAILED),
            # A compensation that cannot finish goes to a person instead of failing quietly.
            Edge("compensation_exhausted", S.PENDING, S.UNRESOLVED),
            # A stop hands work whose earlier call is unconfirmed to a person (runtime.stoprule;
            # from pending it takes the edge above, journalled under this name).
            Edge("stopped_unconfirmed", S.RETRY_SCHEDULED, S.UNRESOLVED),
            Edge("stopped_unconfirmed", S.MANUAL_INTERVENTION, S.UNRESOLVED),
            Edge("version_refused", S.PENDING, S.MANUAL_INTERVENTION),
            Edge("version_refused", S.RETRY_SCHEDULED, S.MANUAL_INTERVENTION),
            Edge("version_refused", S.RUNNING, S.MANUAL_INTERVENTION),
            Edge("requeued", S.MANUAL_INTERVENTION, S.PENDING),
            Edge("abandoned", S.MANUAL_INTERVENTION, S.FAILED),
            Edge("resolved_succeeded", S.UNRESOLVED, S.SUCCEEDED),
            Edge("resolved_no_effect", S.UNRESOLVED, S.FAILED),
            Edge("resolved_retry", S.UNRESOLVED, S.PENDING),
            Edge("compensation_started", S.SUCCEEDED, S.COMPENSATING),
            Edge("compensation_started", S.UNRESOLVED, S.COMPENSATING),
            Edge("compensated", S.COMPENSATING, S.COMPENSATED),
            Edge("compensation_unresolved", S.COMPENSATING, S.UNRESOLVED),
            Edge("deadline_exceeded", S.PENDING, S.EXPIRED),
            Edge("deadline_exceeded", S.RETRY_SCHEDULED, S.EXPIRED),
        ],
        *_edges("cancelled", _CANCELLABLE, S.CANCELLED),
    ),
)


class TaskCondition:
    RUNNABLE = "runnable"
    RUNNING = "running"
    WAITING = "waiting"
    TERMINAL = "terminal"
    ALL = (RUNNABLE, RUNNING, WAITING, TERMINAL)


class TaskOutcome:
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNRESOLVED = "unresolved"
    ALL = (SUCCEEDED, FAILED, CANCELLED, UNRESOLVED)


C = TaskCondition
_LIVE = (C.RUNNABLE, C.RUNNING, C.WAITING)

TASK = Machine(
    "task",
    C.ALL,
    (
        *[Edge("progressed", s, t) for s in _LIVE for t in _LIVE if s != t],
        *_edges("ended", _LIVE, C.TERMINAL),
    ),
)


class Cancellation:
    NONE = "none"
    REQUESTED = "requested"
    ACKNOWLEDGED = "acknowledged"
    QUIESCENT = "quiescent"
    ALL = (NONE, REQUESTED, ACKNOWLEDGED, QUIESCENT)


CANCELLATION = Machine(
    "cancellation",
    Cancellation.ALL,
    (
        Edge("cancel_requested", Cancellation.NONE, Cancellation.REQUESTED),
        Edge("cancel_acknowledged", Cancellation.REQUESTED, Cancellation.ACKNOWLEDGED),
        Edge("quiescent", Cancellation.ACKNOWLEDGED, Cancellation.QUIESCENT),
    ),
)


class ApprovalStatus:
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    RELEASED = "released"
    ALL = (PENDING, APPROVED, DENIED, EXPIRED, RELEASED)


A = ApprovalStatus
APPROVAL = Machine(
    "approval",
    A.ALL,
    (
        Edge("approved", A.PENDING, A.APPROVED),
        Edge("denied", A.PENDING, A.DENIED),
        Edge("expired", A.PENDING, A.EXPIRED),
        Edge("renewed", A.EXPIRED, A.PENDING),
        Edge("released", A.APPROVED, A.RELEASED),
        Edge("expired", A.APPROVED, A.EXPIRED),
        # At release the approver no longer holds the right: the decision is void, the request
        # waits for another approver (runtime.approval_gate).
        Edge("reopened", A.APPROVED, A.PENDING),
        # An admin transforms an expired request into a denial instead of renewing it.
        Edge("transformed", A.EXPIRED, A.DENIED),
    ),
)


# The one statement of how a task's live condition follows from its operations, in priority
# order: running work wins; then work eligible to start; then a dependency outside the workers
# (approval, signal, timer, a person); with nothing pending the task waits on its agent's next
# decision, which is runnable. ``task_condition_for`` reads it, and the journal statement's SQL
# CASE (runtime.events) is rendered from it, so the two cannot drift.
CONDITION_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (C.RUNNING, S.ACTIVE),
    (C.RUNNABLE, S.CLAIMABLE),
    (C.WAITING, S.BLOCKED),
)
CONDITION_DEFAULT = C.RUNNABLE


def task_condition_for(statuses: Iterable[str]) -> str:
    """The live condition a task's operations imply (a pure rule; terminal is set explicitly)."""
    present = set(statuses)
    for condition, group in CONDITION_RULES:
        if present & set(group):
            return condition
    return CONDITION_DEFAULT


MACHINES = {m.name: m for m in (OPERATION, TASK, CANCELLATION, APPROVAL)}
