"""The scheduler, its actions and the invariants (docs/simulation.md).

A schedule is a list of abstract steps drawn from the seed before anything runs: an action, two
numbers that pick its subject and variant (modulo what exists when the step runs) and a fault.
So the same seed is the same schedule, byte for byte, and a schedule with steps removed is still
a schedule (the shrinker replays such sublists). Each step is whole transactions of the real
services; what is "in flight" is a claim a simulated worker holds and has not reported yet."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.management.color import no_style
from django.db import connection
from django.db.models import Count, F, Max, Min

from runtime import budgets, hotpath
from runtime.accounts import console_user_create
from runtime.actors import Actor, actor_for_agent, actor_for_user
from runtime.approvals import (
    approval_decide,
    approval_edit,
    approval_expire_sweep,
    approval_renew,
)
from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.attempts import attempt_create
from runtime.cancellation import task_cancel, task_fail
from runtime.checks import task_checks_run
from runtime.completion import task_complete
from runtime.control import task_pause, task_resume
from runtime.crashpoints import crash_point_installed
from runtime.errors import DomainError, IdempotencyKeyReused
from runtime.executor import _invoke  # the worker's own call of the receiver
from runtime.leases import (
    Lease,
    agent_claim,
    lease_expire_sweep,
    lease_heartbeat,
    operation_claim,
    operations_claim_batch,
)
from runtime.models import (
    Approval,
    Artifact,
    BudgetMeter,
    CheckResult,
    Event,
    Execution,
    Invocation,
    Operation,
    OutboxMessage,
    RequiredCheck,
    Resolution,
    Signal,
    Task,
)
from runtime.operations import (
    OperationSpec,
    Report,
    agent_report,
    operation_propose,
    operation_report,
    operations_report_batch,
)
from runtime.resolutions import operation_resolve, resolutions_allowed
from runtime.sandbox.models import Charge, Notification, Reservation
from runtime.signals import signal_send
from runtime.simulation.clock import FakeClock, simulated_clock
from runtime.stoprule import CONFIRMED_OUTCOMES
from runtime.tasks import TaskSpec, task_create
from runtime.tokens import token_issue_for_agent
from runtime.tools import Contract, adapter_for, adapters, contract_of
from runtime.transitions import ApprovalStatus, Cancellation, OperationStatus, TaskCondition
from runtime.waits import wait_end_task, wait_renew, wait_sweep, wait_transform, wait_wake

S = OperationStatus
A = ApprovalStatus

# Action -> weight. The weights make the interesting interleavings common: claims and reports
# outnumber stops, and the clock moves often enough for leases, approvals and waits to expire.
ACTIONS: dict[str, int] = {
    "propose": 13,
    "claim": 12,
    "claim_batch": 3,
    "call": 11,
    "report": 12,
    "heartbeat": 3,
    "stall": 3,
    "late": 4,
    "tick": 8,
    "sweep": 6,
    "cancel": 2,
    "pause": 2,
    "resume": 3,
    "fail": 1,
    "complete": 3,
    "decide": 6,
    "edit": 1,
    "renew": 2,
    "resolve": 3,
    "new_task": 4,
    "new_attempt": 1,
    "child": 1,
    "signal": 3,
    "wake": 2,
    "wait_admin": 1,
    "upload": 3,
    "accept": 3,
    "checks": 1,
    "agent_claim": 3,
    "agent_report": 3,
}
FAULTS = ("none",) * 8 + ("crash", "lost")

# Where a step's process stops before its commit (the crash fault), per action.
CRASH_POINTS: dict[str, tuple[str, ...]] = {
    "report": ("report.before_commit", "report.batch_before_commit"),
    "late": ("report.before_commit",),
    "claim": ("claim.approval_released", "claim.after_read"),
    "claim_batch": ("claim.batch_before_commit",),
    "sweep": ("sweep.after_read", "approval.expire_locked"),
    "cancel": ("cancel.after_lock", "rest.after_read"),
    "fail": ("cancel.after_lock", "rest.after_read"),
    "pause": ("control.applied",),
    "resume": ("control.applied",),
    "complete": ("complete.before_commit",),
    "decide": ("approval.before_commit",),
    "new_attempt": ("attempt.before_commit",),
    "resolve": ("resolve.before_lock",),
    "signal": ("signal.task_locked",),
    "propose": ("wait.registered", "wait.before_register"),
    "upload": ("artifact.after_put",),
    "accept": ("artifact.accept_before_commit",),
    "agent_claim": ("claim.after_read",),
    "agent_report": ("report.before_commit",),
}

# Tools the agents propose: (tool, params, executor); the approval threshold of the payments
# receiver is 10000 cents, so the second charge waits for a person. A notification to
# "demo.echo" and a refund are there for the key domains: before parts were escaped, an echo
# step "notify:x" had the key of a notification "x" to "demo.echo", and a refund step
# "<step>:demo.payments.charge:v1:compensate" the key of that charge's compensation.
TOOLS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("demo.echo", {"n": 1}, "worker"),
    ("demo.payments.charge", {"account": "acct", "amount_cents": 500}, "worker"),
    ("demo.payments.charge", {"account": "acct", "amount_cents": 20000}, "worker"),
    ("demo.inventory.reserve", {"sku": "sku", "qty": 1}, "worker"),
    ("demo.notify", {"to": "ops", "message": "hi"}, "worker"),
    ("demo.echo", {"n": 2, "_usage": {"tokens": 3}}, "worker"),
    ("demo.notify", {"to": "demo.echo", "message": "hi"}, "worker"),
    ("demo.payments.refund", {"charge": "ch_sim"}, "worker"),
    ("demo.echo", {"n": 3}, "agent"),
    ("demo.echo", {"n": 4, "_usage": {"tokens": 2}}, "agent"),
)
WAIT_VARIANTS = 2  # a signal wait, a timer
# A proposal's variant: an index into TOOLS, or past it a wait. The small charge (an effect a
# saga must undo) comes up more often than the rest.
VARIANTS = (*range(len(TOOLS)), 1, 1, len(TOOLS), len(TOOLS) + 1)

# Step names an agent may choose, hostile to keys that join parts with separators: the
# separator itself, the escape character, a namespace separator, a derived key's literal field
# ("notify", "compensate", "check"), an escape sequence spelled out, non-ASCII letters.
HOSTILE_STEPS = (
    "notify:x",
    "x",
    "s",
    "s:demo.payments.charge:v1:compensate",
    "a:b",
    "a%3Ab",
    "x/y ünï·日本",
)
# Variant -> the hostile step that meets another intent's key if parts are not escaped: an echo
# "notify:x" and a notification "x" to "demo.echo"; a refund step spelling the compensation key
# of the charge step "s".
PAIRED_STEPS = {0: "notify:x", 6: "x", 1: "s", 7: "s:demo.payments.charge:v1:compensate"}

# Completion checks a task may require, on its artifact "report.json"; the oracle knows which
# uploaded content satisfies the schema (ARTIFACTS: content, valid).
REPORT = "report.json"
SCHEMA = {"type": "object", "required": ["ok"], "properties": {"ok": {"enum": [True]}}}
REQUIRED_CHECKS: tuple[dict[str, Any], ...] = (
    {
        "name": "report-valid",
        "checker": "json_schema",
        "config": {"artifact": REPORT, "schema": SCHEMA},
    },
    {
        "name": "report-op",
        "checker": "operation",
        "config": {"artifact": REPORT, "tool": "check.json_schema", "params": {"schema": SCHEMA}},
    },
    {"name": "notes-present", "checker": "artifact_present", "config": {"artifact": "notes.txt"}},
)
ARTIFACTS: tuple[tuple[str, str, bytes, bool], ...] = (
    (REPORT, "application/json", b'{"ok": true, "n": 1}', True),
    (REPORT, "application/json", b'{"ok": false}', False),
    (REPORT, "application/json", b"not json", False),
    (REPORT, "application/json", b'{"ok": true, "n": 2}', True),
    ("notes.txt", "text/plain", b"notes", True),
)


class SimCrash(Exception):
    """The step's process stopped at a named crash point (before its commit)."""


@dataclass(frozen=True)
class Step:
    action: str
    a: int
    b: int
    fault: str

    def as_list(self) -> list[Any]:
        return [self.action, self.a, self.b, self.fault]


def schedule_for(seed: int, steps: int) -> list[Step]:
    rng = random.Random(seed)
    names, weights = list(ACTIONS), list(ACTIONS.values())
    return [
        Step(
            rng.choices(names, weights)[0],
            rng.randrange(1 << 16),
            rng.randrange(1 << 16),
            rng.choice(FAULTS),
        )
        for _ in range(steps)
    ]


def schedule_digest(schedule: list[Step]) -> str:
    text = json.dumps([s.as_list() for s in schedule], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Violation(Exception):
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass
class Held:
    """A claim a simulated worker holds: claimed, maybe called (its report ready), not reported."""

    worker: int
    lease: Lease
    report: Report | None = None
    reported: bool = False  # accepted, but the response was lost: the worker will report again
    batched: bool = False  # claimed by a batch: reported with the batch's other ready claims


@dataclass
class Outcome:
    steps: int
    checks: int
    violation: Violation | None = None
    failed_at: int | None = None  # index into the schedule
    trace: list[str] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)

    def trace_digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()


def reset_database() -> None:
    """Empty every table (the schema stays) and the process caches keyed by ids, which replay."""
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables))
    budgets._BUDGETS.clear()


class World:
    def __init__(self, seed: int, clock: FakeClock) -> None:
        self.seed = seed
        self.clock = clock
        self.checks = 0
        self.trace: list[str] = []
        issued = token_issue_for_agent(f"sim-agent-{seed}")
        assert issued.token.agent is not None
        self.agent = actor_for_agent(issued.token.agent.pk, issued.token.agent.name)
        self.operators = [self._person("operator", f"op{i}") for i in range(2)]
        self.admin = self._person("admin", "admin")
        self.support = self._person("support", "support")
        self.workers = [Execution.objects.create(host="sim", pid=i + 1).pk for i in range(3)]
        self.agent_execution = Execution.objects.create(
            kind="agent", host="agent:sim", label="sim"
        ).pk
        self.tasks: list[str] = []
        self.held: list[Held] = []
        self.agent_held: list[Held] = []  # claims of agent-executed operations the agent holds
        self.valid: dict[str, bool] = {}  # artifact id -> its content satisfies SCHEMA (oracle)
        self.timer_due: dict[str, Any] = {}  # timer id -> when it may fire, at its proposal
        self.stalled: list[Held] = []  # workers that stopped mid-call and may come back late
        self.endings: dict[str, tuple[str, str | None]] = {}
        self.lost_retry: Callable[[], Any] | None = None
        for i in range(3):
            self._new_task(i, budget=i == 1)

    def _person(self, role: str, name: str) -> Actor:
        user = console_user_create(f"sim-{name}", role, "correct-horse-battery-staple")
        return actor_for_user(user.pk, f"sim-{name}")

    def _new_task(self, n: int, *, budget: bool, parent: str | None = None) -> None:
        spec = TaskSpec(name=f"sim task {len(self.tasks)}")
        if n % 3 == 0:  # unwound on failure or cancellation (runtime.compensation)
            spec.compensate_on = ["failed", "cancelled"]
        if n % 3 == 2:  # succeeds only with its checks passed on the current artifacts
            spec.required_checks = [dict(c) for c in REQUIRED_CHECKS[: 1 + (n // 3) % 3]]
        if budget:
            spec.budget = {"tokens": 20 if parent is None else 6, "tool_calls": 12}
        spec.parent = parent
        task = task_create(self.agent, spec)
        self.tasks.append(task.pk)

    # --- picking ------------------------------------------------------------------------

    def _task(self, n: int, *, paused: bool = False) -> str:
        """Mostly a live task, not paused (or a paused one, with ``paused``); one in five picks
        any task, so stopped and paused ones are asked too."""
        live = list(
            Task.objects.filter(pk__in=self.tasks, cancellation=Cancellation.NONE, paused=paused)
            .exclude(condition=TaskCondition.TERMINAL)
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
        )
        if live and n % 5:
            return str(live[n % len(live)])
        return str(self.tasks[n % len(self.tasks)])

    @staticmethod
    def _pick(items: list[Any], n: int) -> Any:
        return items[n % len(items)] if items else None

    def _ops(self) -> Any:
        """Every operation of the simulation's tasks: proposed by the agent, by a check run or
        by a saga (compensations)."""
        return Operation.objects.filter(task_id__in=self.tasks)

    def _ops_where(self, **filters: Any) -> list[str]:
        return list(
            self._ops().filter(**filters).order_by("created_at", "id").values_list("pk", flat=True)
        )

    # --- the step --------------------------------------------------------------------------

    def step(self, index: int, step: Step) -> str:
        self.clock.advance(0.01)  # every step is a later moment
        self.clock.push()
        action = getattr(self, f"do_{step.action}")
        points = CRASH_POINTS.get(step.action, ()) if step.fault == "crash" else ()

        def stop() -> None:
            raise SimCrash(points[step.b % len(points)])

        try:
            if points:
                with crash_point_installed(points[step.b % len(points)], stop):
                    note = action(step)
            else:
                note = action(step)
        except SimCrash as crash:
            note = f"crashed at {crash}"
        except DomainError as refused:
            note = f"refused {type(refused).__name__}: {str(refused)[:70]}"
        return note or "-"

    def _lost(self, step: Step, retry: Callable[[], Any]) -> str:
        """A lost response: the caller did not see the result and sends the request again."""
        if step.fault != "lost":
            return ""
        try:
            retry()
            return " (lost response, retried)"
        except DomainError as refused:
            return f" (lost response, retry refused {type(refused).__name__})"

    # --- agents ----------------------------------------------------------------------------

    def do_propose(self, step: Step) -> str:
        task_id = self._task(step.a)
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
            )

        def send() -> tuple[Operation, bool]:
            try:
                op, created = operation_propose(self.agent, task_id, spec)
            except IdempotencyKeyReused as refused:
                self._same_intent(task_id, spec, str(refused.details.get("operation", "")), True)
                raise
            if not created:
                self._same_intent(task_id, spec, op.pk, False)
            elif spec.kind == Operation.KIND_TIMER:
                self.timer_due[op.pk] = op.wait_until
            return op, created

        op, created = send()
        return f"op {op.pk[-6:]} {'new' if created else 'same'}" + self._lost(step, send)

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

    def do_signal(self, step: Step) -> str:
        task_id = self._task(step.a)
        name = f"sig{step.b % 2}"

        def send() -> Any:
            return signal_send(
                self.agent, task_id, event_id=f"e{step.a % 9}", name=name, payload={}
            )

        send()
        return f"signal {name}" + self._lost(step, send)

    # --- workers ---------------------------------------------------------------------------

    def _claim_guard(self, op_id: str) -> tuple[Task, Approval | None]:
        op = Operation.objects.get(pk=op_id)
        approval = (
            Approval.objects.filter(operation_id=op_id)
            .order_by("-proposal_version", "-created_at")
            .first()
        )
        return Task.objects.get(pk=op.task_id), approval

    def _claimed_check(
        self, op_id: str, task: Task, approval: Approval | None, executor: str = "worker"
    ) -> None:
        self.checks += 1
        op = Operation.objects.get(pk=op_id)
        if op.executor != executor:
            raise Violation(
                "executor-respected", f"{op_id} ({op.executor}-executed) claimed by a {executor}"
            )
        stopped = task.cancellation != Cancellation.NONE or task.condition == TaskCondition.TERMINAL
        if stopped and op.compensates_id is None:  # compensations outlive the stop they serve
            raise Violation("no-claim-when-stopped", f"{op_id} claimed in stopped task {task.pk}")
        if task.paused:
            raise Violation("no-claim-when-stopped", f"{op_id} claimed in paused task {task.pk}")
        if approval is not None and approval.status in (A.DENIED, A.EXPIRED, A.PENDING):
            raise Violation(
                "no-release-on-expired-or-denied",
                f"{op_id} claimed with approval {approval.status}",
            )

    def do_claim(self, step: Step) -> str:
        candidates = self._ops_where(
            status__in=(S.PENDING, S.RETRY_SCHEDULED),
            kind=Operation.KIND_TOOL,
            executor=Operation.EXECUTOR_WORKER,
        )
        op_id = self._pick(candidates, step.a) or self._pick(self._ops_where(), step.a)
        if op_id is None:
            return "nothing"
        task, approval = self._claim_guard(op_id)
        worker = step.b % len(self.workers)
        lease = operation_claim(op_id, execution_id=self.workers[worker], now=self.clock.now())
        if not isinstance(lease, Lease):
            return f"refused {lease.reason}"
        self._claimed_check(op_id, task, approval)
        if step.fault == "lost":
            # The claimant never saw its lease: the claim is orphaned until it expires.
            return f"claimed g{lease.lease_generation} (lost response)"
        self.held.append(Held(worker, lease))
        return f"claimed {op_id[-6:]} g{lease.lease_generation} by w{worker}"

    def do_claim_batch(self, step: Step) -> str:
        if not hotpath.enabled():
            return "no batches on this database"
        ids = self._ops_where(status=S.PENDING, tool="demo.echo")[: 1 + step.a % 4]
        if not ids:
            return "nothing"
        guards = {i: self._claim_guard(i) for i in ids}
        worker = step.b % len(self.workers)
        tools = [f"demo.echo:{v}" for v in adapter_for("demo.echo").supported_versions]
        batch = operations_claim_batch(
            ids, tools, execution_id=self.workers[worker], now=self.clock.now()
        )
        for lease in batch.leases:
            self._claimed_check(lease.operation_id, *guards[lease.operation_id])
            if step.fault != "lost":
                self.held.append(Held(worker, lease, batched=True))
        return f"batch {len(batch.leases)} claimed, {len(batch.handed_back)} back"

    def do_call(self, step: Step) -> str:
        ready = [h for h in self.held if h.report is None]
        held = self._pick(ready, step.a)
        if held is None:
            return "nothing"
        return self._call(held, step.b)

    def _call(self, held: Held, variant: int) -> str:
        op = held.lease.operation
        kind = variant % 8
        if kind == 4:
            held.report = Report(outcome="failed", error_kind="transient", message="sim")
        elif kind == 5:
            held.report = Report(outcome="failed", error_kind="permanent", message="sim")
        elif kind == 6:  # the request never reached the receiver, and nobody knows
            held.report = Report(outcome="unknown", message="sim: no answer")
        else:
            report = _invoke(op, held.lease)
            if kind == 7 and report.outcome == "succeeded":
                # The receiver acted; its answer was lost on the way back.
                report = Report(outcome="unknown", message="sim: answer lost")
            held.report = report
        return f"called {op.pk[-6:]} g{held.lease.lease_generation}: {held.report.outcome}"

    def do_report(self, step: Step) -> str:
        ready = [h for h in self.held if h.report is not None]
        held = self._pick(ready, step.a)
        if held is None:
            return "nothing"
        if held.batched and hotpath.enabled():
            return self._report_batch(held, step)
        note = self._report(held)
        if step.fault == "lost" and note.startswith("accepted"):
            held.reported = True  # the worker did not see it and reports again later
            return note + " (lost response)"
        self.held.remove(held)
        return note

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
        accepted = sum(v != "rejected" for v in outcomes.values())
        for h in group:
            if step.fault == "lost" and outcomes.get(h.lease.operation_id) != "rejected":
                h.reported, h.batched = True, False  # reported again, alone (a duplicate)
            else:
                self.held.remove(h)
        return f"batch accepted {accepted} of {len(group)}" + (
            " (lost response)" if step.fault == "lost" else ""
        )

    def do_heartbeat(self, step: Step) -> str:
        held = self._pick(self.held, step.a)
        if held is None:
            return "nothing"
        try:
            _, cancel = lease_heartbeat(
                held.lease.operation_id,
                held.lease.lease_generation,
                held.lease.lease_token,
                now=self.clock.now(),
            )
        except DomainError:
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

    # --- the sweeper -----------------------------------------------------------------------

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

    # --- people ----------------------------------------------------------------------------

    def _task_call(
        self, step: Step, call: Callable[[Actor, str], Any], name: str, *, paused: bool = False
    ) -> str:
        task_id = self._task(step.a, paused=paused)
        actor = self.agent if step.b % 2 else self.admin
        call(actor, task_id)
        return f"{name} {task_id[-6:]}" + self._lost(step, lambda: call(actor, task_id))

    def do_cancel(self, step: Step) -> str:
        return self._task_call(step, lambda a, t: task_cancel(a, t, "sim"), "cancel")

    def do_fail(self, step: Step) -> str:
        return self._task_call(step, lambda a, t: task_fail(a, t, "sim"), "fail")

    def do_pause(self, step: Step) -> str:
        return self._task_call(step, lambda a, t: task_pause(a, t, reason="sim"), "pause")

    def do_resume(self, step: Step) -> str:
        return self._task_call(
            step, lambda a, t: task_resume(a, t, reason="sim"), "resume", paused=True
        )

    def do_complete(self, step: Step) -> str:
        mode = ("refuse", "end_unresolved")[step.b % 2]
        task_id = self._task(step.a)

        def call() -> Any:
            return task_complete(self.agent, task_id, if_unresolved=mode)

        call()
        return f"complete {task_id[-6:]}" + self._lost(step, call)

    def _approvals(self, status: str) -> list[Approval]:
        return list(
            Approval.objects.filter(operation__task_id__in=self.tasks, status=status).order_by(
                "created_at", "id"
            )
        )

    def do_decide(self, step: Step) -> str:
        approval = self._pick(self._approvals(A.PENDING), step.a)
        if approval is None:
            return "nothing"
        decision = "approve" if step.b % 3 else "deny"
        operator = self.operators[step.b % 2]

        def call() -> Any:
            return approval_decide(
                operator,
                approval.pk,
                decision=decision,
                reason="sim",
                params_hash=approval.params_hash,
            )

        call()
        return f"{decision} {approval.pk[-6:]}" + self._lost(step, call)

    def do_edit(self, step: Step) -> str:
        approval = self._pick(self._approvals(A.PENDING), step.a)
        if approval is None:
            return "nothing"
        params = dict(approval.params, amount_cents=15000 + step.b % 7)
        approval_edit(self.operators[step.b % 2], approval.pk, params=params, reason="sim")
        return f"edited {approval.pk[-6:]}"

    def do_renew(self, step: Step) -> str:
        approval = self._pick(self._approvals(A.EXPIRED), step.a)
        if approval is None:
            return "nothing"
        approval_renew(self.admin, approval.pk, expires_in_seconds=120, reason="sim")
        return f"renewed {approval.pk[-6:]}"

    def do_resolve(self, step: Step) -> str:
        ops = list(self._ops().filter(status=S.UNRESOLVED).order_by("created_at", "id"))
        op = self._pick(ops, step.a)
        if op is None:
            return "nothing"
        allowed = resolutions_allowed(op)
        if not allowed:
            return "no resolution allowed"
        resolution = allowed[step.b % len(allowed)]

        def call() -> Any:
            return operation_resolve(
                self.support,
                op.pk,
                resolution=resolution,
                evidence="sim evidence",
                state_version=op.state_version,
            )

        call()
        return f"resolved {op.pk[-6:]} {resolution}" + self._lost(step, call)

    def _room(self) -> bool:
        live = Task.objects.filter(pk__in=self.tasks).exclude(condition=TaskCondition.TERMINAL)
        return len(self.tasks) < 60 and live.count() < 5

    def do_new_task(self, step: Step) -> str:
        if not self._room():
            return "enough tasks"
        self._new_task(step.a, budget=bool(step.b % 2))
        return f"task {self.tasks[-1][-6:]}"

    def do_child(self, step: Step) -> str:
        if not self._room():
            return "enough tasks"
        budgeted = [t for t in self.tasks if Task.objects.filter(pk=t).exclude(budget={}).exists()]
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
        """An admin acts on an expired signal wait: renews it, transforms it (cancelled), or
        ends its task."""
        op_id = self._pick(
            self._ops_where(kind=Operation.KIND_WAIT_SIGNAL, status=S.EXPIRED), step.a
        )
        if op_id is None:
            return "nothing"
        how = ("renew", "transform", "end")[step.b % 3]
        if how == "renew":
            wait_renew(self.admin, op_id, expires_in_seconds=60 + step.b % 60, reason="sim")
        elif how == "transform":
            wait_transform(self.admin, op_id, reason="sim")
        else:
            wait_end_task(self.admin, op_id, reason="sim")
        return f"wait {how} {op_id[-6:]}"

    # --- artifacts and checks -----------------------------------------------------------------

    def do_upload(self, step: Step) -> str:
        task_id = self._task(step.a)
        name, media_type, content, valid = ARTIFACTS[step.b % len(ARTIFACTS)]

        def send() -> Artifact:
            artifact = artifact_upload(
                self.agent,
                task_id,
                UploadSpec(name=name, media_type=media_type),
                io.BytesIO(content),
            )
            self.valid[artifact.pk] = valid
            return artifact

        artifact = send()
        return f"uploaded {artifact.pk[-6:]} {name} {'valid' if valid else 'invalid'}" + self._lost(
            step, send
        )

    def do_accept(self, step: Step) -> str:
        """The agent makes a stored artifact the task's entry for its name; one in four
        acceptances carries the version the agent read before someone else moved the task."""
        stored = list(
            Artifact.objects.filter(task_id__in=self.tasks, status="stored")
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
        states = task_checks_run(self.agent, task_id, only_missing=bool(step.b % 2))
        return "checks " + ",".join(
            f"{s.name}={'ok' if s.counts else (s.latest.result if s.latest else 'pending')}"
            for s in states
        )

    # --- agent-executed operations ------------------------------------------------------------

    def do_agent_claim(self, step: Step) -> str:
        candidates = self._ops_where(
            status__in=(S.PENDING, S.RETRY_SCHEDULED), executor=Operation.EXECUTOR_AGENT
        )
        op_id = self._pick(candidates, step.a) or self._pick(self._ops_where(), step.a)
        if op_id is None:
            return "nothing"
        task, approval = self._claim_guard(op_id)
        lease = agent_claim(op_id, self.agent_execution, actor=self.agent.label)
        self._claimed_check(op_id, task, approval, executor=Operation.EXECUTOR_AGENT)
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
        if not fresh and after.state_version != before.state_version:
            raise Violation(
                "fencing",
                f"a stale agent report was accepted: {before.pk} reported under generation "
                f"{lease.lease_generation} while it was {before.status} at generation "
                f"{before.lease_generation}",
            )
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
            "claims": text.count(" claimed "),
            "acceptances": text.count(" accepted "),
            "batch reports": len(re.findall(r"batch accepted [1-9]", text)),
            "agent reports": len(re.findall(r"agent reported \S+ -> ", text)),
            "artifacts accepted": text.count("accepted artifact"),
            "checks passed": CheckResult.objects.filter(
                task_id__in=self.tasks, result="passed"
            ).count(),
            "tasks succeeded with checks": Task.objects.filter(
                pk__in=self.tasks, outcome="succeeded", required_checks__isnull=False
            )
            .distinct()
            .count(),
            "compensations": ops.filter(compensates__isnull=False).count(),
            "signals delivered": Signal.objects.filter(
                task_id__in=self.tasks, consumed_at__isnull=False
            ).count(),
            "signals late or duplicate": Signal.objects.filter(
                task_id__in=self.tasks, disposition=Signal.LATE
            ).count()
            + text.count("duplicate"),
            "timers fired": Event.objects.filter(
                task_id__in=self.tasks, type="timer.fired"
            ).count(),
            "hostile steps": ops.filter(step__in=HOSTILE_STEPS).count(),
        }

    # --- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        for name in INVARIANTS:
            self.checks += 1
            getattr(self, f"inv_{name.replace('-', '_')}")()

    def inv_effect_once(self) -> None:
        """At most one effect per key per receiver, within its contract: the payments receiver
        dedupes (replay), the inventory receiver is looked up before a call is repeated
        (lookup), and a notification (no contract) repeats only when a person retried it."""
        charges = Charge.objects.filter(kind="charge").values("key")
        refunds = Charge.objects.filter(kind="refund").values("key")
        for rows, name in (
            (charges, "payments"),
            (refunds, "refunds"),
            (Reservation.objects.values("key"), "inventory"),
        ):
            for row in rows.annotate(n=Count("id")).filter(n__gt=1)[:1]:
                raise Violation("effect-once", f"{name} acted {row['n']} times for {row['key']}")
        sent = Notification.objects.values("key").annotate(n=Count("id")).filter(n__gt=1)
        for row in sent:
            retried = Resolution.objects.filter(
                operation__idempotency_key=row["key"], resolution="retry"
            ).count()
            if row["n"] > 1 + retried:
                raise Violation(
                    "effect-once",
                    f"notify sent {row['n']} times for {row['key']} "
                    f"({retried} retries by a person)",
                )

    def inv_no_operation_lost(self) -> None:
        """Every operation is terminal, unresolved with evidence, or still owned or on its way:
        running under a lease, pending with an announcement (or in a paused task), or waiting."""
        ops = list(
            self._ops().values_list(
                "id", "status", "lease_expires_at", "executor", "kind", "status_reason", "task_id"
            )
        )
        called = set(
            Invocation.objects.filter(operation__task_id__in=self.tasks).values_list(
                "operation_id", flat=True
            )
        )
        announced = set(
            OutboxMessage.objects.filter(operation__task_id__in=self.tasks).values_list(
                "operation_id", flat=True
            )
        )
        paused = set(
            Task.objects.filter(pk__in=self.tasks, paused=True).values_list("pk", flat=True)
        )
        for pk, status, expires, executor, kind, reason, task_id in ops:
            if status == S.RUNNING and expires is None:
                raise Violation("no-operation-lost", f"{pk} running without a lease")
            if status == S.UNRESOLVED and pk not in called and not reason:
                raise Violation("no-operation-lost", f"{pk} unresolved without evidence")
            if (
                status in (S.PENDING, S.RETRY_SCHEDULED)
                and kind == Operation.KIND_TOOL
                and executor == Operation.EXECUTOR_WORKER
                and pk not in announced
                and task_id not in paused
            ):
                raise Violation("no-operation-lost", f"{pk} {status} and announced nowhere")

    def inv_possible_effect_not_cancelled(self) -> None:
        """A stop never turns a possible effect into ``cancelled`` (runtime.stoprule)."""
        rows = (
            Invocation.objects.filter(
                operation__task_id__in=self.tasks, operation__status=S.CANCELLED
            )
            .exclude(outcome__in=CONFIRMED_OUTCOMES)
            .values_list("operation_id", "operation__tool")
        )
        for pk, tool in rows:
            if contract_of(tool) != Contract.PURE:
                raise Violation(
                    "possible-effect-not-cancelled",
                    f"{pk} ({tool}) cancelled with an unconfirmed call",
                )

    def inv_approvals(self) -> None:
        late = Approval.objects.filter(status=A.RELEASED, released_at__gte=F("expires_at"))
        for approval in late[:1]:
            raise Violation(
                "no-release-on-expired-or-denied",
                f"approval {approval.pk} released at {approval.released_at} "
                f"after its expiry {approval.expires_at}",
            )

    def inv_budgets(self) -> None:
        over = BudgetMeter.objects.filter(limit__lt=F("reserved") + F("posted") + F("unknown"))
        for meter in over[:1]:
            raise Violation(
                "budgets-balance",
                f"{meter.task_id} {meter.meter}: limit {meter.limit} < reserved "
                f"{meter.reserved} + posted {meter.posted} + unknown {meter.unknown}",
            )

    def inv_journals(self) -> None:
        seqs = Event.objects.values("task_id").annotate(n=Count("id"), lo=Min("seq"), hi=Max("seq"))
        heads = dict(Task.objects.values_list("pk", "event_seq"))
        for row in seqs:
            if row["lo"] != 1 or row["hi"] != row["n"] or heads.get(row["task_id"]) != row["hi"]:
                raise Violation(
                    "journal-gapless",
                    f"task {row['task_id']}: {row['n']} events, seq {row['lo']}.."
                    f"{row['hi']}, cursor {heads.get(row['task_id'])}",
                )
        ats = list(Event.objects.order_by("task_id", "seq").values_list("task_id", "at"))
        for (t1, a1), (t2, a2) in itertools.pairwise(ats):
            if t1 == t2 and a2 < a1:
                raise Violation("journal-ordered", f"task {t1}: an event at {a2} after {a1}")

    def inv_first_ending(self) -> None:
        for pk, cond, outcome in Task.objects.filter(pk__in=self.tasks).values_list(
            "pk", "condition", "outcome"
        ):
            if cond != TaskCondition.TERMINAL:
                if pk in self.endings:
                    raise Violation("first-ending-stands", f"task {pk} left its ending")
                continue
            first = self.endings.setdefault(pk, (cond, outcome))
            if first != (cond, outcome):
                raise Violation("first-ending-stands", f"task {pk} ended {first}, now {outcome}")

    def inv_children_in_parents(self) -> None:
        """A child's budget is drawn from its parent: the parent's meters count what the child
        holds or used (a hold per child and meter, never less than the child's own usage)."""
        for child in Task.objects.filter(pk__in=self.tasks, parent__isnull=False).exclude(
            budget={}
        ):
            for meter in BudgetMeter.objects.filter(task_id=child.pk):
                parent_total = BudgetMeter.objects.filter(
                    task_id=child.parent_id, meter=meter.meter
                ).aggregate(t=Max(F("reserved") + F("posted") + F("unknown")))["t"]
                used = meter.posted + meter.unknown
                if parent_total is not None and parent_total < used:
                    raise Violation(
                        "children-in-parents",
                        f"child {child.pk} used {used} {meter.meter}, parent counts {parent_total}",
                    )

    def inv_signals(self) -> None:
        """A signal is delivered exactly once to one wait, and none is lost: every consumed
        signal names a wait that succeeded with that very event; no wait consumed two; every
        signal wait that succeeded consumed one; a buffered signal is never left waiting beside
        a wait for its name; a duplicate or late signal is never consumed."""
        waits = {op.pk: op for op in self._ops().filter(kind=Operation.KIND_WAIT_SIGNAL)}
        consumed: dict[str, str] = {}
        for sig in Signal.objects.filter(task_id__in=self.tasks).order_by("received_at", "id"):
            if sig.consumed_at is None:
                continue
            if sig.disposition not in (Signal.DELIVERED, Signal.BUFFERED):
                raise Violation("signal-once", f"{sig.disposition} signal {sig.pk} consumed")
            op = waits.get(sig.operation_id or "")
            event = (op.result or {}).get("event_id") if op is not None else None
            if op is None or op.status != S.SUCCEEDED or event != sig.event_id:
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
            if op.status == S.SUCCEEDED and op.pk not in consumed:
                raise Violation("signal-once", f"wait {op.pk} succeeded with no signal consumed")
        waiting = {(op.task_id, op.signal) for op in waits.values() if op.status == S.WAITING}
        left = Signal.objects.filter(
            task_id__in=self.tasks, disposition=Signal.BUFFERED, consumed_at__isnull=True
        ).values_list("pk", "task_id", "name")
        for pk, task_id, name in left:
            if (task_id, name) in waiting:
                raise Violation(
                    "signal-once", f"buffered signal {pk} left beside a wait for {name!r}"
                )

    def inv_timers(self) -> None:
        """A timer fires once, never before it is due."""
        fired = (
            Event.objects.filter(task_id__in=self.tasks, type="timer.fired")
            .values("operation_id")
            .annotate(n=Count("id"), at=Min("at"))
        )
        for row in fired:
            due = self.timer_due.get(row["operation_id"])
            if row["n"] > 1 or (due is not None and row["at"] < due):
                raise Violation(
                    "timer-on-time",
                    f"timer {row['operation_id']} fired {row['n']} time(s), first at "
                    f"{row['at']}, due {due}",
                )

    def inv_checks(self) -> None:
        """A task succeeds only when every required check passed on its current accepted
        artifact: the oracle knows whether that artifact's bytes satisfy the schema, and a
        pass recorded on an artifact since replaced does not count."""
        done = Task.objects.filter(pk__in=self.tasks, outcome="succeeded").values_list(
            "pk", flat=True
        )
        for rc in RequiredCheck.objects.filter(task_id__in=done).order_by("id"):
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

    def inv_sagas(self) -> None:
        """Every succeeded effect of a task that ended failed or cancelled with
        ``compensate_on`` is compensated, being compensated, or with a person: once nothing of
        the task is left to run, no compensable effect is still plainly succeeded."""
        moving = (
            S.PENDING,
            S.RETRY_SCHEDULED,
            S.RUNNING,
            S.WAITING,
            S.WAITING_APPROVAL,
            S.COMPENSATING,
        )
        ended = {
            pk: outcome
            for pk, outcome, wanted in Task.objects.filter(
                pk__in=self.tasks, condition=TaskCondition.TERMINAL
            ).values_list("pk", "outcome", "compensate_on")
            if outcome and outcome in (wanted or [])
        }
        if not ended:
            return
        ops = list(Operation.objects.filter(task_id__in=list(ended)).order_by("id"))
        busy = {op.task_id for op in ops if op.status in moving}
        for op in ops:
            if op.task_id in busy:
                continue
            adapter = adapters().get(op.tool)
            # A success a person asserted with evidence only (no receiver result) has no
            # effect the saga can name: it cannot be undone automatically.
            asserted = isinstance(op.result, dict) and "resolution" in op.result
            if (
                op.status == S.SUCCEEDED
                and op.compensates_id is None
                and adapter is not None
                and adapter.compensation_tool
                and not asserted
            ):
                raise Violation(
                    "saga-unwound",
                    f"task {op.task_id} ended {ended[op.task_id]} (compensate_on) and is at "
                    f"rest, but {op.pk} ({op.tool}, step {op.step!r}) is still succeeded",
                )


INVARIANTS = (
    "effect-once",
    "no-operation-lost",
    "possible-effect-not-cancelled",
    "approvals",
    "budgets",
    "journals",
    "first-ending",
    "children-in-parents",
    "signals",
    "timers",
    "checks",
    "sagas",
)


def run(seed: int, schedule: list[Step], *, record: bool = True) -> Outcome:
    """Replay ``schedule`` on an emptied database; stop at the first broken invariant (the
    per-step checks of fencing and claims, and every invariant after every step). An
    unexpected exception from a service (what would be a 500) is a failure too."""
    reset_database()
    clock = FakeClock(seed)
    with simulated_clock(clock):
        world = World(seed, clock)
        for index, step in enumerate(schedule):
            try:
                note = world.step(index, step)
                world.check()
            except Violation as broken:
                return Outcome(index + 1, world.checks, broken, index, world.trace)
            except Exception as exc:  # a service crashed (a 500): that is a finding
                crash = Violation("no-unexpected-error", f"{step.action}: {exc!r}"[:500])
                return Outcome(index + 1, world.checks, crash, index, world.trace)
            if record:
                world.trace.append(f"{index} {step.action} {note}")
        return Outcome(len(schedule), world.checks, None, None, world.trace, world.coverage())


def shrink(seed: int, schedule: list[Step], outcome: Outcome, *, seconds: float) -> list[Step]:
    """Delta debugging (ddmin) over the recorded steps: the shortest sublist found within
    ``seconds`` that still breaks the same invariant."""
    assert outcome.violation is not None and outcome.failed_at is not None
    name = outcome.violation.invariant
    deadline = time.monotonic() + seconds

    def fails(candidate: list[Step]) -> bool:
        result = run(seed, candidate, record=False)
        return result.violation is not None and result.violation.invariant == name

    current = schedule[: outcome.failed_at + 1]
    # First drop, at once, the steps that found nothing to do or were refused.
    idle = {
        int(line.split(" ", 1)[0])
        for line in outcome.trace
        if line.split(" ", 2)[2].startswith(("nothing", "refused", "enough"))
    }
    candidate = [s for i, s in enumerate(current) if i not in idle]
    if len(candidate) < len(current) and fails(candidate):
        current = candidate
    n = 2
    while len(current) >= 2 and time.monotonic() < deadline:
        size = max(1, len(current) // n)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        reduced = False
        for i in range(len(chunks)):
            if time.monotonic() >= deadline:
                break
            candidate = [s for j, c in enumerate(chunks) if j != i for s in c]
            if candidate and fails(candidate):
                current, n, reduced = candidate, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), n * 2)
    return current


def vendor() -> str:
    return connection.vendor
