"""The budget oracles, from the specification's ledger ("reserve atomically before work, settle
to observed usage, keep unknown usage apart from confirmed usage; children draw from the
parent"), judged on what the simulation itself saw: the reports the runtime accepted.

- ``usage-posted-as-reported``: per task and meter, what the ledger posted equals what the
  accepted confirmed calls reported (an equality, so a ledger that posts too little fails as
  surely as one that posts too much), plus what its children at rest posted, plus at most what
  a person's resolution may post for calls nobody confirmed (their held estimate, once per
  claim handed out).
- ``holds-released-at-rest``: once every operation of a task is settled and its children are
  at rest, nothing is reserved for it any more.
- ``budgets-balance``: no meter holds, posts and owes more than its limit.
- ``children-in-parents``: what a child used is counted in its parent's meter."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

from runtime.models import BudgetMeter
from runtime.simulation.facts import Facts
from runtime.simulation.schedule import Violation

# An operation in one of these is settled: no machine will move it again by itself.
SETTLED = ("succeeded", "failed", "cancelled", "compensated", "unresolved")
# An operation in one of these may still run, or be run for it.
MOVING = ("pending", "retry_scheduled", "running", "waiting", "waiting_approval", "compensating")
# ... and with ``unresolved`` (a person's resolution may start a retry or a compensation).
OPEN = (*MOVING, "unresolved")


class Meter(NamedTuple):
    task_id: str
    attempt_id: str
    meter: str
    limit: int
    reserved: int
    posted: int
    unknown: int


def meters_of(task_ids: Iterable[str]) -> list[Meter]:
    rows = BudgetMeter.objects.filter(task_id__in=list(task_ids)).values_list(
        "task_id", "attempt_id", "meter", "limit", "reserved", "posted", "unknown"
    )
    return [Meter(*row) for row in rows]


def _hold(estimate: dict[str, Any], meter: str) -> int:
    if meter == "tool_calls":
        return 1
    value = estimate.get(meter)
    return math.ceil(float(value)) if isinstance(value, int | float) else 0


def check_budgets(
    facts: Facts,
    judged: Iterable[str],
    meters: list[Meter],
    ops_of: dict[str, list[Any]],
    task_rows: dict[str, Any],
) -> int:
    """Every ledger invariant for the tasks ``judged`` (their meters, their children's and
    parents' among ``meters``; ``ops_of``: task -> its operation rows; ``task_rows``: task ->
    (condition, ...) for the tasks and their children). Returns how many were checked."""
    by_task: dict[str, list[Meter]] = defaultdict(list)
    for m in meters:
        by_task[m.task_id].append(m)
    children: dict[str, list[str]] = defaultdict(list)
    for child, parent in facts.parent.items():
        children[parent].append(child)
    ledgers = _Ledgers(facts, by_task, children, ops_of, task_rows)
    for m in meters:
        ledgers.balance(m)
    for task_id in judged:
        ledgers.posted_as_reported(task_id)
    for child, parent in facts.parent.items():
        if child in judged or parent in judged:
            ledgers.child_in_parent(child, parent)
    return ledgers.checks


class _Ledgers:
    """The ledgers of the tasks judged, their children's and parents' (``check_budgets``)."""

    def __init__(
        self,
        facts: Facts,
        by_task: dict[str, list[Meter]],
        children: dict[str, list[str]],
        ops_of: dict[str, list[Any]],
        task_rows: dict[str, Any],
    ) -> None:
        self.facts, self.by_task, self.children = facts, by_task, children
        self.ops_of, self.task_rows = ops_of, task_rows
        self.checks = 0

    def balance(self, m: Meter) -> None:
        """``budgets-balance``: no meter holds, posts and owes more than its limit."""
        self.checks += 1
        facts, ops = self.facts, self.ops_of.get(m.task_id, [])
        # Undoing an effect is never refused for money (a compensation runs without a hold
        # when even the cleanup reserve is spent), and a child's overrun is money its parent
        # spent: what those posted may stand above the limit; nothing else may.
        cleanup = sum(
            facts.usage_of.get(op.id, {}).get(m.meter, 0)
            for op in ops
            if op.compensates_id is not None and op.attempt_id == m.attempt_id
        )
        # A call that reported more than it held crossed the limit after its admission (the
        # seeds: "a request crossing the threshold can finish"); the excess is recorded, not
        # refused. Only that excess, per accepted confirmed call, may stand above the limit.
        crossed = sum(
            max(
                0, facts.usage_of.get(op.id, {}).get(m.meter, 0) - _hold(op.estimate or {}, m.meter)
            )
            for op in ops
            if op.compensates_id is None and op.attempt_id == m.attempt_id
        )
        overrun = 0
        for child in self.children.get(m.task_id, []):
            mine = [c for c in self.by_task.get(child, []) if c.meter == m.meter]
            overrun += max(0, sum(c.posted + c.unknown - c.limit for c in mine))
        if m.limit + cleanup + overrun + crossed < m.reserved + m.posted + m.unknown:
            raise Violation(
                "budgets-balance",
                f"{m.task_id} {m.meter}: limit {m.limit} < reserved {m.reserved} + posted "
                f"{m.posted} + unknown {m.unknown}"
                + (f" (compensations posted {cleanup})" if cleanup else "")
                + (f" (children overran by {overrun})" if overrun else "")
                + (f" (calls reported {crossed} beyond their holds)" if crossed else ""),
            )

    def final(self, task_id: str) -> bool:
        """The child's spending is over: it ended, nothing in it runs, is being undone or waits
        for a person (resolving may spend again), and so it is with its own children."""
        row = self.task_rows.get(task_id)
        if row is None or row[0] != "terminal":
            return False
        if any(op.status in OPEN for op in self.ops_of.get(task_id, [])):
            return False
        return all(self.final(c) for c in self.children.get(task_id, []))

    def posted_as_reported(self, task_id: str) -> None:
        """``usage-posted-as-reported`` and ``holds-released-at-rest`` for one task."""
        facts = self.facts
        limits = facts.budgets.get(task_id) or {}
        if not limits or task_id not in self.by_task:
            return
        self.checks += 1
        posted: dict[str, int] = defaultdict(int)
        reserved = 0
        for m in self.by_task[task_id]:
            posted[m.meter] += m.posted
            reserved += m.reserved
        drawn: dict[str, int] = defaultdict(int)
        for child in self.children.get(task_id, []):
            if self.final(child):  # else its allocation is still a hold in this ledger
                for m in self.by_task.get(child, []):
                    drawn[m.meter] += m.posted
        slack: dict[str, int] = defaultdict(int)
        for op in self.ops_of.get(task_id, []):
            if facts.resolved.get(op.id):
                for name in limits:
                    slack[name] += facts.claims.get(op.id, 0) * _hold(op.estimate or {}, name)
        for name in sorted(limits):
            low = facts.reported.get(task_id, {}).get(name, 0) + drawn[name]
            if not low <= posted[name] <= low + slack[name]:
                raise Violation(
                    "usage-posted-as-reported",
                    f"task {task_id} {name}: posted {posted[name]}, but its accepted calls "
                    f"reported {low - drawn[name]} and its children whose spending is over "
                    f"posted {drawn[name]}"
                    + (f" (a person may have posted up to {slack[name]})" if slack[name] else ""),
                )
        live_children = [c for c in self.children.get(task_id, []) if not self.final(c)]
        settled = all(op.status in SETTLED for op in self.ops_of.get(task_id, []))
        if settled and not live_children and reserved:
            raise Violation(
                "holds-released-at-rest",
                f"task {task_id}: every operation settled, yet {reserved} still reserved",
            )

    def child_in_parent(self, child: str, parent: str) -> None:
        """``children-in-parents``: what a child used is counted in its parent's meter."""
        for cm in self.by_task.get(child, []):
            self.checks += 1
            totals = [
                m.reserved + m.posted + m.unknown
                for m in self.by_task.get(parent, [])
                if m.meter == cm.meter
            ]
            used = cm.posted + cm.unknown
            if totals and max(totals) < used:
                raise Violation(
                    "children-in-parents",
                    f"child {child} used {used} {cm.meter}, parent counts {max(totals)}",
                )
