"""Every journal event names its actor: the agent, the person, the worker execution, or the part
of the system (sweeper, saga) that made the change. Scanned after a representative run with real
worker processes: worker run, agent run, lease expiry, unresolved outcome and its resolution,
cancellation and the saga it starts."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.models import Event, Invocation, Operation
from runtime.transitions.lease import lease_expire_sweep
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

ACTOR = re.compile(r"(agent|user|execution|system):\S+")


def _status(op: Operation) -> str:
    return str(Operation.objects.get(pk=op.pk).status)


def test_no_journal_event_lacks_an_actor_after_a_representative_run(workers):
    workers.start(count=1, concurrency=1, RETRY_BASE_SECONDS="0.05", RETRY_CAP_SECONDS="0.2")
    agent = factories.agent()
    support, admin = factories.console_user("support"), factories.console_user("admin")
    task = factories.task(agent, compensate_on=["cancelled"])

    # A worker run.
    charge = factories.operation(
        agent, task, step="charge", tool="demo.payments.charge",
        params={"account": "acct_j", "amount_cents": 120},
    )  # fmt: skip
    wait_for(lambda: _status(charge) == "succeeded", timeout=60, what="the charge")

    # An outcome no machine can establish, settled by support staff.
    note = factories.operation(
        agent, task, step="tell", tool="demo.notify",
        params={"to": "ops@example.com", "message": "hi", "_fault": "unknown"},
    )  # fmt: skip
    wait_for(lambda: _status(note) == "unresolved", timeout=60, what="the unresolved notice")
    note.refresh_from_db()
    resolved = support.client().post(
        f"/api/v1/operations/{note.pk}/resolve",
        {"resolution": "no_effect", "evidence": "", "state_version": note.state_version},
        format="json",
    )
    assert resolved.status_code == 200, resolved.content

    # An agent run whose lease the sweeper takes back, then claimed again and completed.
    run = factories.operation(agent, task, step="think", executor="agent")
    client = agent.client()
    assert client.post(f"/api/v1/operations/{run.pk}/claim").status_code == 200
    assert lease_expire_sweep(timezone.now() + timedelta(hours=1)) == 1
    lease = client.post(f"/api/v1/operations/{run.pk}/claim").json()
    done = client.post(
        f"/api/v1/operations/{run.pk}/complete",
        {
            "lease_generation": lease["lease_generation"],
            "lease_token": lease["lease_token"],
            "outcome": "succeeded",
            "result": {},
        },
        format="json",
    )
    assert done.status_code == 200, done.content

    # An admin cancels; the saga refunds the charge through a worker.
    stop = admin.client().post(f"/api/v1/tasks/{task.pk}/cancel", {"reason": "stop"}, format="json")
    assert stop.status_code == 202, stop.content
    wait_for(lambda: _status(charge) == "compensated", timeout=60, what="the refund")

    events = list(Event.objects.filter(task=task).order_by("seq"))
    unnamed = [(e.seq, e.type, e.actor) for e in events if not ACTOR.fullmatch(e.actor)]
    assert unnamed == []
    actors = {e.actor for e in events}
    assert {agent.actor.label, support.actor.label, admin.actor.label} <= actors
    assert {"system:sweeper", "system:saga"} <= actors
    # A worker's acceptance is credited to the execution that ran it, the agent's to the agent.
    invocation = Invocation.objects.get(operation=charge, number=1)
    accepted = Event.objects.get(operation=charge, type="operation.succeeded")
    assert accepted.actor == f"execution:{invocation.execution_id}"
    completed = Event.objects.get(operation=run, type="operation.succeeded")
    assert completed.actor == agent.actor.label
    expired = Event.objects.get(operation=run, type="operation.lease_expired")
    assert expired.actor == "system:sweeper"
