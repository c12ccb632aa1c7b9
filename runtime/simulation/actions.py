"""The rest of the world's actions: the sweeper, the people, tasks and attempts, waits and
signals, artifacts and checks, agent-executed work, and the actions aimed where the risk is (a
takeover between a call and its report, a stop next to live or unconfirmed work, the clock moved
just past the next expiry, an artifact delivered and checked)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any
from unittest import mock

from django.db.models import Q

from runtime.accounts import console_user_create
from runtime.approvals import approval_decide, approval_edit, approval_expire_sweep, approval_renew
from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.attempts import attempt_create
from runtime.cancellation import task_cancel, task_fail
from runtime.checks import task_checks_run
from runtime.completion import task_complete
from runtime.control import task_pause, task_resume
from runtime.errors import DomainError
from runtime.models import Approval, Artifact, CheckResult, Event, Operation, Signal, Task
from runtime.resolutions import operation_resolve, resolutions_allowed
from runtime.rules.statuses import ApprovalStatus, OperationStatus, TaskCondition
from runtime.sandbox.models import Charge, Notification, Reservation
from runtime.signals import signal_send
from runtime.simulation.facts import contract
from runtime.simulation.schedule import Step, Violation
from runtime.simulation.world import (
    ARTIFACTS,
    GATED_VARIANT,
    HOSTILE_STEPS,
    MAX_TASKS,
    REPORT,
    VARIANTS,
    Held,
    WorldCore,
)
from runtime.tools import adapters
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim
from runtime.transitions.lease import Lease, lease_expire_sweep
from runtime.waits import wait_end_task, wait_renew, wait_sweep, wait_transform, wait_wake

S = OperationStatus
A = ApprovalStatus


class World(WorldCore):
    # --- workers that stall, come back, heartbeat ---------------------------------------------

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

    # --- the sweeper and the clock ---------------------------------------------------------------

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

    def _to(self, at: Any) -> str:
        """Move the clock just past ``at`` (never back)."""
        seconds = max(0.0, (at - self.clock.now()).total_seconds()) + 0.5
        self.clock.advance(seconds)
        self.clock.push()
        return f"+{seconds:.1f}s"

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

    # --- people ----------------------------------------------------------------------------

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
        """A stop aimed at a task with work in flight or a call nobody confirmed: cancelled,
        failed, paused, or completed leaving what is unresolved to people."""
        doubtful = {
            self.facts.task_of[op]
            for op, gens in self.facts.doubt.items()
            if gens and op in self.facts.task_of
        }
        busy = {h.lease.operation.task_id for h in self.held + self.stalled} | doubtful
        live = [t for t in self._live() if t in busy] or self._live()
        task_id = self._pick(live, step.a)
        if task_id is None:
            return "nothing live"
        how = ("cancel", "cancel", "fail", "pause", "complete")[step.b % 5]
        if how == "complete":
            return self._complete(task_id, "end_unresolved")
        return self._stop(how, step.b // 5, task_id) + self._lost(
            step, lambda: self._stop(how, step.b // 5, task_id)
        )

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

    # --- tasks and attempts ----------------------------------------------------------------------

    def _room(self) -> bool:
        live = Task.objects.exclude(condition=TaskCondition.TERMINAL)
        return len(self.tasks) < MAX_TASKS and live.count() < 6

    def do_new_task(self, step: Step) -> str:
        if not self._room():
            return "enough tasks"
        self._new_task(step.a, budget=step.b % 3 != 0)
        return f"task {self.tasks[-1][-6:]}"

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

    def do_new_attempt(self, step: Step) -> str:
        task_id = self._task(step.a)
        attempt = attempt_create(self.agent, task_id, reason="sim")
        return f"attempt {attempt.number}"

    # --- waits and timers --------------------------------------------------------------------

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

    # --- artifacts and checks -----------------------------------------------------------------

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

    # --- agent-executed operations ------------------------------------------------------------

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

    def coverage(self) -> dict[str, int]:
        """What the run got to exercise (printed by the command; the tests require some)."""
        text = "\n".join(self.trace)
        ops = self._ops()
        return {
            "claims": len(re.findall(r"claimed \S+ g\d+ by", text)),
            "acceptances": len(re.findall(r"accepted \S+ -> ", text)),
            "batch reports": len(re.findall(r"batch accepted [1-9]", text)),
            "agent reports": len(re.findall(r"agent reported \S+ -> ", text)),
            "takeovers": text.count("takeover of"),
            "late reports": text.count("late "),
            "stops of live work": len(
                re.findall(r"^\d+ stop_live (cancel|fail|pause) ", text, re.M)
            ),
            "artifacts accepted": text.count("accepted artifact") + text.count("delivered "),
            "checks passed": CheckResult.objects.filter(result="passed").count(),
            "tasks succeeded with checks": Task.objects.filter(
                outcome="succeeded", required_checks__isnull=False
            )
            .distinct()
            .count(),
            "compensations": ops.filter(compensates__isnull=False).count(),
            "unresolved": ops.filter(status=S.UNRESOLVED).count(),
            "resolved by a person": sum(len(v) for v in self.facts.resolved.values()),
            "signals delivered": Signal.objects.filter(consumed_at__isnull=False).count(),
            "signals late or duplicate": Signal.objects.filter(disposition=Signal.LATE).count()
            + text.count("duplicate"),
            "timers fired": Event.objects.filter(type="timer.fired").count(),
            "hostile steps": ops.filter(step__in=HOSTILE_STEPS).count(),
        }
