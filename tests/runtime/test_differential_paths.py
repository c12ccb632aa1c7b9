"""Differential test: one transition, three forms. The general path (the ORM, what SQLite always
runs), the one-statement PostgreSQL path and the drainer's batch are the same transitions, so
the same scenario must leave the same rows whichever form ran it: operations, tasks, the
journal (event by event, field by field), invocations, budget meters and holds, rejected
observations and the outbox. Ids, times and the execution's identity are normalised; nothing
else is.

A difference here is a rule that drifted between copies (the fast claim's journal event once
lacked the ``"from"`` the general path writes)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, models
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime.cancellation import task_cancel
from runtime.control import task_pause
from runtime.drainers import drainable_tools
from runtime.errors import NotClaimable
from runtime.executions import execution_for_agent
from runtime.models import (
    BudgetHold,
    BudgetMeter,
    Event,
    Invocation,
    Operation,
    OutboxMessage,
    RejectedObservation,
    Task,
)
from runtime.transitions.accept import agent_report, operation_report
from runtime.transitions.accept_batch import operations_report_batch
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim, operation_claim
from runtime.transitions.claim_batch import operations_claim_batch
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease
from tests import factories
from tests.sqlcount import statements

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

MODES = ("general", "fast", "batch")
_ID = re.compile(r"\b[a-z]{2,4}_[0-9a-z]{26}\b")
# The forms run as different agents and executions (names are unique): one placeholder each.
_WHO = re.compile(r"(differential|worker|agent)-(general|fast|batch|apart|together)")
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


@dataclass
class Driver:
    """Claims and reports through one form of the transitions."""

    mode: str
    execution: str
    batched: set[str] = field(default_factory=set)
    batches: int = 0  # batch claims that took something
    # Fast mode: the claims and acceptances sent as one statement (the one-statement forms;
    # a form that declines falls back to the general path, which takes several), counted as
    # the hot-path pins count them (tests/runtime/test_hotpath.py).
    one_statement: dict[str, int] = field(default_factory=lambda: {"claims": 0, "acceptances": 0})

    def _counted(self, what: str, call: Callable[[], Any]) -> Any:
        if self.mode != "fast":
            return call()
        with CaptureQueriesContext(connection) as ctx:
            done = call()
        if len(statements(ctx)) == 1 and not isinstance(done, Refusal):
            self.one_statement[what] += 1
        return done

    def claim(self, ops: list[Operation]) -> list[Lease]:
        if self.mode == "batch":
            batch = operations_claim_batch(
                [o.pk for o in ops],
                drainable_tools(settings.CELERY_QUEUE),
                execution_id=self.execution,
            )
            # What a batch hands back goes through the one-operation path, as the drainer does.
            leases = list(batch.leases)
            self.batched = {lease.operation.pk for lease in leases}
            self.batches += bool(leases)
            for op_id in batch.handed_back:
                lease = operation_claim(op_id, execution_id=self.execution)
                if isinstance(lease, Lease):
                    leases.append(lease)
            return sorted(leases, key=lambda lease: lease.operation.pk)
        leases = []
        for op in ops:
            lease = self._counted(
                "claims", lambda op=op: operation_claim(op.pk, execution_id=self.execution)
            )
            if not isinstance(lease, Refusal):
                leases.append(lease)
        return leases

    def report(self, leases: list[Lease], reports: list[Report]) -> None:
        pairs = list(zip(leases, reports, strict=True))
        batched = [(lease, r) for lease, r in pairs if lease.operation.pk in self.batched]
        if batched:
            operations_report_batch(
                [(lease.operation, r) for lease, r in batched],
                lease_token=batched[0][0].lease_token,
                execution_id=self.execution,
            )
        for lease, r in pairs:
            if lease.operation.pk in self.batched:
                continue
            self._counted(
                "acceptances",
                lambda lease=lease, r=r: operation_report(
                    lease.operation.pk,
                    lease_generation=lease.lease_generation,
                    lease_token=lease.lease_token,
                    state_version=lease.state_version,
                    report=r,
                    snapshot=lease.operation,
                    execution_id=self.execution,
                ),
            )


def _ok(value: Any, usage: dict[str, int] | None = None) -> Report:
    return Report(outcome="succeeded", result={"v": value}, usage=usage or {})


def _propose(owner: factories.Principal, task: Task, step: str, **spec: Any) -> Operation:
    spec.setdefault("tool", "demo.echo")
    spec.setdefault("params", {"v": step})
    return factories.operation(owner, task, step=step, **spec)


def _due_now(ops: list[Operation]) -> None:
    """A retry's backoff is random: every form is made due at once, the same way."""
    Operation.objects.filter(pk__in=[o.pk for o in ops]).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


# --- scenarios ----------------------------------------------------------------------------------
# Each takes the driver and an agent and returns the task it ran; the rows of that task are
# compared across the forms.


def scenario_successes(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, f"s{i}") for i in range(3)]
    leases = d.claim(ops)
    d.report(leases, [_ok(lease.operation.params["v"]) for lease in leases])
    return task


def scenario_transient_then_success(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, "flaky"), _propose(owner, task, "steady")]
    leases = d.claim(ops)
    d.report(
        leases,
        [
            Report(outcome="failed", error_kind="transient", message="try again"),
            _ok("steady"),
        ],
    )
    _due_now(ops)
    again = d.claim([ops[0]])
    d.report(again, [_ok("flaky")])
    return task


def scenario_permanent_failure(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, "bad"), _propose(owner, task, "good")]
    leases = d.claim(ops)
    d.report(
        leases,
        [Report(outcome="failed", error_kind="permanent", message="no such thing"), _ok("good")],
    )
    return task


def scenario_unknown_outcome(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, "lost")]
    leases = d.claim(ops)
    d.report(leases, [Report(outcome="unknown", message="the response was lost")])
    return task


def scenario_cancel_while_running(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, "a"), _propose(owner, task, "b")]
    leases = d.claim(ops)
    task_cancel(owner.actor, task.pk, reason="changed my mind")
    d.report(leases, [_ok("a"), _ok("b")])
    return task


def scenario_paused_before_claim(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, "p")]
    task_pause(owner.actor, task.pk, reason="hold on")
    assert d.claim(ops) == []
    return task


def scenario_budgeted(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner, budget={"cost_cents": 1000, "tool_calls": 10})
    ops = [
        _propose(owner, task, "b1", estimate={"cost_cents": 100}),
        _propose(owner, task, "b2", estimate={"cost_cents": 200}),
    ]
    leases = d.claim(ops)
    d.report(
        leases,
        [_ok("b1", usage={"cost_cents": 80}), _ok("b2", usage={"cost_cents": 250})],
    )
    return task


def scenario_stale_report_after_takeover(d: Driver, owner: factories.Principal) -> Task:
    task = factories.task(owner)
    ops = [_propose(owner, task, "slow")]
    first = d.claim(ops)
    # The lease lapses and a second claim (the takeover's redelivery) takes a new generation.
    Operation.objects.filter(pk=ops[0].pk).update(
        status="pending", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    Task.objects.filter(pk=task.pk).update(ops_active=0, ops_claimable=1)
    second = d.claim(ops)
    d.report(second, [_ok("second")])
    try:
        d.report(first, [_ok("first")])
    except Exception as exc:  # the stale report is refused; its refusal is recorded
        assert type(exc).__name__ == "StaleLease", exc
    return task


def scenario_concurrency_limited(d: Driver, owner: factories.Principal) -> Task:
    """One slot for the class, shared by a worker's and an agent's work: each claim counts the
    other's running work, and a refused claim writes only its refusal (no batch takes a class
    with a concurrency limit)."""
    task = factories.task(owner)
    with override_settings(TOOL_CONCURRENCY={"demo.echo": 1}):
        ops = [_propose(owner, task, "w1"), _propose(owner, task, "w2")]
        mine = _propose(owner, task, "agent", executor="agent")
        agent = execution_for_agent(f"agent-{d.mode}").pk
        first = d.claim(ops)
        assert [lease.operation.pk for lease in first] == [ops[0].pk]
        with pytest.raises(NotClaimable):
            agent_claim(mine.pk, agent, actor=owner.actor.label)
        d.report(first, [_ok("w1")])
        held = agent_claim(mine.pk, agent, actor=owner.actor.label)
        assert d.claim([ops[1]]) == []
        agent_report(
            mine,
            actor=owner.actor.label,
            lease_generation=held.lease_generation,
            lease_token=held.lease_token,
            report=_ok("agent"),
        )
        second = d.claim([ops[1]])
        d.report(second, [_ok("w2")])
    return task


# Fast mode: the claims and acceptances each scenario makes in one statement. Where fewer than
# it makes at all, the one-statement form declines by design: a report in a task that was
# cancelled meanwhile is settled for the stop on the general path; a budgeted task's acceptance
# settles its ledger there; a paused task's work is not claimed; a class with a concurrency
# limit checks its slot before the claim statement; a stale report is refused by the general
# path's fence after the statement matched nothing. (An unknown outcome of a pure call is a
# retry, accepted in one statement.)
ONE_STATEMENT = {
    "successes": {"claims": 3, "acceptances": 3},
    "transient_then_success": {"claims": 3, "acceptances": 3},
    "permanent_failure": {"claims": 2, "acceptances": 2},
    "unknown_outcome": {"claims": 1, "acceptances": 1},
    "cancel_while_running": {"claims": 2, "acceptances": 0},
    "paused_before_claim": {"claims": 0, "acceptances": 0},
    "budgeted": {"claims": 2, "acceptances": 0},
    "stale_report_after_takeover": {"claims": 2, "acceptances": 1},
    "concurrency_limited": {"claims": 0, "acceptances": 2},
}

# Scenarios whose work no batch takes (a budgeted task's claims hold money: the one-operation
# path; a paused task's work is not claimed at all; a class with a concurrency limit is never
# drained in batches).
BATCH_DECLINES = {"budgeted", "paused_before_claim", "concurrency_limited"}

SCENARIOS: dict[str, Callable[[Driver, factories.Principal], Task]] = {
    name.removeprefix("scenario_"): fn
    for name, fn in globals().items()
    if name.startswith("scenario_") and callable(fn)
}


# --- rows ---------------------------------------------------------------------------------------


def _normal(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v, names) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_normal(v, names) for v in value]
    if isinstance(value, str):
        if _TIME.match(value):
            return "<time>"
        value = _WHO.sub(r"\1-<mode>", value)
        return _ID.sub(lambda m: names.setdefault(m.group(0), f"<id{len(names)}>"), value)
    return value


def _fields(obj: models.Model, names: dict[str, str], skip: tuple[str, ...] = ()) -> dict:
    row = {}
    for f in obj._meta.concrete_fields:
        if f.name in skip or isinstance(f, models.DateTimeField):
            continue
        if f.name in ("lease_token_digest",):  # a fresh secret per claim
            row[f.name] = bool(getattr(obj, f.attname))
            continue
        if isinstance(f, models.ForeignKey) and f.related_model is BudgetMeter:
            meter = getattr(obj, f.name)
            row[f.name] = meter.meter if meter else None  # by name: meters' keys differ
            continue
        if f.primary_key and isinstance(f, models.AutoField | models.BigAutoField):
            continue
        row[f.name] = _normal(getattr(obj, f.attname), names)
    return row


def rows_of(task: Task) -> dict[str, Any]:
    """Every row the scenario wrote for ``task``, normalised."""
    names: dict[str, str] = {}
    ops = list(Operation.objects.filter(task=task).order_by("step", "created_at"))
    # Operations get their placeholders by step, so the forms' random ids line up.
    for op in ops:
        names.setdefault(op.pk, f"<op:{op.step}>")
    names.setdefault(task.pk, "<task>")
    task.refresh_from_db()
    op_ids = [o.pk for o in ops]
    return {
        "task": _fields(task, names),
        "operations": [_fields(o, names, skip=("execution",)) for o in ops],
        "events": [
            _fields(e, names, skip=("task",)) | {"actor": _normal(_normal_actor(e.actor), names)}
            for e in Event.objects.filter(task=task).order_by("seq")
        ],
        "invocations": [
            _fields(i, names, skip=("execution",))
            for i in Invocation.objects.filter(operation_id__in=op_ids).order_by(
                "operation__step", "number"
            )
        ],
        "meters": [
            _fields(m, names) for m in BudgetMeter.objects.filter(task=task).order_by("meter")
        ],
        "holds": sorted(
            (_fields(h, names) for h in BudgetHold.objects.filter(operation_id__in=op_ids)),
            key=repr,
        ),
        "rejected": sorted(
            (
                _fields(r, names)
                for r in RejectedObservation.objects.filter(operation_id__in=op_ids)
            ),
            key=repr,
        ),
        "outbox": sorted(
            names.get(m.operation_id or "", "?")
            for m in OutboxMessage.objects.filter(operation_id__in=op_ids)
        ),
    }


def _without_task_snapshots(rows: dict[str, Any]) -> dict[str, Any]:
    events = [
        e | {"data": {k: v for k, v in e["data"].items() if not k.startswith("task_")}}
        for e in rows["events"]
    ]
    return rows | {"events": events}


def _normal_actor(actor: str) -> str:
    return "execution:<worker>" if actor.startswith("execution:") else actor


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_three_forms_of_each_transition_write_the_same_rows(name, settings):
    scenario = SCENARIOS[name]
    found: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        settings.HOTPATH = mode != "general"
        settings.DRAIN_BATCH = 32 if mode == "batch" else 0
        owner = factories.agent(f"differential-{mode}")
        driver = Driver(mode, execution_for_agent(f"worker-{mode}").pk)
        found[mode] = rows_of(scenario(driver, owner))
        if mode == "batch" and name not in BATCH_DECLINES:
            assert driver.batches, "the batch form was never taken"
        if mode == "fast":
            # The one-statement forms really ran (else "fast" would compare the general path
            # with itself and pass whatever the statements write).
            assert driver.one_statement == ONE_STATEMENT[name], driver.one_statement
    general = found["general"]
    # Something happened at all: the scenario drove claims and acceptances.
    assert general["events"], general
    for mode in ("fast", "batch"):
        expected, rows = general, found[mode]
        if mode == "batch":
            # A batch is one statement over many operations: its events carry the task's
            # condition and version after the statement, where one-at-a-time acceptances
            # carry each step's. The task's own row (compared below) is the same.
            expected, rows = _without_task_snapshots(general), _without_task_snapshots(rows)
        for part in expected:
            assert rows[part] == expected[part], (mode, part)
