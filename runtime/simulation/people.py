"""The people's actions: stops (cancel, fail, pause, resume, completion, and stops aimed at live
work), approvals (decided, edited, renewed, an approver demoted), resolutions of work left to a
person, children ended or created, and a deployment that refuses a recorded version."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

from runtime.accounts import console_user_create
from runtime.approval_expiry import approval_renew
from runtime.approvals import approval_decide, approval_edit
from runtime.cancellation import task_cancel, task_fail
from runtime.completion import task_complete
from runtime.control import task_pause, task_resume
from runtime.models import Approval, Operation, Task
from runtime.resolutions import operation_resolve, resolutions_allowed
from runtime.rules.statuses import ApprovalStatus, OperationStatus, TaskCondition
from runtime.sandbox.models import Charge, Notification, Reservation
from runtime.simulation.catalog import GATED_VARIANT, VARIANTS
from runtime.simulation.facts import UNDONE_BY, contract
from runtime.simulation.schedule import Step, Violation
from runtime.simulation.sweeper import Sweeper
from runtime.tools import adapters

S = OperationStatus
A = ApprovalStatus


class People(Sweeper):
    def _stop(self, how: str, actor_n: int, task_id: str) -> str:
        actor = self.agent if actor_n % 2 else self.admin
        calls: dict[str, Callable[[], Any]] = {
            "cancel": lambda: task_cancel(actor, task_id, "sim"),
            "fail": lambda: task_fail(actor, task_id, "sim"),
            "pause": lambda: task_pause(actor, task_id, reason="sim"),
            "resume": lambda: task_resume(actor, task_id, reason="sim"),
        }
        calls[how]()
        if how in ("cancel", "fail"):
            self.facts.stopped.setdefault(task_id, f"{how} by {actor.label}")
        elif how == "pause":
            self.facts.paused.add(task_id)
        else:
            self.facts.paused.discard(task_id)
        return f"{how} {task_id[-6:]}"

    def _task_call(self, step: Step, how: str, *, paused: bool = False) -> str:
        task_id = self._task(step.a, paused=paused)
        note = self._stop(how, step.b, task_id)
        return note + self._lost(step, lambda: self._stop(how, step.b, task_id))

    def do_cancel(self, step: Step) -> str:
        return self._task_call(step, "cancel")

    def do_fail(self, step: Step) -> str:
        return self._task_call(step, "fail")

    def do_pause(self, step: Step) -> str:
        return self._task_call(step, "pause")

    def do_resume(self, step: Step) -> str:
        return self._task_call(step, "resume", paused=True)

    def do_stop_live(self, step: Step) -> str:
        """A stop aimed at a task with work in flight or a call nobody confirmed (half the time
        one whose receiver was reached and whose answer is unknown, when there is one):
        cancelled, failed, paused, or completed leaving what is unresolved to people."""
        acted = {self.facts.task_of[op] for op in self.facts.acted_unknown()}
        doubtful = {
            self.facts.task_of[op]
            for op, gens in self.facts.doubt.items()
            if gens and op in self.facts.task_of
        }
        busy = {h.lease.operation.task_id for h in self.held + self.stalled} | doubtful
        live = [t for t in self._live() if t in busy] or self._live()
        how = ("cancel", "cancel", "fail", "pause", "complete")[step.b % 5]
        if step.a % 2 == 0:
            live = [t for t in live if t in acted] or live
        else:
            # A task that asked to be undone on this very ending, holding an effect its saga
            # must undo: the saga's own path (its compensations then run like any work).
            how = ("cancel", "fail")[step.b % 2]
            undoable = self._undoable(how)
            asking = [] if undoable else self._compensated_on(how)
            if asking:
                # Nothing its saga would undo yet: what it undoes arrives first (a small charge
                # or a reservation), as a decision's request does when nothing waits.
                variant = (1, 3)[(step.b // 2) % 2]
                request = Step("propose", step.a, variant, step.fault)
                return "request: " + self.do_propose(request, self._pick(asking, step.a))
            live = undoable or live
        task_id = self._pick(live, step.a)
        if task_id is None:
            return "nothing live"
        if how == "complete":
            return self._complete(task_id, "end_unresolved")
        return self._stop(how, step.b // 5, task_id) + self._lost(
            step, lambda: self._stop(how, step.b // 5, task_id)
        )

    def _compensated_on(self, how: str) -> list[str]:
        """Live tasks that asked to be compensated when ended as ``how``."""
        ending = {"cancel": "cancelled", "fail": "failed"}[how]
        return [
            t.pk
            for t in Task.objects.filter(pk__in=self._live()).order_by("created_at", "id")
            if ending in (t.compensate_on or [])
        ]

    def _undoable(self, how: str) -> list[str]:
        """Live tasks that asked to be compensated when ended as ``how`` and hold a succeeded
        effect whose receiver's contract says what undoes it (facts.py, not the runtime)."""
        ending = {"cancel": "cancelled", "fail": "failed"}[how]
        tasks = {
            t.pk
            for t in Task.objects.filter(pk__in=self._live())
            if ending in (t.compensate_on or [])
        }
        held = Operation.objects.filter(
            task_id__in=tasks, status=S.SUCCEEDED, compensates__isnull=True
        ).values_list("task_id", "tool")
        return sorted({task for task, tool in held if tool in UNDONE_BY})

    def _complete(self, task_id: str, mode: str) -> str:
        task = task_complete(self.agent, task_id, if_unresolved=mode)
        if task.condition == TaskCondition.TERMINAL:
            self.facts.stopped.setdefault(task_id, f"completed {task.outcome}")
        return f"complete {task_id[-6:]}"

    def do_complete(self, step: Step) -> str:
        mode = ("refuse", "end_unresolved")[step.b % 2]
        task_id = self._task(step.a)
        note = self._complete(task_id, mode)
        return note + self._lost(step, lambda: self._complete(task_id, mode))

    # --- approvals ------------------------------------------------------------------

    def _approvals(self, status: str) -> list[Approval]:
        return list(Approval.objects.filter(status=status).order_by("created_at", "id"))

    def do_decide(self, step: Step) -> str:
        approval = self._pick(self._approvals(A.PENDING), step.a)
        if approval is None:
            # Nothing to decide yet: what a decision needs arrives, a charge above the approval
            # threshold (any proposal would rarely be one, and so decisions would be rare).
            gated = step.b - step.b % len(VARIANTS) + VARIANTS.index(GATED_VARIANT)
            return "request: " + self.do_propose(Step("propose", step.a, gated, step.fault))
        decision = "approve" if step.b % 3 else "deny"
        operator = self.operators[step.b % 2]

        def call() -> Any:
            decided = approval_decide(
                operator,
                approval.pk,
                decision=decision,
                reason="sim",
                params_hash=approval.params_hash,
            )
            self._decided(approval.operation_id, decision, operator.label)
            return decided

        call()
        note = f"{decision} {approval.pk[-6:]}" + self._lost(step, call)
        if decision == "approve" and step.a % 4 != 3:
            # Approved just before the request ran out, and a worker arrives just after: the
            # release itself must see the expiry (nothing swept it yet).
            ends = Approval.objects.filter(pk=approval.pk).values_list("expires_at", flat=True)
            at = ends.first()
            if at is not None:
                worker = step.b % len(self.workers)
                note += f"; runs out: {self._to(at)}; "
                note += self._claim(approval.operation_id, worker, step)[1]
        return note

    def _decided(self, op_id: str, decision: str, approver: str) -> None:
        """A person's decision was accepted: never on a request whose validity has ended."""
        self.checks += 1
        gate = self.facts.gates.get(op_id)
        if gate is None:
            return
        now = self.clock.now()
        if decision == "approve" and now >= gate.valid_until and not gate.approved:
            raise Violation(
                "no-release-on-expired-or-denied",
                f"{op_id} approved at {now}, its request valid until {gate.valid_until}",
            )
        gate.approved, gate.approver = decision == "approve", approver

    def do_demote(self, step: Step) -> str:
        """An admin takes an operator's right to approve away (mostly one whose approval is not
        released yet), or gives it back: a decision of theirs not yet released must go back to
        a person at its release."""
        waiting = {g.approver for g in self.facts.gates.values() if g.approved and not g.released}
        operator = self._pick([o for o in self.operators if o.label in waiting], step.a)
        operator = operator or self.operators[step.a % len(self.operators)]
        name = operator.label.partition(":")[2]
        role = "operator" if operator.label in self.facts.demoted else "support"
        console_user_create(name, role, "correct-horse-battery-staple", actor=self.admin.label)
        if role == "operator":
            self.facts.demoted.discard(operator.label)
        else:
            self.facts.demoted.add(operator.label)
        return f"{name} is now {role}"

    def do_upgrade(self, step: Step) -> str:
        """A worker running other code claims: its tool no longer supports the version the work
        was recorded under (a deployment moved on under saved work), so a person must decide."""
        op_id = self._claimable(step.a)
        if op_id is None:
            return "nothing"
        tool = Operation.objects.filter(pk=op_id).values_list("tool", flat=True).first()
        adapter = adapters().get(tool or "")
        if adapter is None:
            return "nothing"
        with mock.patch.object(adapter, "supported_versions", ("0",)):
            return "newer code: " + self._claim(op_id, step.b % len(self.workers), step)[1]

    def do_edit(self, step: Step) -> str:
        approval = self._pick(self._approvals(A.PENDING), step.a)
        if approval is None:
            return "nothing"
        params = dict(approval.params, amount_cents=15000 + step.b % 7)
        approval_edit(self.operators[step.b % 2], approval.pk, params=params, reason="sim")
        self.facts.gate_edited(approval.operation_id, params, self.clock.now())
        return f"edited {approval.pk[-6:]}"

    def do_renew(self, step: Step) -> str:
        approval = self._pick(self._approvals(A.EXPIRED), step.a)
        if approval is None:
            return "nothing"
        approval_renew(self.admin, approval.pk, expires_in_seconds=120, reason="sim")
        self.facts.gate_renewed(approval.operation_id, self.clock.now(), 120)
        return f"renewed {approval.pk[-6:]}"

    # --- resolutions ----------------------------------------------------------------

    def do_resolve(self, step: Step) -> str:
        ops = list(
            self._ops()
            .filter(status__in=(S.UNRESOLVED, S.MANUAL_INTERVENTION))
            .order_by("created_at", "id")
        )
        op = self._pick(ops, step.a)
        if op is None:
            return "nothing"
        # Support staff look at the receiver before asserting anything: they never mark an
        # effect that the receiver holds "no effect", nor one it does not hold "succeeded"
        # (a person's false word is theirs, not the runtime's to prevent).
        held = self._receiver_holds(op)
        allowed = tuple(
            r
            for r in resolutions_allowed(op)
            if held is None or r != ("no_effect" if held else "succeeded")
        )
        if not allowed:
            return "no resolution allowed"
        resolution = allowed[step.b % len(allowed)]

        def call() -> Any:
            done = operation_resolve(
                self.support,
                op.pk,
                resolution=resolution,
                evidence="sim evidence",
                state_version=op.state_version,
            )
            self.facts.resolved.setdefault(op.pk, []).append(resolution)
            return done

        call()
        return f"resolved {op.pk[-6:]} {resolution}" + self._lost(step, call)

    @staticmethod
    def _receiver_holds(op: Operation) -> bool | None:
        """What the receivers' own records show under the operation's key (None: its receiver
        keeps none: a pure tool)."""
        if contract(op.tool) == "pure":
            return None
        rows = (Charge, Reservation, Notification)
        return any(model.objects.filter(key=op.idempotency_key).exists() for model in rows)

    # --- children -------------------------------------------------------------------

    def do_child(self, step: Step) -> str:
        """A child task of a budgeted parent is created, or (half the time, when one is live) a
        live child ends, mostly one that has spent: its spending settles into the parent's
        ledger, the moment the parent's budget depends on."""
        children = [t for t in self._live() if t in self.facts.parent]
        if step.b % 2 and children:
            succeeded = self._ops().filter(task_id__in=children, status=S.SUCCEEDED)
            spent = set(succeeded.values_list("task_id", flat=True))
            child = self._pick([t for t in children if t in spent] or children, step.a)
            assert child is not None
            if (step.b // 2) % 2:
                return "child " + self._complete(child, "end_unresolved")
            return "child " + self._stop("fail", step.b // 4, child)
        if not self._room():
            return "enough tasks"
        budgeted = [t for t in self._live() if self.facts.budgets.get(t)]
        parent = self._pick(budgeted, step.a)
        if parent is None:
            return "nothing"
        self._new_task(step.a, budget=True, parent=parent)
        return f"child {self.tasks[-1][-6:]} of {parent[-6:]}"
