"""What the simulation saw happen, written down as it happened: the leases it was handed, the
calls its workers made and what they reported, which reports the runtime accepted, what its
people decided, which tasks it stopped. None of it is read back from the runtime's tables, so the
oracles (runtime.simulation.oracles) can hold the runtime to what really happened instead of to
what the runtime says happened.

The receivers' own definitions live here too, as their documentation states them
(docs/architecture.md, "Receiver contracts"; runtime/sandbox), not imported from the adapters
under test: a defect that changes what the runtime believes about a receiver must not change
what the oracle believes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# Each demo tool's receiver contract (docs/architecture.md): "pure" has no effect to fear,
# "replay" answers a repeated key with its first result, "lookup" can be asked what happened
# under a key, "none" promises nothing. A tool not listed is held to the strictest ("none").
CONTRACTS = {
    "demo.echo": "pure",
    "demo.slow": "pure",
    "check.json_schema": "pure",
    "demo.payments.charge": "replay",
    "demo.payments.refund": "replay",
    "demo.inventory.reserve": "lookup",
    "demo.inventory.release": "replay",
    "demo.notify": "none",
}
# What undoes a tool's effect (a saga's compensation).
UNDONE_BY = {
    "demo.payments.charge": "demo.payments.refund",
    "demo.inventory.reserve": "demo.inventory.release",
}
# The payments receiver's policy: a charge above this many cents needs an operator's approval.
APPROVAL_ABOVE_CENTS = 10000


def contract(tool: str) -> str:
    return CONTRACTS.get(tool, "none")


def gated(tool: str, params: dict[str, Any]) -> bool:
    """Whether running this call needs a person's approval (the receiver's documented policy)."""
    amount = params.get("amount_cents")
    return (
        tool == "demo.payments.charge" and isinstance(amount, int) and amount > APPROVAL_ABOVE_CENTS
    )


def confirmed(outcome: str) -> bool:
    """Whether a report tells what became of the call: it succeeded, or it failed (the receiver
    said so). ``unknown``, or no report at all, leaves the effect possible."""
    return outcome in ("succeeded", "failed")


def reported_usage(
    usage: dict[str, Any], meters: dict[str, int], *, outcome: str
) -> dict[str, int]:
    """What one confirmed call consumed on the task's meters, as it reported it (whole units,
    rounded up): a tool call counts as one ``tool_calls`` unless it reported otherwise."""
    if not confirmed(outcome):
        return {}
    used = {m: math.ceil(float(v)) for m, v in usage.items() if m in meters}
    if "tool_calls" in meters:
        used.setdefault("tool_calls", 1)
    return {m: v for m, v in used.items() if v > 0}


@dataclass
class Call:
    """One call a simulated worker made under one claim."""

    reached: bool  # the request reached the receiver (which may have acted)
    outcome: str  # what the worker will report
    authoritative: bool  # the answer is the receiver's own about the key (it reached it)


@dataclass
class Gate:
    """An approval-gated operation as the simulation's people handled it."""

    params: dict[str, Any]
    requested_at: datetime
    valid_until: datetime
    approved: bool = False
    approver: str = ""
    released: bool = False
    deadline: datetime | None = None  # its task's: no request outlives it

    def until(self, at: datetime) -> datetime:
        return at if self.deadline is None else min(at, self.deadline)


@dataclass
class Facts:
    """The simulation's own record (see the module's docstring)."""

    # op -> the highest lease generation the runtime handed to a simulated worker or agent
    generations: dict[str, int] = field(default_factory=dict)
    claims: dict[str, int] = field(default_factory=dict)  # op -> leases handed out
    calls: dict[tuple[str, int], Call] = field(default_factory=dict)
    # (op, generation) -> the report the runtime accepted under that claim
    accepted: dict[tuple[str, int], Any] = field(default_factory=dict)
    # op -> generations handed out whose call nobody confirmed to the runtime
    doubt: dict[str, set[int]] = field(default_factory=dict)
    gates: dict[str, Gate] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)  # task -> the stop a person made
    paused: set[str] = field(default_factory=set)
    demoted: set[str] = field(default_factory=set)  # people who lost the right to approve
    resolved: dict[str, list[str]] = field(default_factory=dict)  # op -> a person's resolutions
    budgets: dict[str, dict[str, int]] = field(default_factory=dict)  # task -> limits declared
    parent: dict[str, str] = field(default_factory=dict)  # child task -> parent task
    deadlines: dict[str, datetime] = field(default_factory=dict)  # task -> its deadline
    task_of: dict[str, str] = field(default_factory=dict)  # op -> task (as handed out)
    tool_of: dict[str, str] = field(default_factory=dict)
    # task -> meter -> what the calls whose reports the runtime accepted said they consumed
    reported: dict[str, dict[str, int]] = field(default_factory=dict)
    usage_of: dict[str, dict[str, int]] = field(default_factory=dict)  # the same, per operation

    def handed(self, op: str, generation: int, *, task: str, tool: str) -> None:
        """A lease was handed out: until a confirmed report is accepted under it, whatever its
        holder may do is a possible effect."""
        self.generations[op] = max(self.generations.get(op, 0), generation)
        self.claims[op] = self.claims.get(op, 0) + 1
        self.doubt.setdefault(op, set()).add(generation)
        self.task_of[op], self.tool_of[op] = task, tool

    def called(self, op: str, generation: int, call: Call) -> None:
        self.calls[(op, generation)] = call

    def acted_unknown(self) -> set[str]:
        """Operations of a tool with effects with a call that reached its receiver (which may
        have acted) and whose answer nobody has confirmed since: the work a stop must leave to
        a person."""
        return {
            op
            for (op, generation), call in self.calls.items()
            if call.reached
            and call.outcome == "unknown"
            and generation in self.doubt.get(op, ())
            and contract(self.tool_of.get(op, "")) != "pure"
        }

    def accept(self, op: str, generation: int, report: Any) -> None:
        """The runtime accepted ``report`` under this claim."""
        self.accepted[(op, generation)] = report
        if not confirmed(report.outcome):
            return
        task = self.task_of.get(op, "")
        used = reported_usage(report.usage, self.budgets.get(task) or {}, outcome=report.outcome)
        mine, its = self.reported.setdefault(task, {}), self.usage_of.setdefault(op, {})
        for meter, value in used.items():
            mine[meter] = mine.get(meter, 0) + value
            its[meter] = its.get(meter, 0) + value
        doubts = self.doubt.setdefault(op, set())
        doubts.discard(generation)
        call = self.calls.get((op, generation))
        # A receiver that answers for its key (replay, lookup) settles the earlier doubts too:
        # its answer is about every call made under the key.
        if (
            call is not None
            and call.authoritative
            and contract(self.tool_of.get(op, ""))
            in (
                "replay",
                "lookup",
            )
        ):
            doubts.clear()

    def gate_open(self, op: str, params: dict[str, Any], now: datetime, seconds: float) -> None:
        deadline = self.deadlines.get(self.task_of.get(op, ""))
        gate = Gate(dict(params), now, now, deadline=deadline)
        gate.valid_until = gate.until(now + timedelta(seconds=seconds))
        self.gates[op] = gate

    def gate_edited(self, op: str, params: dict[str, Any], now: datetime) -> None:
        """An operator changed the parameters: a new request, as long-lived as the old one."""
        gate = self.gates.get(op)
        if gate is None:
            return
        length = gate.valid_until - gate.requested_at
        self.gates[op] = Gate(dict(params), now, now, deadline=gate.deadline)
        self.gates[op].valid_until = gate.until(now + length)

    def gate_renewed(self, op: str, now: datetime, seconds: float) -> None:
        """An admin renewed an expired request: pending again, valid for ``seconds``."""
        gate = self.gates.get(op)
        if gate is not None:
            gate.valid_until, gate.approved = gate.until(now + timedelta(seconds=seconds)), False
