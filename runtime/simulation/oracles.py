"""The invariants (docs/simulation.md, "Invariants"), each written from the specification
(DESIGN.md and the seeds) and judged on facts recorded apart from the code under test: the
receivers' own records (runtime.sandbox), the journal, and what the simulation itself saw
(runtime.simulation.facts). None imports the runtime's own definitions of what they check.

Checked after every step, on what the step touched: the tasks of the events it journalled and
of the effects the receivers recorded (read from marks, so a step costs what it changed, not
what the run holds); and once over everything at the end of a run (``full``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Exists, F, OuterRef

from runtime.models import (
    Approval,
    Artifact,
    CheckResult,
    Invocation,
    Operation,
    OutboxMessage,
    RequiredCheck,
    Signal,
    Task,
)
from runtime.simulation.effects import RECORDED, Effects, Op
from runtime.simulation.facts import UNDONE_BY
from runtime.simulation.journal import _data
from runtime.simulation.ledger import MOVING, check_budgets, meters_of
from runtime.simulation.schedule import Violation


class Oracles(Effects):
    def after_step(self) -> None:
        touched, ended, succeeded = self._journal()
        effected = self._effects()
        for op_id in effected:
            task_id = self.facts.task_of.get(op_id)
            if task_id is not None:
                touched.add(task_id)
        if touched:
            self._judge(touched, ended | effected, succeeded)

    def full(self) -> None:
        """Every invariant over everything the run made (at its end)."""
        self._journal()
        self._effects()
        self._journal_whole()
        ops = set(Operation.objects.values_list("pk", flat=True))
        done = set(Task.objects.filter(outcome="succeeded").values_list("pk", flat=True))
        self._judge(set(self.tasks), ops, done)

    def _judge(self, touched: set[str], judged_ops: set[str], succeeded: set[str]) -> None:
        facts = self.facts
        # The tasks judged, their ancestors and their descendants (ledgers draw on each other).
        related = set(touched)
        grown = True
        while grown:
            more = {p for c, p in facts.parent.items() if c in related}
            more |= {c for c, p in facts.parent.items() if p in related}
            grown = not more <= related
            related |= more
        task_rows = {
            row[0]: row[1:]
            for row in Task.objects.filter(pk__in=related).values_list(
                "pk", "condition", "outcome", "event_seq", "paused", "compensate_on"
            )
        }
        rows = (
            Operation.objects.filter(task_id__in=related)
            .annotate(
                called=Exists(Invocation.objects.filter(operation_id=OuterRef("pk"))),
                announced=Exists(OutboxMessage.objects.filter(operation_id=OuterRef("pk"))),
            )
            .values_list(*Op._fields)
        )
        ops = [Op(*row) for row in rows]
        ops_of: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            ops_of[op.task_id].append(op)
        mine = [op for op in ops if op.task_id in touched]
        self._cursors(touched, task_rows)
        self._first_endings(touched, task_rows)
        self._endings([op for op in mine if op.id in judged_ops])
        self._nothing_lost(mine, task_rows)
        if any(facts.budgets.get(t) for t in related):
            self.checks += check_budgets(facts, touched, meters_of(related), ops_of, task_rows)
        if any(op.tool in RECORDED for op in mine):
            self._approvals(touched)
        if any(op.kind == Operation.KIND_WAIT_SIGNAL for op in mine):
            self._signals(touched, mine)
        self._checks(succeeded & touched)
        self._sagas(touched, task_rows, ops_of)

    def _nothing_lost(self, ops: list[Op], task_rows: dict[str, Any]) -> None:
        """Every operation is terminal, unresolved with evidence, or still owned or on its way:
        running under a lease, pending with an announcement (or in a paused task), or waiting."""
        for op in ops:
            self.checks += 1
            paused = task_rows[op.task_id][3]
            if op.status == "running" and op.lease_expires_at is None:
                raise Violation("no-operation-lost", f"{op.id} running without a lease")
            if op.status == "unresolved" and not op.called and not op.status_reason:
                raise Violation("no-operation-lost", f"{op.id} unresolved without evidence")
            if (
                op.status in ("pending", "retry_scheduled")
                and op.kind == Operation.KIND_TOOL
                and op.executor == Operation.EXECUTOR_WORKER
                and not op.announced
                and not paused
            ):
                raise Violation("no-operation-lost", f"{op.id} {op.status} and announced nowhere")

    def _approvals(self, touched: set[str]) -> None:
        self.checks += 1
        late = Approval.objects.filter(
            operation__task_id__in=touched, status="released", released_at__gte=F("expires_at")
        )
        for approval in late[:1]:
            raise Violation(
                "no-release-on-expired-or-denied",
                f"approval {approval.pk} released at {approval.released_at} after its expiry "
                f"{approval.expires_at}",
            )

    def _signals(self, touched: set[str], ops: list[Op]) -> None:
        """A signal is delivered exactly once to one wait, and none is lost: every consumed
        signal names a wait that succeeded with that very event; no wait consumed two; every
        signal wait that succeeded consumed one; a buffered signal is never left waiting beside
        a wait for its name; a duplicate or late signal is never consumed."""
        waits = {op.id: op for op in ops if op.kind == Operation.KIND_WAIT_SIGNAL}
        signals = list(Signal.objects.filter(task_id__in=touched).order_by("received_at", "id"))
        if not signals and not waits:
            return
        self.checks += 1
        consumed: dict[str, str] = {}
        for sig in signals:
            if sig.consumed_at is None:
                continue
            if sig.disposition not in (Signal.DELIVERED, Signal.BUFFERED):
                raise Violation("signal-once", f"{sig.disposition} signal {sig.pk} consumed")
            op = waits.get(sig.operation_id or "")
            event = _data(op.result).get("event_id") if op is not None else None
            if op is None or op.status != "succeeded" or event != sig.event_id:
                raise Violation(
                    "signal-once",
                    f"signal {sig.pk} ({sig.event_id}) consumed by {sig.operation_id}, which is "
                    f"{op.status if op else 'no wait'} with event {event}",
                )
            if sig.operation_id in consumed:
                raise Violation(
                    "signal-once",
                    f"wait {sig.operation_id} consumed {consumed[sig.operation_id]} and {sig.pk}",
                )
            consumed[str(sig.operation_id)] = sig.pk
        for op in waits.values():
            if op.status == "succeeded" and op.id not in consumed:
                raise Violation("signal-once", f"wait {op.id} succeeded with no signal consumed")
        waiting = {(op.task_id, op.signal) for op in waits.values() if op.status == "waiting"}
        for sig in signals:
            left = sig.disposition == Signal.BUFFERED and sig.consumed_at is None
            if left and (sig.task_id, sig.name) in waiting:
                raise Violation(
                    "signal-once",
                    f"buffered signal {sig.pk} left beside a wait for {sig.name!r}",
                )

    def _checks(self, done: set[str]) -> None:
        """A task succeeds only when every required check passed on its current accepted
        artifact: the simulation knows whether that artifact's bytes satisfy the schema, and a
        pass recorded on an artifact since replaced does not count."""
        for rc in RequiredCheck.objects.filter(task_id__in=done).order_by("id"):
            self.checks += 1
            name = str(rc.config.get("artifact"))
            current = Artifact.objects.filter(task_id=rc.task_id, name=name, status="accepted")
            subject = current.first()
            passed = (
                subject is not None
                and CheckResult.objects.filter(
                    task_id=rc.task_id,
                    name=rc.name,
                    result="passed",
                    subject_id=subject.pk,
                    subject_digest=subject.digest,
                ).exists()
            )
            valid = subject is not None and self.valid.get(subject.pk, False)
            if current.count() != 1 or not passed or not valid:
                raise Violation(
                    "success-needs-checks",
                    f"task {rc.task_id} succeeded but check {rc.name!r} did not pass on its "
                    f"current {name} ({subject.pk if subject else 'none accepted'}, "
                    f"content {'valid' if valid else 'invalid'}, pass recorded: {passed})",
                )

    def _sagas(
        self, touched: set[str], task_rows: dict[str, Any], ops_of: dict[str, list[Op]]
    ) -> None:
        """Every succeeded effect of a task that ended failed or cancelled with
        ``compensate_on`` is compensated, being compensated, or with a person: once nothing of
        the task is left to run or with a person, no effect that can be undone is still plainly
        succeeded."""
        for task_id in touched:
            condition, outcome, _, _, wanted = task_rows[task_id]
            if condition != "terminal" or not outcome or outcome not in (wanted or []):
                continue
            ops = ops_of.get(task_id, [])
            # Work still moving, or an undo a person must settle first (the saga waits for it).
            if any(op.status in MOVING or op.status == "unresolved" for op in ops):
                continue
            self.checks += 1
            for op in ops:
                # A success a person asserted with evidence only (no receiver result) names no
                # effect the saga could undo.
                asserted = isinstance(op.result, dict) and "resolution" in op.result
                if (
                    op.status == "succeeded"
                    and op.compensates_id is None
                    and op.tool in UNDONE_BY
                    and not asserted
                ):
                    raise Violation(
                        "saga-unwound",
                        f"task {task_id} ended {outcome} (compensate_on) and is at rest, but "
                        f"{op.id} ({op.tool}, step {op.step!r}) is still succeeded",
                    )


INVARIANTS = (
    "fencing",
    "executor-respected",
    "no-claim-when-stopped",
    "no-admission-when-stopped",
    "no-release-on-expired-or-denied",
    "keys-unambiguous",
    "effect-once",
    "effect-goes-to-a-person",
    "possible-effect-goes-to-a-person",
    "no-operation-lost",
    "usage-posted-as-reported",
    "holds-released-at-rest",
    "budgets-balance",
    "children-in-parents",
    "journal-gapless",
    "journal-ordered",
    "first-ending-stands",
    "signal-once",
    "timer-on-time",
    "success-needs-checks",
    "saga-unwound",
    "undo-not-stopped",
    "deadline-respected",
    "no-unexpected-error",
)
