"""Issue 21, capacity edges: eligibility is not capacity, whoever brings the work.

- Queue capacity (TOOL_QUEUE_CAPACITY) bounds admitted waiting work, and work waiting for a
  person's approval is waiting work from its proposal: an approval moves it within the queue and
  never adds to it, and a renewal of an expired approval is admitted again (429 ``queue_full``).
- Concurrency slots (TOOL_CONCURRENCY) bound running work, an agent's as a worker's: an agent's
  claim takes a slot (409 ``not_claimable`` when none is free) and frees it on completion or
  expiry.
- An agent's lease, claimed and extended over the API, runs on the database's clock.

The races run real concurrent transactions stopped at named crash points."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from runtime.approval_expiry import approval_expire_sweep
from runtime.approvals import approval_decide
from runtime.db import db_now
from runtime.errors import NotClaimable, QueueFull
from runtime.executions import execution_for_agent
from runtime.models import Approval, Operation, ToolSlot
from runtime.transitions import claim as claim_module
from runtime.transitions import lease as lease_module
from runtime.transitions.accept import agent_report, operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim, operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories
from tests.api.support import assert_error, post_json
from tests.concurrency import gate_at, in_thread, lock_waiters
from tests.conftest import wait_for

CHARGE = "demo.payments.charge"
BIG = {"account": "acct-1", "amount_cents": 25000}  # above the approval threshold
SMALL = {"account": "acct-1", "amount_cents": 100}


def _waiting(tool: str) -> int:
    return Operation.objects.filter(
        tool=tool, status__in=("pending", "retry_scheduled", "waiting_approval")
    ).count()


def _approve(operator, op) -> None:
    approval = Approval.objects.get(operation=op, status="pending")
    approval_decide(
        operator.actor, approval.pk, decision="approve", reason="ok", params_hash=op.params_hash
    )


# --- queue capacity and approvals -------------------------------------------------------------


@pytest.mark.django_db
def test_work_waiting_for_approval_holds_its_queue_place_and_approval_adds_none(settings):
    """Two gated charges fill a queue of two: an ungated charge is refused (429) while they wait
    for a person, and approving both leaves exactly two waiting. Before, gated work was not
    counted: the third was admitted and the approvals pushed the queue to three."""
    settings.TOOL_QUEUE_CAPACITY = {CHARGE: 2}
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    gated = [factories.operation(owner, task, tool=CHARGE, params=BIG | {"n": i}) for i in range(2)]
    assert {op.status for op in gated} == {"waiting_approval"}

    response = post_json(
        owner.client(),
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": CHARGE, "step": "more", "params": SMALL},
    )
    assert_error(response, 429, "queue_full")
    assert int(response["Retry-After"]) >= 1

    for op in gated:
        _approve(operator, op)
    assert Operation.objects.filter(tool=CHARGE, status="pending").count() == 2
    assert _waiting(CHARGE) == 2
    with pytest.raises(QueueFull):
        factories.operation(owner, task, tool=CHARGE, params=SMALL)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast", [True, False], ids=["statement", "general"])
def test_a_proposal_racing_a_gated_one_for_the_last_queue_place_is_refused(fast, settings):
    """The gated proposal counted the last free place under the class's slot lock and stops
    there; an ungated proposal of the class waits for that lock, then counts the gated one and
    is refused. The approval then releases the gated work into the queue it already held."""
    settings.HOTPATH = fast
    settings.TOOL_QUEUE_CAPACITY = {CHARGE: 1}
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    ToolSlot.objects.get_or_create(tool_class=CHARGE)

    def propose(params):
        return lambda: factories.operation(owner, task, tool=CHARGE, params=params)

    with gate_at("admission.counted", "gated") as gate:
        gated_thread, gated = in_thread(propose(BIG), "gated")
        assert gate.reached.wait(30), "the gated proposal never counted its queue"
        plain_thread, plain = in_thread(propose(SMALL), "plain")
        wait_for(
            lambda: plain.done() or lock_waiters() >= 1,
            timeout=30,
            what="the plain proposal to finish or wait for the slot lock",
        )
        gate.release()
        gated_thread.join(30)
        plain_thread.join(30)

    op = gated.result(timeout=1)
    assert op.status == "waiting_approval"
    with pytest.raises(QueueFull):
        plain.result(timeout=1)
    assert Operation.objects.filter(tool=CHARGE).count() == 1

    _approve(operator, op)
    op.refresh_from_db()
    assert op.status == "pending"
    assert _waiting(CHARGE) == 1


@pytest.mark.django_db
def test_renewing_an_expired_approval_is_admitted_again_against_the_queue(settings):
    """An expired gated action left the queue; others filled it. Renewing the approval would
    make it wait again: refused 429 queue_full with nothing changed, and admitted once a place
    is free. Before, the renewal re-entered a full queue."""
    settings.TOOL_QUEUE_CAPACITY = {CHARGE: 1}
    owner, admin = factories.agent(), factories.console_user("admin")
    task = factories.task(owner)
    op = factories.operation(owner, task, tool=CHARGE, params=BIG)
    approval = Approval.objects.get(operation=op)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire_sweep() == 1
    other = factories.operation(owner, task, tool=CHARGE, params=SMALL)
    assert other.status == "pending"

    body = {"expires_in_seconds": 3600, "reason": "still wanted"}
    response = post_json(admin.client(), f"/api/v1/approvals/{approval.pk}/renew", body)

    assert_error(response, 429, "queue_full")
    approval.refresh_from_db()
    op.refresh_from_db()
    assert (approval.status, op.status) == ("expired", "expired")
    assert _waiting(CHARGE) == 1

    Operation.objects.filter(pk=other.pk).update(status="cancelled")
    response = post_json(admin.client(), f"/api/v1/approvals/{approval.pk}/renew", body)
    assert response.status_code == 200, response.content
    op.refresh_from_db()
    assert op.status == "waiting_approval"


# --- concurrency slots and agent claims ---------------------------------------------------------


def _agent_op(owner, task, n: int) -> Operation:
    return factories.operation(owner, task, executor="agent", params={"agent": n})


def _running(*ops: Operation) -> list[str]:
    return sorted(
        Operation.objects.filter(pk__in=[o.pk for o in ops], status="running").values_list(
            "pk", flat=True
        )
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast", [True, False], ids=["statement", "general"])
def test_an_agent_claim_and_a_worker_claim_racing_for_the_last_slot_one_wins(fast, settings):
    """One slot. The worker's claim counted no running work under the class's slot lock and
    stops there; the agent's claim of the same class must wait for that lock, count the
    worker's claim and be refused. Before, an agent's claim took no slot: both ran."""
    settings.HOTPATH = fast
    settings.TOOL_CONCURRENCY = {"demo.echo": 1}
    owner = factories.agent()
    task = factories.task(owner)
    worker_op = factories.operation(owner, task, params={"worker": 1})
    agent_op = _agent_op(owner, task, 1)
    ToolSlot.objects.get_or_create(tool_class="demo.echo")
    worker, agent = execution_for_agent("worker").pk, execution_for_agent("agent").pk

    with gate_at("claim.slot_counted", "worker") as gate:
        worker_thread, by_worker = in_thread(
            lambda: operation_claim(worker_op.pk, execution_id=worker), "worker"
        )
        assert gate.reached.wait(30), "the worker's claim never counted the slots"
        agent_thread, by_agent = in_thread(
            lambda: agent_claim(agent_op.pk, agent, actor=owner.actor.label), "agent"
        )
        wait_for(
            lambda: by_agent.done() or lock_waiters() >= 1,
            timeout=30,
            what="the agent's claim to finish or wait for the slot lock",
        )
        gate.release()
        worker_thread.join(30)
        agent_thread.join(30)

    assert isinstance(by_worker.result(timeout=1), Lease)
    with pytest.raises(NotClaimable):
        by_agent.result(timeout=1)
    assert _running(worker_op, agent_op) == [worker_op.pk]


@pytest.mark.django_db
def test_an_agents_running_operation_holds_a_slot_until_it_completes_or_expires(settings):
    """Over the API: the agent's claim is refused 409 not_claimable while a worker holds the one
    slot; once that work ends the agent's claim takes the slot, and a worker's claim is refused
    until the agent completes; after the agent's next claim expires, the slot is free again."""
    settings.TOOL_CONCURRENCY = {"demo.echo": 1}
    owner = factories.agent()
    task = factories.task(owner)
    client = owner.client()
    worker = execution_for_agent("worker").pk
    first, second = (factories.operation(owner, task, params={"w": i}) for i in range(2))
    mine, again = _agent_op(owner, task, 1), _agent_op(owner, task, 2)

    held = operation_claim(first.pk, execution_id=worker)
    assert isinstance(held, Lease)
    refused = client.post(f"/api/v1/operations/{mine.pk}/claim", format="json")
    assert_error(refused, 409, "not_claimable")
    assert "concurrency limit" in refused.json()["error"]["message"]

    operation_report(
        first.pk,
        lease_generation=held.lease_generation,
        lease_token=held.lease_token,
        state_version=held.state_version,
        report=Report(outcome="succeeded", result={"ok": 1}),
        execution_id=worker,
    )
    claimed = client.post(f"/api/v1/operations/{mine.pk}/claim", format="json")
    assert claimed.status_code == 200, claimed.content
    # The agent's running operation is the class's active work: a worker starts nothing.
    assert isinstance(operation_claim(second.pk, execution_id=worker), Refusal)
    assert _running(second) == []

    done = client.post(
        f"/api/v1/operations/{mine.pk}/complete",
        {
            "lease_generation": claimed.json()["lease_generation"],
            "lease_token": claimed.json()["lease_token"],
            "outcome": "succeeded",
            "result": {"done": True},
        },
        format="json",
    )
    assert done.status_code == 200, done.content
    claimed_again = client.post(f"/api/v1/operations/{again.pk}/claim", format="json")
    assert claimed_again.status_code == 200, claimed_again.content
    assert isinstance(operation_claim(second.pk, execution_id=worker), Refusal)
    # The agent goes quiet: its lease expires, the sweeper takes the work back, the slot is free.
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=3600)) == 1
    assert isinstance(operation_claim(second.pk, execution_id=worker), Lease)


# --- the agent's lease on the database's clock ---------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast", [True, False], ids=["statement", "general"])
def test_an_agents_claim_and_heartbeat_over_the_api_run_on_the_databases_clock(
    fast, settings, monkeypatch
):
    """The web host's clock is an hour behind the database's (the lease modules' clock is
    replaced, nothing else): the lease the API hands the agent and the one its heartbeat
    extends are the database's time plus the lease, so the sweeper (on that clock) leaves the
    live lease alone."""
    settings.HOTPATH = fast
    owner = factories.agent()
    task = factories.task(owner)
    op = _agent_op(owner, task, 1)
    client = owner.client()
    real_now = timezone.now
    behind = SimpleNamespace(now=lambda: real_now() - timedelta(hours=1))
    monkeypatch.setattr(claim_module, "timezone", behind)
    monkeypatch.setattr(lease_module, "timezone", behind)

    claimed = client.post(f"/api/v1/operations/{op.pk}/claim", format="json")
    assert claimed.status_code == 200, claimed.content
    lease = claimed.json()
    op.refresh_from_db()
    assert op.lease_expires_at > db_now()
    assert lease_expire_sweep() == 0

    beat = client.post(
        f"/api/v1/operations/{op.pk}/heartbeat",
        {"lease_generation": lease["lease_generation"], "lease_token": lease["lease_token"]},
        format="json",
    )
    assert beat.status_code == 200, beat.content
    op.refresh_from_db()
    assert op.lease_expires_at > db_now()
    assert lease_expire_sweep() == 0
    done = agent_report(
        op,
        actor=owner.actor.label,
        lease_generation=lease["lease_generation"],
        lease_token=lease["lease_token"],
        report=Report(outcome="succeeded", result={"ok": True}),
    )
    assert done.status == "succeeded"
