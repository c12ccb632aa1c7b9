"""Agent-executed operations over REST: claim, heartbeat and complete under the fencing token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.executions import execution_for_agent
from runtime.models import Event, Operation, OutboxMessage, RejectedObservation
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories

pytestmark = [pytest.mark.django_db]


def _agent_op(owner):
    task = factories.task(owner)
    client = owner.client()
    response = client.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.echo", "params": {"q": 1}, "step": "think", "executor": "agent"},
        format="json",
    )
    assert response.status_code == 201, response.content
    return client, response.json()["id"]


def test_an_agent_run_operation_is_not_announced_to_workers():
    owner = factories.agent()
    _, op_id = _agent_op(owner)
    assert not OutboxMessage.objects.filter(operation_id=op_id).exists()


def test_losing_the_lease_to_a_second_claimant_refuses_the_first_completion():
    owner = factories.agent()
    client, op_id = _agent_op(owner)

    first = client.post(f"/api/v1/operations/{op_id}/claim", format="json")
    assert first.status_code == 200
    assert first.json()["lease_generation"] == 1
    token1 = first.json()["lease_token"]
    busy = client.post(f"/api/v1/operations/{op_id}/claim", format="json")
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "not_claimable"

    # The first claimant goes quiet; its lease expires and a second claimant takes over.
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=600)) == 1
    second = client.post(f"/api/v1/operations/{op_id}/claim", format="json")
    assert second.status_code == 200
    assert second.json()["lease_generation"] == 2
    token2 = second.json()["lease_token"]
    assert token2 != token1

    stale_beat = client.post(
        f"/api/v1/operations/{op_id}/heartbeat",
        {"lease_generation": 1, "lease_token": token1},
        format="json",
    )
    assert stale_beat.status_code == 409
    assert stale_beat.json()["error"]["code"] == "stale_lease"
    beat = client.post(
        f"/api/v1/operations/{op_id}/heartbeat",
        {"lease_generation": 2, "lease_token": token2},
        format="json",
    )
    assert beat.status_code == 200
    assert beat.json()["cancel_requested"] is False

    late = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": 1,
            "lease_token": token1,
            "outcome": "succeeded",
            "result": {"from": "first"},
        },
        format="json",
    )
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "stale_lease"
    current = client.get(f"/api/v1/operations/{op_id}").json()
    assert current["status"] == "running"
    assert current["result"] is None
    assert RejectedObservation.objects.filter(
        operation_id=op_id, kind="stale_completion", lease_generation=1
    ).exists()

    done = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": 2,
            "lease_token": token2,
            "outcome": "succeeded",
            "result": {"from": "second"},
        },
        format="json",
    )
    assert done.status_code == 200
    assert done.json()["status"] == "succeeded"
    assert done.json()["result"] == {"from": "second"}

    # A repeated completion is harmless: same answer, no second accepted transition.
    again = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": 2,
            "lease_token": token2,
            "outcome": "succeeded",
            "result": {"from": "second"},
        },
        format="json",
    )
    assert again.status_code == 200
    assert again.json()["result"] == {"from": "second"}
    assert Event.objects.filter(operation_id=op_id, type="operation.succeeded").count() == 1
    invocations = client.get(f"/api/v1/operations/{op_id}").json()["invocations"]
    assert [(i["number"], i["outcome"]) for i in invocations] == [(1, "lost"), (2, "succeeded")]


def test_transient_failure_reported_by_an_agent_schedules_a_retry_it_can_claim():
    owner = factories.agent()
    client, op_id = _agent_op(owner)
    token = client.post(f"/api/v1/operations/{op_id}/claim", format="json").json()["lease_token"]
    failed = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": 1,
            "lease_token": token,
            "outcome": "failed",
            "error": {"kind": "transient", "message": "x"},
        },
        format="json",
    )
    assert failed.status_code == 200
    body = failed.json()
    assert body["status"] == "retry_scheduled"
    assert body["attempts_used"] == 1
    assert body["error"]["kind"] == "transient"
    # The retry waits for its agent's claim; workers are never told about it.
    assert not OutboxMessage.objects.filter(operation_id=op_id).exists()


def test_permanent_failure_ends_the_operation_and_a_failure_needs_its_kind():
    owner = factories.agent()
    client, op_id = _agent_op(owner)
    token = client.post(f"/api/v1/operations/{op_id}/claim", format="json").json()["lease_token"]
    bad = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {"lease_generation": 1, "lease_token": token, "outcome": "failed"},
        format="json",
    )
    assert bad.status_code == 400
    failed = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": 1,
            "lease_token": token,
            "outcome": "failed",
            "error": {"kind": "permanent", "message": "no"},
        },
        format="json",
    )
    assert failed.json()["status"] == "failed"


def test_a_worker_executed_operation_cannot_be_claimed_by_an_agent():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task)
    response = owner.client().post(f"/api/v1/operations/{op.pk}/claim", format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_claimable"


def test_another_agent_cannot_claim_or_complete():
    owner, stranger = factories.agent(), factories.agent()
    _, op_id = _agent_op(owner)
    client = stranger.client()
    assert client.post(f"/api/v1/operations/{op_id}/claim", format="json").status_code == 404
    response = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {"lease_generation": 1, "lease_token": "guess", "outcome": "succeeded"},
        format="json",
    )
    assert response.status_code == 404


def _complete(client, op_id, generation, token, **body):
    return client.post(
        f"/api/v1/operations/{op_id}/complete",
        {"lease_generation": generation, "lease_token": token, "outcome": "succeeded", **body},
        format="json",
    )


def test_a_completion_needs_the_claims_token_not_just_its_generation():
    owner = factories.agent()
    client, op_id = _agent_op(owner)
    claim = client.post(f"/api/v1/operations/{op_id}/claim", format="json").json()
    # The generation is public (it is in every operation body); the token is the claim's own.
    forged = _complete(client, op_id, claim["lease_generation"], "not-the-token", result={"x": 1})
    assert forged.status_code == 409
    assert forged.json()["error"]["code"] == "stale_lease"
    beat = client.post(
        f"/api/v1/operations/{op_id}/heartbeat",
        {"lease_generation": claim["lease_generation"], "lease_token": "not-the-token"},
        format="json",
    )
    assert beat.status_code == 409
    op = Operation.objects.get(pk=op_id)
    assert (op.status, op.result) == ("running", None)
    assert RejectedObservation.objects.filter(operation_id=op_id, kind="stale_completion").exists()
    # The token is stored only as a digest.
    assert claim["lease_token"] not in op.lease_token_digest
    assert _complete(client, op_id, 1, claim["lease_token"]).status_code == 200


def test_a_worker_run_operation_cannot_be_heartbeated_or_completed_over_the_api():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    client = owner.client()
    # Even holding the worker's real token, the API refuses: workers report, not callers.
    forged = _complete(client, op.pk, lease.lease_generation, lease.lease_token, result={"x": 1})
    assert forged.status_code == 409
    assert forged.json()["error"]["code"] == "stale_lease"
    beat = client.post(
        f"/api/v1/operations/{op.pk}/heartbeat",
        {"lease_generation": lease.lease_generation, "lease_token": lease.lease_token},
        format="json",
    )
    assert beat.status_code == 409
    op.refresh_from_db()
    assert (op.status, op.result) == ("running", None)


def test_a_late_completion_after_the_sweeper_took_the_lease_back_is_409_and_recorded():
    owner = factories.agent()
    client, op_id = _agent_op(owner)
    claim = client.post(f"/api/v1/operations/{op_id}/claim", format="json").json()
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=600)) == 1
    assert Operation.objects.get(pk=op_id).status == "pending"  # no new claim yet

    late = _complete(client, op_id, claim["lease_generation"], claim["lease_token"])
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "stale_lease"
    op = Operation.objects.get(pk=op_id)
    assert (op.status, op.result) == ("pending", None)
    assert RejectedObservation.objects.filter(
        operation_id=op_id, kind="stale_completion", lease_generation=1
    ).exists()
    assert Event.objects.filter(operation_id=op_id, type="operation.report_rejected").exists()
