"""The workers' actions: claims (one, or a batch), the receiver's call through the worker's own
``_invoke``, heartbeats, reports (one, or a batch's), and workers that stall and come back late."""

from __future__ import annotations

import random

from runtime.dialect import one_statement_forms
from runtime.errors import DomainError
from runtime.executor import _invoke  # the worker's own call of the receiver
from runtime.models import Operation
from runtime.rules.statuses import OperationStatus
from runtime.simulation.agents import Agents
from runtime.simulation.catalog import CALL_KINDS, Held
from runtime.simulation.facts import Call, contract
from runtime.simulation.schedule import Step, Violation
from runtime.tools import adapter_for
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_batch import operations_report_batch
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_batch import operations_claim_batch
from runtime.transitions.lease import Lease, lease_heartbeat

S = OperationStatus


class Workers(Agents):
    def _claim(self, op_id: str, worker: int, step: Step) -> tuple[Held | None, str]:
        lease = operation_claim(op_id, execution_id=self.workers[worker], now=self.clock.now())
        if not isinstance(lease, Lease):
            return None, f"refused {lease.reason}"
        self._leased(lease, Operation.EXECUTOR_WORKER)
        if step.fault == "lost":
            # The claimant never saw its lease: the claim is orphaned until it expires.
            return None, f"claimed g{lease.lease_generation} (lost response)"
        held = Held(worker, lease)
        self.held.append(held)
        return held, f"claimed {op_id[-6:]} g{lease.lease_generation} by w{worker}"

    def _claimable(self, n: int) -> str | None:
        candidates = self._ops_where(
            status__in=(S.PENDING, S.RETRY_SCHEDULED),
            kind=Operation.KIND_TOOL,
            executor=Operation.EXECUTOR_WORKER,
        )
        if candidates and n % 3 == 0:
            # A saga's undo first, a third of the time: a stopped task's compensations are
            # where the risk is (they run in an ended task), and the run reaches its rest.
            undoing = self._ops_where(pk__in=candidates, compensates__isnull=False)
            if undoing:
                return str(self._pick(undoing, n // 3))
        if candidates:
            return str(self._pick(candidates, n))
        # One in four deliveries finds nothing due: a duplicate or late one, for work that
        # moved on (the claim must refuse it).
        return self._recent_op(n) if n % 4 == 0 else None

    def do_claim(self, step: Step) -> str:
        op_id = self._claimable(step.a)
        if op_id is None:
            return "nothing"
        return self._claim(op_id, step.b % len(self.workers), step)[1]

    def do_claim_batch(self, step: Step) -> str:
        if not one_statement_forms():
            return "no batches on this database"
        ids = self._ops_where(status=S.PENDING, tool="demo.echo")[: 1 + step.a % 4]
        if not ids:
            return "nothing"
        worker = step.b % len(self.workers)
        tools = [f"demo.echo:{v}" for v in adapter_for("demo.echo").supported_versions]
        batch = operations_claim_batch(
            ids, tools, execution_id=self.workers[worker], now=self.clock.now()
        )
        for lease in batch.leases:
            self._leased(lease, Operation.EXECUTOR_WORKER)
            if step.fault != "lost":
                self.held.append(Held(worker, lease, batched=True))
        return f"batch {len(batch.leases)} claimed, {len(batch.handed_back)} back"

    def do_call(self, step: Step) -> str:
        ready = [h for h in self.held if h.report is None]
        held = self._pick(ready, step.a)
        if held is None:
            return "nothing"
        return self._call(held, step.b)

    def _heartbeat(self, held: Held) -> bool | None:
        """The worker's heartbeat under its claim: whether it is asked to stop (None: its lease
        is gone). A saga's undoing outlives the stop it serves: it is never asked."""
        try:
            _, cancel = lease_heartbeat(
                held.lease.operation_id,
                held.lease.lease_generation,
                held.lease.lease_token,
                now=self.clock.now(),
            )
        except DomainError:
            return None
        self.checks += 1
        if cancel and held.lease.operation.compensates_id is not None:
            raise Violation(
                "undo-not-stopped",
                f"compensation {held.lease.operation_id} told to cancel by its heartbeat",
            )
        return cancel

    def _call(self, held: Held, variant: int) -> str:
        op = held.lease.operation
        if (variant // CALL_KINDS) % 2 == 0:
            self._heartbeat(held)  # a worker heartbeats while it works (half the calls here)
        kind = variant % CALL_KINDS
        if kind == 6 and contract(op.tool) in ("replay", "lookup"):
            kind = 0  # a receiver that answers for its key refuses for itself (or replays)
        reached, authoritative = True, True
        if kind == 5:
            held.report = Report(outcome="failed", error_kind="transient", message="sim")
            reached = authoritative = False
        elif kind == 6:
            held.report = Report(outcome="failed", error_kind="permanent", message="sim: refused")
        elif kind == 7:  # the request never reached the receiver, and nobody knows
            held.report = Report(outcome="unknown", message="sim: no answer")
            reached = authoritative = False
        else:
            report = _invoke(op, held.lease)
            # Two calls in ten lose the receiver's answer, three for a tool with effects (what
            # a stop, a repeat or a lookup must then get right).
            lost = kind >= 8 or (kind == 4 and contract(op.tool) != "pure")
            if lost and report.outcome == "succeeded":
                # The receiver acted; its answer was lost on the way back.
                report = Report(outcome="unknown", message="sim: answer lost")
            stale = "newer holder" in report.message
            authoritative = report.outcome != "unknown" and not stale
            held.report = report
        self.facts.called(
            op.pk, held.lease.lease_generation, Call(reached, held.report.outcome, authoritative)
        )
        return f"called {op.pk[-6:]} g{held.lease.lease_generation}: {held.report.outcome}"

    @staticmethod
    def _batched(held: Held) -> bool:
        """Whether ``held`` is reported with its batch (batches run where the hot path does)."""
        return held.batched and one_statement_forms()

    def _report(self, held: Held) -> str:
        lease = held.lease
        before = Operation.objects.get(pk=lease.operation_id)
        assert held.report is not None
        try:
            op = operation_report(
                lease.operation_id,
                lease_generation=lease.lease_generation,
                lease_token=lease.lease_token,
                state_version=lease.state_version,
                report=held.report,
                execution_id=self.workers[held.worker],
                snapshot=lease.operation,
                now=self.clock.now(),
                rng=random.Random(lease.lease_generation),
            )
        except DomainError as refused:
            return f"rejected {type(refused).__name__}"
        self.checks += 1
        if before.status != S.RUNNING or before.lease_generation != lease.lease_generation:
            raise Violation(
                "fencing",
                f"a stale result was accepted: {lease.operation_id} reported under generation "
                f"{lease.lease_generation} while it was {before.status} at generation "
                f"{before.lease_generation}",
            )
        self._accepted(held, "one report")
        return f"accepted {lease.operation_id[-6:]} -> {op.status}"

    def _report_batch(self, first: Held, step: Step) -> str:
        """The batch's ready claims reported together (``operations_report_batch``), as the
        drainer does: the one-statement acceptance, the others one by one."""
        group = [
            h
            for h in self.held
            if h.batched
            and h.report is not None
            and h.worker == first.worker
            and h.lease.lease_token == first.lease.lease_token
        ]
        before = {
            op.pk: op
            for op in Operation.objects.filter(pk__in=[h.lease.operation_id for h in group])
        }
        outcomes = operations_report_batch(
            [(h.lease.operation, h.report) for h in group if h.report is not None],
            lease_token=first.lease.lease_token,
            execution_id=self.workers[first.worker],
            now=self.clock.now(),
            rng=random.Random(first.lease.lease_generation),
        )
        for h in group:
            self.checks += 1
            was = before[h.lease.operation_id]
            if outcomes.get(h.lease.operation_id, "rejected") == "rejected":
                continue
            if was.status != S.RUNNING or was.lease_generation != h.lease.lease_generation:
                raise Violation(
                    "fencing",
                    f"a stale result was accepted in a batch: {was.pk} reported under "
                    f"generation {h.lease.lease_generation} while it was {was.status} at "
                    f"generation {was.lease_generation}",
                )
            self._accepted(h, "batch")
        accepted = sum(v != "rejected" for v in outcomes.values())
        for h in group:
            if step.fault == "lost" and outcomes.get(h.lease.operation_id) != "rejected":
                h.reported, h.batched = True, False  # reported again, alone (a duplicate)
            else:
                self.held.remove(h)
        return f"batch accepted {accepted} of {len(group)}" + (
            " (lost response)" if step.fault == "lost" else ""
        )

    # --- workers that stall, come back, heartbeat -----------------------------------

    def do_heartbeat(self, step: Step) -> str:
        held = self._pick(self.held, step.a)
        if held is None:
            return "nothing"
        cancel = self._heartbeat(held)
        if cancel is None:
            self.held.remove(held)  # lost its lease: the worker stops
            return "heartbeat refused"
        return f"heartbeat{' (cancel asked)' if cancel else ''}"

    def do_stall(self, step: Step) -> str:
        """A worker stops mid-call (a pause, a partition): its claim stays, it may come back."""
        held = self._pick(self.held, step.a)
        if held is None:
            return "nothing"
        self.held.remove(held)
        self.stalled.append(held)
        return f"stalled {held.lease.operation_id[-6:]} g{held.lease.lease_generation}"

    def do_late(self, step: Step) -> str:
        """A stalled worker comes back and finishes as if nothing happened (a late delivery)."""
        held = self._pick(self.stalled, step.a)
        if held is None:
            return "nothing"
        self.stalled.remove(held)
        note = "" if held.report is not None else self._call(held, step.b) + "; "
        return note + "late " + self._report(held)
