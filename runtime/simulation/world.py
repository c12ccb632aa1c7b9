"""The simulated world's state and its agents' and workers' actions (runtime.simulation.actions
adds the sweeper's, the people's and the aimed ones). Each step is whole transactions of the
real services; what is "in flight" is a claim a simulated worker holds and has not reported yet.
Everything the world sees happen is written into its Facts (runtime.simulation.facts) as it
happens, for the oracles."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from runtime.accounts import console_user_create
from runtime.actors import Actor, actor_for_agent, actor_for_user
from runtime.crashpoints import crash_point_installed
from runtime.errors import DomainError, IdempotencyKeyReused
from runtime.executor import _invoke  # the worker's own call of the receiver
from runtime.models import Approval, Execution, Operation, Task
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition
from runtime.simulation.clock import FakeClock
from runtime.simulation.facts import Call, Facts, contract, gated
from runtime.simulation.schedule import CRASH_POINTS, SimCrash, Step, Violation
from runtime.specs import OperationSpec
from runtime.tasks import TaskSpec, task_create
from runtime.tokens import token_issue_for_agent
from runtime.tools import adapter_for
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_batch import operations_report_batch
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_batch import operations_claim_batch
from runtime.transitions.fast import enabled as one_statement_forms
from runtime.transitions.lease import Lease, lease_heartbeat
from runtime.transitions.propose import operation_propose

S = OperationStatus

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
    ("demo.payments.charge", {"account": "declined-sim", "amount_cents": 700}, "worker"),
)
# The charge above the approval threshold (10000 cents): what a person must decide.
GATED_VARIANT = 2
WAIT_VARIANTS = 2  # a signal wait, a timer
# A proposal's variant: an index into TOOLS, or past it a wait. Effects with a contract to
# honour (a small charge, a reservation, a notification) and usage on a meter come up more
# often than the rest: they are where a lost call or a dropped meter shows.
VARIANTS = (*range(len(TOOLS)), 1, 1, 3, 3, 4, 5, 5, 9, 2, len(TOOLS), len(TOOLS) + 1)

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
# uploaded content satisfies the schema (ARTIFACTS: name, media type, content, valid).
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

# What a call does (``variant % 10``): the real receiver (0-4), a transient failure before the
# receiver (5), a permanent refusal (6; a receiver that answers for its key, replay or lookup,
# is asked instead: it refuses for itself, a declined card, or replays what it did), no answer
# before reaching it (7), and the receiver acted but its answer was lost (8, 9).
CALL_KINDS = 10
# An action that found nothing to act on -> the one that makes its subject.
FALLBACK = {
    "report": "call",
    "call": "work",
    "late": "report",
    "stall": "work",
    "heartbeat": "work",
    "takeover": "work",
    "claim": "propose",
    "claim_batch": "propose",
    "work": "propose",
    "decide": "propose",
    "edit": "decide",
    "renew": "expire",
    "resolve": "work",
    "agent_report": "agent_claim",
    "agent_claim": "propose",
    "accept": "deliver",
    "deliver": "upload",
    "wake": "signal",
    "wait_admin": "expire",
    "stop_live": "propose",
    "expire": "tick",
}
# At most this many tasks a run (the world stops creating them): a long run's later steps
# work on the tasks it has.
MAX_TASKS = 400


@dataclass
class Held:
    """A claim a simulated worker holds: claimed, maybe called (its report ready), not reported."""

    worker: int
    lease: Lease
    report: Report | None = None
    reported: bool = False  # accepted, but the response was lost: the worker will report again
    batched: bool = False  # claimed by a batch: reported with the batch's other ready claims


class WorldCore:
    def __init__(self, seed: int, clock: FakeClock) -> None:
        self.seed = seed
        self.clock = clock
        self.checks = 0
        self.trace: list[str] = []
        self.facts = Facts()
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
            spec.budget = (
                {"tokens": 6, "tool_calls": 4} if parent else {"tokens": 20, "tool_calls": 12}
            )
        if parent is None and (n // 4) % 4 == 1:  # one in four must be done by its deadline
            spec.deadline_seconds = 180 + (n % 5) * 120
        spec.parent = parent
        task = task_create(self.agent, spec)
        self.tasks.append(task.pk)
        if spec.deadline_seconds:
            self.facts.deadlines[task.pk] = self.clock.now() + timedelta(
                seconds=spec.deadline_seconds
            )
        self.facts.budgets[task.pk] = dict(spec.budget or {})
        if parent is not None:
            self.facts.parent[task.pk] = parent

    # --- picking ------------------------------------------------------------------------

    def _live(self, *, paused: bool = False) -> list[str]:
        return list(
            Task.objects.filter(cancellation=Cancellation.NONE, paused=paused)
            .exclude(condition=TaskCondition.TERMINAL)
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
        )

    def _task(self, n: int, *, paused: bool = False) -> str:
        """Mostly a live task, not paused (or a paused one, with ``paused``); one in five picks
        any task, so stopped and paused ones are asked too."""
        live = self._live(paused=paused)
        if live and n % 5:
            return str(live[n % len(live)])
        return str(self.tasks[n % len(self.tasks)])

    @staticmethod
    def _pick(items: list[Any], n: int) -> Any:
        return items[n % len(items)] if items else None

    def _ops(self) -> Any:
        """Every operation: the agent's, a check run's, a saga's (the database holds this run's
        alone: it is emptied before each run)."""
        return Operation.objects.all()

    def _ops_where(self, **filters: Any) -> list[str]:
        return list(
            self._ops().filter(**filters).order_by("created_at", "id").values_list("pk", flat=True)
        )

    def _recent_op(self, n: int) -> str | None:
        """Any of the latest operations (a claim of something not claimable is refused)."""
        recent = list(self._ops().order_by("-created_at", "-id").values_list("pk", flat=True)[:32])
        return self._pick(recent, n)

    # --- the step --------------------------------------------------------------------------

    def step(self, index: int, step: Step) -> str:
        self.clock.advance(0.01)  # every step is a later moment
        self.clock.push()
        note = self._act(step.action, step)
        # An action with nothing to act on gives its step to the one that makes its subject
        # (a report with no call made calls, a call with no claim claims...), so few steps idle.
        tried = {step.action}
        while note.startswith("nothing") and FALLBACK.get(step.action, step.action) not in tried:
            action = FALLBACK[step.action]
            tried.add(action)
            step = Step(action, step.a, step.b, step.fault)
            note = f"{action}: " + self._act(action, step)
        return note + self._replenish(step)

    def _act(self, name: str, step: Step) -> str:
        action = getattr(self, f"do_{name}")
        points = CRASH_POINTS.get(name, ()) if step.fault == "crash" else ()

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

    def _replenish(self, step: Step) -> str:
        """New requests keep arriving: while fewer than three tasks are live, one more is
        created (budgeted, checked or unwound on failure as the step's numbers say), so stops
        never leave the world without work."""
        if len(self._live()) >= 3 or len(self.tasks) >= MAX_TASKS:
            return ""
        self._new_task(step.a + step.b, budget=(step.a + step.b) % 3 != 0)
        return f" (+task {self.tasks[-1][-6:]})"

    def _lost(self, step: Step, retry: Callable[[], Any]) -> str:
        """A lost response: the caller did not see the result and sends the request again."""
        if step.fault != "lost":
            return ""
        try:
            retry()
            return " (lost response, retried)"
        except DomainError as refused:
            return f" (lost response, retry refused {type(refused).__name__})"

    # --- what the world saw, checked as it sees it -------------------------------------------

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

    # --- workers ---------------------------------------------------------------------------

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

    def do_work(self, step: Step) -> str:
        """A worker claims due work and calls its receiver at once, and half the time reports
        at once too (the common case in one step, so more of the run is spent on what follows:
        the other half waits for its report, where stops, expiries and takeovers meet it)."""
        op_id = self._claimable(step.a)
        if op_id is None:
            return "nothing"
        held, note = self._claim(op_id, step.b % len(self.workers), step)
        if held is None:
            return note
        note += "; " + self._call(held, step.b // 3)
        if step.b % 2:
            return note
        self.held.remove(held)
        return note + "; " + self._report(held)

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
            if kind >= 8 and report.outcome == "succeeded":
                # The receiver acted; its answer was lost on the way back.
                report = Report(outcome="unknown", message="sim: answer lost")
            stale = "newer holder" in report.message
            authoritative = report.outcome != "unknown" and not stale
            held.report = report
        self.facts.called(
            op.pk, held.lease.lease_generation, Call(reached, held.report.outcome, authoritative)
        )
        return f"called {op.pk[-6:]} g{held.lease.lease_generation}: {held.report.outcome}"

    def do_report(self, step: Step) -> str:
        ready = [h for h in self.held if h.report is not None]
        held = self._pick(ready, step.a)
        if held is None:
            return "nothing"
        if held.batched and one_statement_forms():
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
