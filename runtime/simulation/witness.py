"""What the world saw, checked as it sees it: admissions, leases, acceptances and keys, judged
on the simulation's own records (runtime.simulation.facts), not on what the runtime says."""

from __future__ import annotations

from runtime.models import Approval, Operation, Task
from runtime.rules.statuses import Cancellation, TaskCondition
from runtime.simulation.catalog import Held
from runtime.simulation.facts import gated
from runtime.simulation.schedule import Violation
from runtime.simulation.world import WorldCore
from runtime.specs import OperationSpec
from runtime.transitions.lease import Lease


class Witness(WorldCore):
    def _proposed(self, task_id: str, op: Operation, spec: OperationSpec) -> None:
        """A new operation was admitted: never in a task a person stopped; a gated call waits
        for a person from now on, for as long as it asked."""
        self.checks += 1
        if task_id in self.facts.stopped:
            raise Violation(
                "no-admission-when-stopped",
                f"{op.pk} admitted in task {task_id}, {self.facts.stopped[task_id]} earlier",
            )
        if spec.kind == Operation.KIND_TOOL and gated(spec.tool, spec.params):
            seconds = float(spec.approval_timeout_seconds or 3600)
            self.facts.task_of[op.pk] = task_id
            self.facts.gate_open(op.pk, spec.params, self.clock.now(), seconds)

    def _leased(self, lease: Lease, executor: str) -> None:
        """The runtime handed out a lease. Judged on the world's own records: a newer generation
        than any handed out before; the executor the work names; not in a task a person stopped
        or paused (a saga's compensations outlive the stop they serve); a gated call only with
        an approval of exactly these parameters, given while it was valid."""
        self.checks += 1
        op = lease.operation
        facts = self.facts
        if lease.lease_generation <= facts.generations.get(op.pk, 0):
            raise Violation(
                "fencing",
                f"{op.pk} handed out generation {lease.lease_generation} after generation "
                f"{facts.generations[op.pk]}",
            )
        if op.executor != executor:
            raise Violation(
                "executor-respected", f"{op.pk} ({op.executor}-executed) claimed by a {executor}"
            )
        task_id = op.task_id
        task = Task.objects.get(pk=task_id)
        stopped = task.cancellation != Cancellation.NONE or task.condition == TaskCondition.TERMINAL
        if op.compensates_id is None and (stopped or task_id in facts.stopped):
            why = facts.stopped.get(task_id, "stopped")
            raise Violation("no-claim-when-stopped", f"{op.pk} claimed in task {task_id} ({why})")
        # A pause holds covered work; a task that ended has none left but its saga's undoing.
        if (task.paused or task_id in facts.paused) and not (stopped and op.compensates_id):
            raise Violation("no-claim-when-stopped", f"{op.pk} claimed in paused task {task_id}")
        deadline = facts.deadlines.get(task_id)
        if op.compensates_id is None and deadline is not None and self.clock.now() >= deadline:
            raise Violation(
                "deadline-respected",
                f"{op.pk} claimed at {self.clock.now()}, past its task's deadline {deadline}",
            )
        gate = facts.gates.get(op.pk)
        if gate is not None and not gate.released:
            now = self.clock.now()
            entitled = gate.approver not in facts.demoted
            same = "as" if op.params == gate.params else "not as"
            if (
                not (gate.approved and entitled and now < gate.valid_until)
                or op.params != gate.params
            ):
                raise Violation(
                    "no-release-on-expired-or-denied",
                    f"{op.pk} released at {now}: approved {gate.approved} by {gate.approver} "
                    f"({'who may' if entitled else 'who may no longer'} approve), valid until "
                    f"{gate.valid_until}, parameters {same} approved",
                )
            gate.released = True
        approval = (
            Approval.objects.filter(operation_id=op.pk)
            .order_by("-proposal_version", "-created_at")
            .first()
        )
        if approval is not None and approval.status in ("denied", "expired", "pending"):
            raise Violation(
                "no-release-on-expired-or-denied",
                f"{op.pk} claimed with approval {approval.status}",
            )
        facts.handed(op.pk, lease.lease_generation, task=task_id, tool=op.tool)

    def _accepted(self, held: Held, what: str) -> None:
        """The runtime accepted ``held``'s report: only under the newest lease it handed out,
        and only once per lease."""
        self.checks += 1
        lease, facts = held.lease, self.facts
        op_id, generation = lease.operation_id, lease.lease_generation
        newest = facts.generations.get(op_id, 0)
        if generation < newest:
            raise Violation(
                "fencing",
                f"a stale result was accepted ({what}): {op_id} reported under generation "
                f"{generation} after generation {newest} was handed out",
            )
        if (op_id, generation) in facts.accepted:
            raise Violation(
                "fencing", f"a second report accepted ({what}) for {op_id} at {generation}"
            )
        assert held.report is not None
        facts.accept(op_id, generation, held.report)

    def _same_intent(self, task_id: str, spec: OperationSpec, op_id: str, refused: bool) -> None:
        """Two different intents never share a key: a proposal answered with an existing
        operation, or refused as ``idempotency_key_reused``, met the same step of the same
        tool (or wait kind) and intent version in the same attempt (no key is given here)."""
        self.checks += 1
        existing = Operation.objects.filter(pk=op_id).first()
        task = Task.objects.get(pk=task_id)
        same = existing is not None and (
            existing.task_id == task_id
            and existing.step == spec.step
            and existing.kind == spec.kind
            and existing.tool == spec.tool
            and existing.intent_version == spec.intent_version
            and existing.attempt_id == (task.current_attempt_id or "")
        )
        if not same:
            what = "refused as idempotency_key_reused" if refused else "answered with"
            other = (
                f"{existing.kind} {existing.tool or '-'} step {existing.step!r}"
                if existing is not None
                else f"no operation ({op_id!r})"
            )
            raise Violation(
                "keys-unambiguous",
                f"a {spec.kind} {spec.tool or '-'} step {spec.step!r} was {what} {other} "
                f"(key {existing.idempotency_key if existing else '?'})",
            )
