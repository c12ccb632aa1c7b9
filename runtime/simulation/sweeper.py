"""The clock and the sweeper: time passing, the sweeps, the clock moved just past the next
moment something runs out, and a takeover between a call and its report."""

from __future__ import annotations

from typing import Any

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Operation
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.simulation.schedule import Step
from runtime.simulation.workers import Workers
from runtime.transitions.lease import lease_expire_sweep
from runtime.waits import wait_sweep

S = OperationStatus
A = ApprovalStatus


class Sweeper(Workers):
    def do_tick(self, step: Step) -> str:
        seconds = 1 + step.a % 45
        self.clock.advance(seconds)
        self.clock.push()
        return f"+{seconds}s"

    def do_sweep(self, step: Step) -> str:
        now = self.clock.now()
        leases = lease_expire_sweep(now=now)
        approvals = approval_expire_sweep(now=now)
        waits = wait_sweep(now=now)
        return f"leases {leases} approvals {approvals} waits {waits}"

    def do_expire(self, step: Step) -> str:
        """The clock moves just past the next moment something runs out: an approval (half the
        time one approved and not yet released), a wait, or (one in four each) a task's
        deadline or a lease. Then, by the variant, a claim arrives first (the release gate must
        see the expiry itself, the claim the deadline; two in three for an approval), or the
        sweeper looks, or nobody yet."""
        ops = self._ops()
        live = set(self._live())
        # Half the time an approved request not yet released: the release must see its expiry.
        statuses = (A.APPROVED,) if step.a % 2 == 0 else (A.PENDING, A.APPROVED)
        moments: list[tuple[Any, str, str]] = [
            (at, "approval", op)
            for op, at in Approval.objects.filter(status__in=statuses).values_list(
                "operation_id", "expires_at"
            )
        ]
        moments += [
            (at, "wait", pk)
            for pk, at in ops.filter(status=S.WAITING, wait_until__isnull=False).values_list(
                "pk", "wait_until"
            )
        ]
        if step.a % 4 == 1 or not moments:
            moments += [
                (at, "deadline", task) for task, at in self.facts.deadlines.items() if task in live
            ]
        if step.a % 4 == 0 or not moments:
            moments += [
                (at, "lease", pk)
                for pk, at in ops.filter(
                    status=S.RUNNING, lease_expires_at__isnull=False
                ).values_list("pk", "lease_expires_at")
            ]
        if not moments:
            return "nothing runs out"
        moments.sort(key=lambda m: (m[0], m[2]))
        at, what, op_id = moments[step.a % min(3, len(moments))]
        note = f"{what} {op_id[-6:]} runs out: {self._to(at)}"
        if step.b % 3 == 0 and what == "deadline":
            # Work of the task is delivered just after its deadline passed.
            due = self._ops_where(task_id=op_id, status__in=(S.PENDING, S.RETRY_SCHEDULED))
            op_id = self._pick(due, step.b) or ""
        first = step.b % 3 == 0 or (what == "approval" and step.b % 3 == 2)
        if first and what in ("approval", "deadline") and op_id:
            return note + "; " + self._claim(op_id, step.b % len(self.workers), step)[1]
        if step.b % 3 == 1:
            return note + "; " + self.do_sweep(step)
        return note

    def do_takeover(self, step: Step) -> str:
        """A worker's lease runs out between its call and its report: the clock passes the
        expiry, the sweeper hands the work back, and another worker claims it. The first worker
        does not know: it comes back later with its report (``late``)."""
        called = [h for h in self.held if h.report is not None] or self.held
        held = self._pick(called, step.a)
        if held is None:
            return "nothing"
        op_id = held.lease.operation_id
        expires = Operation.objects.filter(pk=op_id).values_list("lease_expires_at", flat=True)
        at = expires.first()
        note = self._to(at) if at is not None else "no lease"
        self.held.remove(held)
        self.stalled.append(held)
        swept = lease_expire_sweep(now=self.clock.now())
        claimed = self._claim(op_id, (held.worker + 1) % len(self.workers), step)[1]
        return f"takeover of {op_id[-6:]} g{held.lease.lease_generation}: {note}, {swept} " + (
            f"swept; {claimed}"
        )
