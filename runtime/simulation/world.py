"""The simulated world's state, how its actions pick their subjects, and its step (the
sub-domains' actions are added by the classes of runtime.simulation.witness, .agents, .workers,
.sweeper, .people and .actions, in that order, each building on the one before). Each step is
whole transactions of the real services; what is "in flight" is a claim a simulated worker holds
and has not reported yet. Everything the world sees happen is written into its Facts
(runtime.simulation.facts) as it happens, for the oracles."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from runtime.accounts import console_user_create
from runtime.actors import Actor, actor_for_agent, actor_for_user
from runtime.crashpoints import crash_point_installed
from runtime.errors import DomainError
from runtime.models import Execution, Operation, Task
from runtime.rules.statuses import Cancellation, TaskCondition
from runtime.simulation.catalog import FALLBACK, MAX_TASKS, REQUIRED_CHECKS, Held
from runtime.simulation.clock import FakeClock
from runtime.simulation.facts import Facts
from runtime.simulation.schedule import CRASH_POINTS, SimCrash, Step
from runtime.tasks import TaskSpec, task_create
from runtime.tokens import token_issue_for_agent


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

    # --- picking --------------------------------------------------------------------

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

    # --- the step -------------------------------------------------------------------

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

    def _to(self, at: Any) -> str:
        """Move the clock just past ``at`` (never back)."""
        seconds = max(0.0, (at - self.clock.now()).total_seconds()) + 0.5
        self.clock.advance(seconds)
        self.clock.push()
        return f"+{seconds:.1f}s"
