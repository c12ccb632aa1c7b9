"""Pause, resume and steer as commands with ids and recorded dispositions: pause refuses new work
and stops dispatch at the claim; resume announces the paused work again and it runs once; steer
records a versioned direction that agents read from the task and the journal."""

from __future__ import annotations

import pytest

from runtime.executor import operation_execute
from runtime.models import (
    Event,
    Execution,
    Invocation,
    Operation,
    OutboxMessage,
    RejectedObservation,
    TaskCommand,
)
from runtime.sandbox import receivers
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock
from tests.conftest import wait_for


@pytest.fixture(autouse=True)
def _fresh_execution():
    from runtime import executions

    executions._current.clear()


def _post(who, task, action, body=None):
    return who.client().post(f"/api/v1/tasks/{task.pk}/{action}", body or {}, format="json")


@pytest.mark.django_db
def test_pause_refuses_new_work_with_task_paused_and_is_a_recorded_command():
    owner = factories.agent()
    task = factories.task(owner)
    response = _post(owner, task, "pause", {"reason": "checking something"})
    assert response.status_code == 202
    body = response.json()
    assert body["paused"] is True
    assert body["command"]["id"].startswith("cmd_") and body["command"]["disposition"] == "applied"
    again = _post(owner, task, "pause").json()
    assert again["command"]["disposition"] == "no_change"
    refused = owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.echo", "step": "new", "params": {}},
        format="json",
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "task_paused"
    assert list(TaskCommand.objects.filter(task=task).values_list("kind", "disposition")) == [
        ("pause", "applied"),
        ("pause", "no_change"),
    ]


@pytest.mark.django_db
def test_paused_work_is_not_dispatched_and_resume_announces_it_again_and_it_runs_once():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"text": "hi"})
    _post(owner, task, "pause")
    # The delivery that was in flight reaches the claim: it takes nothing and spends the
    # announcement, so nothing republishes it while paused.
    assert operation_execute(op.pk) == "nothing_to_claim"
    op.refresh_from_db()
    assert op.status == "pending"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    response = _post(owner, task, "resume")
    assert response.status_code == 202 and response.json()["paused"] is False
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    event = Event.objects.get(task=task, type="task.resumed")
    assert event.data["reannounced"] == 1
    assert operation_execute(op.pk) == "succeeded"
    assert operation_execute(op.pk) == "nothing_to_claim"  # a duplicate delivery
    assert Invocation.objects.filter(operation=op).count() == 1


@pytest.mark.django_db
def test_steer_records_a_versioned_direction_in_the_task_and_the_journal():
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    first = _post(operator, task, "steer", {"direction": "prefer the cheaper supplier"})
    assert first.status_code == 202
    assert first.json()["direction"] == {"text": "prefer the cheaper supplier", "version": 1}
    second = _post(operator, task, "steer", {"direction": "stop after the quote"}).json()
    assert second["direction"]["version"] == 2
    seen = owner.client().get(f"/api/v1/tasks/{task.pk}").json()
    assert seen["direction"] == {"text": "stop after the quote", "version": 2}
    events = owner.client().get(f"/api/v1/tasks/{task.pk}/events").json()["events"]
    steered = [e for e in events if e["type"] == "task.steered"]
    assert [e["data"]["direction_version"] for e in steered] == [1, 2]
    assert steered[0]["actor"] == operator.actor.label
    assert _post(operator, task, "steer", {"direction": ""}).status_code == 400


@pytest.mark.django_db
def test_control_is_refused_for_other_agents_and_support_and_on_ended_tasks():
    owner, stranger, support = (
        factories.agent(),
        factories.agent(),
        factories.console_user("support"),
    )
    task = factories.task(owner)
    assert _post(stranger, task, "pause").status_code == 404
    assert _post(support, task, "pause").status_code == 403
    owner.client().post(f"/api/v1/tasks/{task.pk}/cancel", {}, format="json")
    ended = _post(owner, task, "resume")
    assert ended.status_code == 409
    refused = TaskCommand.objects.get(task=task)
    assert refused.disposition == "refused" and refused.kind == "resume"


@pytest.mark.workers
@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_paused_work_delivered_to_a_real_worker_waits_and_runs_once_after_resume(workers):
    owner = factories.agent()
    task = factories.task(owner)
    # Announced before anyone runs it; paused before a worker exists to take it.
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 700}
    )
    assert _post(owner, task, "pause").status_code == 202
    workers.start(count=1, concurrency=1)
    wait_for(
        lambda: RejectedObservation.objects.filter(
            operation_id=op.pk, kind="refused_claim", detail__reason="the task is paused"
        ).exists(),
        timeout=60,
        what="the worker to meet the paused task",
    )
    op.refresh_from_db()
    assert op.status == "pending" and op.attempts_used == 0
    assert receivers.effects_under("payments", op.idempotency_key) == []
    assert _post(owner, task, "resume").status_code == 202
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the resumed work to run",
    )
    assert Invocation.objects.filter(operation=op).count() == 1
    assert len(receivers.effects_under("payments", op.idempotency_key)) == 1


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_a_pause_that_commits_while_the_claim_is_under_way_still_stops_the_dispatch(settings):
    """The claim has read the task (not paused yet); the pause commits; the claim then takes the
    task row and sees the pause there: it rolls back and spends the announcement. Resume brings
    the work back and it runs once."""
    settings.HOTPATH = False  # the general claim, which has a window after its read
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"text": "hi"})
    execution = Execution.objects.create(kind="worker", host="test", label="pause-race").pk
    with gate_at("claim.after_read", "claimer") as gate:
        thread, claim = in_thread(
            lambda: operation_claim(op.pk, execution_id=execution), name="claimer"
        )
        assert gate.reached.wait(timeout=30)
        assert _post(owner, task, "pause").status_code == 202
        gate.release()
        thread.join(timeout=30)
    refusal = claim.result(timeout=1)
    assert isinstance(refusal, Refusal) and refusal.reason == "the task is paused"
    op.refresh_from_db()
    assert op.status == "pending" and op.lease_generation == 0 and op.attempts_used == 0
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert _post(owner, task, "resume").status_code == 202
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    assert operation_execute(op.pk) == "succeeded"
    assert Invocation.objects.filter(operation=op).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("snapshot", [True, False], ids=["one-statement", "general"])
def test_work_in_flight_when_paused_finishes_and_is_accepted(snapshot):
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"text": "hi"})
    execution = Execution.objects.create(kind="worker", host="test", label="in-flight").pk
    lease = operation_claim(op.pk, execution_id=execution)
    assert isinstance(lease, Lease)
    assert _post(owner, task, "pause").status_code == 202
    accepted = operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="succeeded", result={"text": "hi"}),
        execution_id=execution,
        # The worker's own path hands the claim's snapshot (the one-statement acceptance).
        snapshot=lease.operation if snapshot else None,
    )
    assert accepted.status == "succeeded"


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_the_one_statement_claim_waiting_on_a_pause_holding_the_task_row_is_refused():
    """The pause holds the task row, not yet committed; the hot path's single claim statement
    updates the operation and then waits for the task row; once the pause commits the
    statement sees it, and the claim is rolled back and refused."""
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"text": "hi"})
    execution = Execution.objects.create(kind="worker", host="test", label="fast-pause").pk
    with gate_at("control.applied", "pauser") as gate:
        pauser, paused = in_thread(lambda: _post(owner, task, "pause"), name="pauser")
        assert gate.reached.wait(timeout=30)
        claimer, claim = in_thread(lambda: operation_claim(op.pk, execution_id=execution))
        wait_until_blocked_on_a_lock("the claim to wait for the task row")
        gate.release()
        pauser.join(timeout=30)
        claimer.join(timeout=30)
    assert paused.result(timeout=1).status_code == 202
    refusal = claim.result(timeout=1)
    assert isinstance(refusal, Refusal) and refusal.reason == "the task is paused"
    op.refresh_from_db()
    assert op.status == "pending" and op.attempts_used == 0
    assert _post(owner, task, "resume").status_code == 202
    assert operation_execute(op.pk) == "succeeded"


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_the_one_statement_proposal_waiting_on_a_pause_holding_the_task_row_is_refused():
    """The proposal is one autocommit statement: it inserts the operation, then waits for the
    task row a pause holds; once the pause commits the statement reads it under the lock and
    fails, so the operation, its event and its outbox row never existed."""
    from runtime.errors import TaskRefused
    from runtime.models import Task
    from runtime.specs import OperationSpec
    from runtime.transitions.propose import operation_propose

    owner = factories.agent()
    task = factories.task(owner)
    before = Task.objects.get(pk=task.pk)
    spec = OperationSpec(tool="demo.echo", step="raced", params={"text": "hi"})
    with gate_at("control.applied", "pauser") as gate:
        pauser, paused = in_thread(lambda: _post(owner, task, "pause"), name="pauser")
        assert gate.reached.wait(timeout=30)
        proposer, proposal = in_thread(lambda: operation_propose(owner.actor, task.pk, spec))
        wait_until_blocked_on_a_lock("the proposal to wait for the task row")
        gate.release()
        pauser.join(timeout=30)
        proposer.join(timeout=30)
    assert paused.result(timeout=1).status_code == 202
    with pytest.raises(TaskRefused) as refused:
        proposal.result(timeout=1)
    assert refused.value.code == "task_paused"
    assert not Operation.objects.filter(task=task).exists()
    assert not OutboxMessage.objects.exists()
    assert not Event.objects.filter(task=task, type="operation.proposed").exists()
    after = Task.objects.get(pk=task.pk)
    assert (after.ops_active, after.event_seq) == (before.ops_active, before.event_seq + 1)
