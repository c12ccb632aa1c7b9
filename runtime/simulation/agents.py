"""The agents' actions: proposals, tasks and attempts, waits and signals, artifacts and checks,
and the work an agent executes itself."""

from __future__ import annotations

import io
from typing import Any

from django.db.models import Q

from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.attempts import attempt_create
from runtime.checks import task_checks_run
from runtime.errors import DomainError, IdempotencyKeyReused
from runtime.models import Artifact, Operation, Task
from runtime.rules.statuses import OperationStatus, TaskCondition
from runtime.signals import signal_send
from runtime.simulation.catalog import (
    ARTIFACTS,
    HOSTILE_STEPS,
    MAX_TASKS,
    PAIRED_STEPS,
    REPORT,
    TOOLS,
    VARIANTS,
    Held,
)
from runtime.simulation.schedule import Step, Violation
from runtime.simulation.witness import Witness
from runtime.specs import OperationSpec
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim
from runtime.transitions.lease import Lease
from runtime.transitions.propose import operation_propose
from runtime.waits import wait_end_task, wait_renew, wait_transform, wait_wake

S = OperationStatus


class Agents(Witness):
    def do_propose(self, step: Step, task_id: str | None = None) -> str:
        task_id = task_id or self._task(step.a)
        variant = VARIANTS[step.b % len(VARIANTS)]
        # Half the proposals name their step from the hostile list (shared across tools and
        # kinds, so different intents meet on one step name), half from a tame one per variant.
        hostile = (step.a // 7) % 2 == 1
        name = HOSTILE_STEPS[step.a % len(HOSTILE_STEPS)] if hostile else ""
        if hostile and step.a % 2 == 0:
            name = PAIRED_STEPS.get(variant, name)
        if variant == len(TOOLS):
            spec = OperationSpec(
                kind=Operation.KIND_WAIT_SIGNAL,
                step=name or f"w{step.a % 4}",
                signal=f"sig{step.a % 2}",
                timeout_seconds=120,
            )
        elif variant == len(TOOLS) + 1:
            spec = OperationSpec(
                kind=Operation.KIND_TIMER,
                step=name or f"t{step.a % 3}",
                timeout_seconds=5 + (step.a % 3) * 20,
            )
        else:
            tool, params, executor = TOOLS[variant]
            spec = OperationSpec(
                tool=tool,
                params=dict(params),
                step=name or f"s{step.a % 7}-{variant}",
                executor=executor,
                estimate={"tokens": 3} if "_usage" in params else {},
                approval_timeout_seconds=30 + (step.b % 4) * 30,
                # One in three may be tried only twice: work runs out of attempts often, and
                # with a lost call behind it that is where an effect can be ended quietly.
                max_attempts=2 if (step.b // 7) % 3 == 0 else None,
            )

        def send() -> tuple[Operation, bool]:
            try:
                op, created = operation_propose(self.agent, task_id, spec)
            except IdempotencyKeyReused as refused:
                self._same_intent(task_id, spec, str(refused.details.get("operation", "")), True)
                raise
            if not created:
                self._same_intent(task_id, spec, op.pk, False)
            else:
                self._proposed(task_id, op, spec)
                if spec.kind == Operation.KIND_TIMER:
                    self.timer_due[op.pk] = op.wait_until
            return op, created

        op, created = send()
        return f"op {op.pk[-6:]} {'new' if created else 'same'}" + self._lost(step, send)

    # --- tasks and attempts ---------------------------------------------------------

    def _room(self) -> bool:
        live = Task.objects.exclude(condition=TaskCondition.TERMINAL)
        return len(self.tasks) < MAX_TASKS and live.count() < 6

    def do_new_task(self, step: Step) -> str:
        if not self._room():
            return "enough tasks"
        self._new_task(step.a, budget=step.b % 3 != 0)
        return f"task {self.tasks[-1][-6:]}"

    def do_new_attempt(self, step: Step) -> str:
        task_id = self._task(step.a)
        attempt = attempt_create(self.agent, task_id, reason="sim")
        return f"attempt {attempt.number}"

    # --- waits and timers -----------------------------------------------------------

    def do_signal(self, step: Step) -> str:
        task_id = self._task(step.a)
        name = f"sig{step.b % 2}"

        def send() -> Any:
            return signal_send(
                self.agent, task_id, event_id=f"e{step.a % 9}", name=name, payload={}
            )

        send()
        return f"signal {name}" + self._lost(step, send)

    def do_wake(self, step: Step) -> str:
        """A wake-up hint for a wait arrives (maybe early, maybe twice, maybe after the sweeper
        already woke it): ``wait_wake`` fires or expires it only when it is due."""
        op_id = self._pick(
            self._ops_where(kind__in=(Operation.KIND_TIMER, Operation.KIND_WAIT_SIGNAL)), step.a
        )
        if op_id is None:
            return "nothing"
        woke = wait_wake(op_id)
        return f"wake {op_id[-6:]}: {woke or 'not due'}"

    def do_wait_admin(self, step: Step) -> str:
        """An admin acts on an expired wait or approval: renews it, transforms it (cancelled; an
        approval denied), or ends its task."""
        # Signal waits and (one in two) expired approvals.
        kinds = Q(kind=Operation.KIND_WAIT_SIGNAL)
        if step.a % 2:
            kinds |= Q(approval_required=True)
        expired = self._ops().filter(status=S.EXPIRED).filter(kinds)
        op_id = self._pick(
            list(expired.order_by("created_at", "id").values_list("pk", flat=True)), step.a
        )
        if op_id is None:
            return "nothing"
        how = ("renew", "transform", "end")[step.b % 3]
        if how == "renew":
            seconds = 60 + step.b % 60
            wait_renew(self.admin, op_id, expires_in_seconds=seconds, reason="sim")
            self.facts.gate_renewed(op_id, self.clock.now(), seconds)
        elif how == "transform":
            wait_transform(self.admin, op_id, reason="sim")
        else:
            task = wait_end_task(self.admin, op_id, reason="sim")
            self.facts.stopped.setdefault(task.pk, "ended by an admin on an expired wait")
        return f"wait {how} {op_id[-6:]}"

    # --- artifacts and checks -------------------------------------------------------

    def _upload(self, task_id: str, n: int) -> Artifact:
        name, media_type, content, valid = ARTIFACTS[n % len(ARTIFACTS)]
        artifact = artifact_upload(
            self.agent, task_id, UploadSpec(name=name, media_type=media_type), io.BytesIO(content)
        )
        self.valid[artifact.pk] = valid
        return artifact

    def do_upload(self, step: Step) -> str:
        task_id = self._task(step.a)
        artifact = self._upload(task_id, step.b)
        ok = "valid" if self.valid[artifact.pk] else "invalid"
        return f"uploaded {artifact.pk[-6:]} {artifact.name} {ok}" + self._lost(
            step, lambda: self._upload(task_id, step.b)
        )

    def do_accept(self, step: Step) -> str:
        """The agent makes a stored artifact the task's entry for its name; one in four
        acceptances carries the version the agent read before someone else moved the task."""
        stored = list(
            Artifact.objects.filter(status="stored")
            .order_by("created_at", "id")
            .values_list("pk", "task_id")
        )
        picked = self._pick(stored, step.a)
        if picked is None:
            return "nothing"
        artifact_id, task_id = picked
        version = Task.objects.get(pk=task_id).state_version - (1 if step.b % 4 == 0 else 0)

        def send() -> Artifact:
            return artifact_accept(self.agent, artifact_id, expected_state_version=version)

        send()
        return f"accepted artifact {artifact_id[-6:]} at v{version}" + self._lost(step, send)

    def do_checks(self, step: Step) -> str:
        task_id = self._task(step.a)
        return self._checks(task_id, only_missing=bool(step.b % 2))

    def _checks(self, task_id: str, *, only_missing: bool) -> str:
        states = task_checks_run(self.agent, task_id, only_missing=only_missing)
        return "checks " + ",".join(
            f"{s.name}={'ok' if s.counts else (s.latest.result if s.latest else 'pending')}"
            for s in states
        )

    def do_deliver(self, step: Step) -> str:
        """An agent delivers what a checked task promised: its report (valid, mostly) and notes
        uploaded and accepted at the task's current version, then its checks run, so checks can
        pass and checked tasks can succeed."""
        checked = list(
            Task.objects.filter(pk__in=self._live(), required_checks__isnull=False)
            .distinct()
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
        )
        task_id = self._pick(checked, step.a)
        if task_id is None:
            return "nothing to deliver"
        report = (0, 3, 1)[step.b % 3]  # a valid report twice in three
        for n in (report, 4):
            artifact = self._upload(task_id, n)
            version = Task.objects.get(pk=task_id).state_version
            artifact_accept(self.agent, artifact.pk, expected_state_version=version)
        ok = "valid" if ARTIFACTS[report][3] else "invalid"
        return f"delivered {REPORT} ({ok}) to {task_id[-6:]}; " + self._checks(
            task_id, only_missing=False
        )

    # --- agent-executed operations --------------------------------------------------

    def do_agent_claim(self, step: Step) -> str:
        candidates = self._ops_where(
            status__in=(S.PENDING, S.RETRY_SCHEDULED), executor=Operation.EXECUTOR_AGENT
        )
        op_id = self._pick(candidates, step.a) or self._recent_op(step.a)
        if op_id is None:
            return "nothing"
        lease = agent_claim(op_id, self.agent_execution, actor=self.agent.label)
        assert isinstance(lease, Lease)
        self._leased(lease, Operation.EXECUTOR_AGENT)
        if step.fault == "lost":
            return f"agent claimed g{lease.lease_generation} (lost response)"
        self.agent_held.append(Held(-1, lease))
        return f"agent claimed {op_id[-6:]} g{lease.lease_generation}"

    def do_agent_report(self, step: Step) -> str:
        """The agent reports what it did; a report may be one it already sent (a lost
        response), or come after its lease was taken back (late)."""
        held = self._pick(self.agent_held, step.a)
        if held is None:
            return "nothing"
        kind = step.b % 5
        if held.report is None:
            held.report = (
                Report(outcome="succeeded", result={"by": "agent"}, usage={"tokens": 1})
                if kind < 3
                else Report(outcome="failed", error_kind="transient", message="sim")
                if kind == 3
                else Report(outcome="unknown", message="sim: the agent lost track")
            )
        lease = held.lease
        before = Operation.objects.get(pk=lease.operation_id)
        try:
            after = agent_report(
                lease.operation,
                lease_generation=lease.lease_generation,
                lease_token=lease.lease_token,
                report=held.report,
                actor=self.agent.label,
            )
        except DomainError as refused:
            self.agent_held.remove(held)
            return f"agent report rejected {type(refused).__name__}"
        self.checks += 1
        fresh = before.status == S.RUNNING and before.lease_generation == lease.lease_generation
        if after.state_version != before.state_version:
            if not fresh:
                raise Violation(
                    "fencing",
                    f"a stale agent report was accepted: {before.pk} reported under generation "
                    f"{lease.lease_generation} while it was {before.status} at generation "
                    f"{before.lease_generation}",
                )
            self._accepted(held, "agent")
        if step.fault != "lost":
            self.agent_held.remove(held)  # else: the agent did not see the answer, sends again
        return f"agent reported {before.pk[-6:]} -> {after.status}" + (
            " (lost response)" if step.fault == "lost" else ""
        )
