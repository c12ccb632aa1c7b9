"""The edges of the transition tables (runtime.rules.statuses) a run drove, read from its journal.

- Operations: every status change is journalled with ``data.from`` and ``data.to``
  (runtime.transitions.status, and the one-statement forms of runtime.transitions alike).
- Tasks: every event carries the task's condition after it (``data.task_condition``); two
  consecutive events of a task with different conditions are an edge.
- Cancellation: its three events (``task.cancel_requested``, ``task.cancel_acknowledged``, and
  ``task.cancelled``, written when the stop is quiescent), each moving it one state on.
- Approvals: their changes are journalled as the operation's (``approval.*`` events, and the
  claim that releases an approved one), so an approval's state is followed per operation: an
  ``approval.expired`` from ``waiting_approval`` expired a pending approval, from ``pending`` an
  approved one; a claim of an operation whose approval was approved released it; an expired
  approval's operation cancelled by an admin was transformed into a denial.

``EdgeLog.feed`` takes events in journal order (per task, by ``seq``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.rules.statuses import ApprovalStatus, Cancellation, OperationStatus

S = OperationStatus
A = ApprovalStatus
C = Cancellation

_CANCELLATION = {
    "task.cancel_requested": C.REQUESTED,
    "task.cancel_acknowledged": C.ACKNOWLEDGED,
    "task.cancelled": C.QUIESCENT,
}
# approval event -> (the approval's state before, after); None: read from the operation's move.
_APPROVAL: dict[str, tuple[str, str] | None] = {
    "approval.approved": (A.PENDING, A.APPROVED),
    "approval.denied": (A.PENDING, A.DENIED),
    "approval.closed": (A.PENDING, A.DENIED),
    "approval.edited": (A.PENDING, A.DENIED),  # the old one denied; a new one is pending
    "approval.renewed": (A.EXPIRED, A.PENDING),
    "approval.reopened": (A.APPROVED, A.PENDING),
    "approval.expired": None,
    "approval.integrity_failed": None,
}


@dataclass
class EdgeLog:
    edges: dict[str, set[tuple[str, str]]] = field(
        default_factory=lambda: {
            m: set() for m in ("operation", "task", "cancellation", "approval")
        }
    )
    _condition: dict[str, str] = field(default_factory=dict)
    _cancellation: dict[str, str] = field(default_factory=dict)
    _approval: dict[str, str] = field(default_factory=dict)  # operation -> its approval's state

    def feed(self, task_id: str, type: str, operation_id: str | None, data: dict[str, Any]) -> None:
        source, target = data.get("from"), data.get("to")
        moved = operation_id is not None and source is not None and target is not None
        if moved and source != target:
            self.edges["operation"].add((str(source), str(target)))
        condition = data.get("task_condition")
        if condition is not None:
            before = self._condition.get(task_id)
            if before is not None and before != condition:
                self.edges["task"].add((before, str(condition)))
            self._condition[task_id] = str(condition)
        if type in _CANCELLATION:
            before = self._cancellation.get(task_id, C.NONE)
            after = _CANCELLATION[type]
            if before != after:
                self.edges["cancellation"].add((before, after))
            self._cancellation[task_id] = after
        if operation_id is not None:
            self._approval_feed(operation_id, type, source if moved else None, target)

    def _approval_feed(self, op: str, type: str, source: Any, target: Any) -> None:
        state = self._approval.get(op)
        if type == "approval.requested" or (
            type == "operation.proposed" and target == S.WAITING_APPROVAL
        ):
            self._approval[op] = A.PENDING
            return
        if type in _APPROVAL:
            pair = _APPROVAL[type]
            if pair is None and source is not None:
                if type == "approval.expired":
                    pair = (A.PENDING if source == S.WAITING_APPROVAL else A.APPROVED, A.EXPIRED)
                else:  # integrity: an approved decision sent back to a person
                    pair = (A.APPROVED, A.PENDING)
            if pair is not None:
                self.edges["approval"].add(pair)
                self._approval[op] = A.PENDING if type == "approval.edited" else pair[1]
            return
        if state == A.APPROVED and source == S.PENDING and target == S.RUNNING:
            self.edges["approval"].add((A.APPROVED, A.RELEASED))
            self._approval[op] = A.RELEASED
        elif state == A.EXPIRED and source == S.EXPIRED and target == S.CANCELLED:
            self.edges["approval"].add((A.EXPIRED, A.DENIED))
            self._approval[op] = A.DENIED

    def merge(self, other: dict[str, set[tuple[str, str]]]) -> None:
        for machine, pairs in other.items():
            self.edges.setdefault(machine, set()).update(pairs)
