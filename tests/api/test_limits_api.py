"""The limits over REST: budget, estimate and usage are honoured, GET .../budget answers the
contract's shape, a refusal is 409 budget_exhausted with nothing written, a full queue is 429
queue_full with Retry-After and nothing written, attempts and children per API.md."""

from __future__ import annotations

import pytest
from django.test import override_settings

from runtime.models import BudgetHold, Event, Operation, Task
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.django_db


def test_budget_estimate_and_usage_round_trip():
    alice = factories.agent()
    client = alice.client()
    task = post_json(client, "/api/v1/tasks", {"name": "t", "budget": {"cost_cents": 200}}).json()
    op = post_json(
        client,
        f"/api/v1/tasks/{task['id']}/operations",
        {"tool": "demo.echo", "step": "s", "executor": "agent", "estimate": {"cost_cents": 50}},
    )
    assert op.status_code == 201, op.content
    body = client.get(f"/api/v1/tasks/{task['id']}/budget").json()
    assert body["meters"]["cost_cents"] == {
        "limit": 200,
        "reserved": 50,
        "posted": 0,
        "unknown": 0,
        "available": 130,
        "reserve": 20,
    }
    op_id = op.json()["id"]
    claim = client.post(f"/api/v1/operations/{op_id}/claim").json()
    done = post_json(
        client,
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": claim["lease_generation"],
            "lease_token": claim["lease_token"],
            "outcome": "succeeded",
            "usage": {"cost_cents": 33},
        },
    )
    assert done.status_code == 200, done.content
    meter = client.get(f"/api/v1/tasks/{task['id']}/budget").json()["meters"]["cost_cents"]
    assert (meter["reserved"], meter["posted"], meter["available"]) == (0, 33, 147)


def test_a_proposal_the_budget_cannot_cover_is_409_and_writes_nothing():
    alice = factories.agent()
    task = factories.task(alice, budget={"tool_calls": 1})
    factories.operation(alice, task)  # holds the one tool call
    events = Event.objects.filter(task=task).count()
    response = post_json(
        alice.client(), f"/api/v1/tasks/{task.pk}/operations", {"tool": "demo.echo", "step": "b"}
    )
    assert_error(response, 409, "budget_exhausted")
    assert Operation.objects.filter(task=task).count() == 1
    assert Event.objects.filter(task=task).count() == events


@pytest.mark.parametrize(
    "budget", [{"cost_cents": -1}, {"cost_cents": "5"}, {"not a name": 1}, [1], {"x": 2**60}]
)
def test_a_malformed_budget_is_400(budget):
    response = post_json(
        factories.agent().client(), "/api/v1/tasks", {"name": "t", "budget": budget}
    )
    assert response.status_code == 400, response.content
    assert not Task.objects.exists()


def test_budget_of_someone_elses_task_is_404():
    task = factories.task(factories.agent(), budget={"cost_cents": 5})
    response = factories.agent().client().get(f"/api/v1/tasks/{task.pk}/budget")
    assert_error(response, 404, "not_found")


@override_settings(TOOL_QUEUE_CAPACITY={"demo.slow": 2}, TOOL_CONCURRENCY={"demo.slow": 1})
def test_a_full_queue_is_429_with_retry_after_and_writes_nothing():
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    for i in range(2):
        ok = post_json(
            client, f"/api/v1/tasks/{task.pk}/operations", {"tool": "demo.slow", "step": f"s{i}"}
        )
        assert ok.status_code == 201, ok.content
    events = Event.objects.filter(task=task).count()
    response = post_json(
        client, f"/api/v1/tasks/{task.pk}/operations", {"tool": "demo.slow", "step": "s3"}
    )
    assert_error(response, 429, "queue_full")
    assert int(response["Retry-After"]) >= 1
    assert Operation.objects.filter(task=task).count() == 2
    assert Event.objects.filter(task=task).count() == events
    # Another class is not affected.
    other = post_json(
        client, f"/api/v1/tasks/{task.pk}/operations", {"tool": "demo.echo", "step": "e"}
    )
    assert other.status_code == 201


def test_attempts_over_rest():
    alice = factories.agent()
    client = alice.client()
    task = factories.task(alice)
    response = post_json(client, f"/api/v1/tasks/{task.pk}/attempts", {"reason": "retry plan B"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["number"], body["reason"]) == (2, "retry plan B")
    assert client.get(f"/api/v1/tasks/{task.pk}").json()["attempt"]["number"] == 2
    other = factories.agent().client()
    assert_error(post_json(other, f"/api/v1/tasks/{task.pk}/attempts", {}), 404, "not_found")
    assert_error(
        post_json(client, f"/api/v1/tasks/{task.pk}/attempts", {"reason": 5}), 400, "invalid_input"
    )


def test_a_child_over_rest_and_a_parent_that_cannot_cover_it():
    alice = factories.agent()
    client = alice.client()
    parent = factories.task(alice, budget={"cost_cents": 100})
    child = post_json(
        client, "/api/v1/tasks", {"name": "c", "parent": parent.pk, "budget": {"cost_cents": 40}}
    )
    assert child.status_code == 201, child.content
    assert child.json()["parent"] == parent.pk
    refused = post_json(
        client, "/api/v1/tasks", {"name": "c2", "parent": parent.pk, "budget": {"cost_cents": 60}}
    )
    assert_error(refused, 409, "budget_exhausted")
    assert BudgetHold.objects.filter(child_task__isnull=False).count() == 1
    hidden = factories.task(factories.agent())
    assert_error(post_json(client, "/api/v1/tasks", {"name": "x", "parent": hidden.pk}), 404)


def test_the_claim_tells_an_agent_how_much_of_the_deadline_is_left():
    alice = factories.agent()
    task = factories.task(alice, deadline_seconds=300)
    op = factories.operation(alice, task, executor="agent")
    claim = alice.client().post(f"/api/v1/operations/{op.pk}/claim").json()
    assert claim["deadline"] is not None
    assert 0 < claim["deadline_remaining_seconds"] <= 300


def test_waits_and_approvals_are_capped_at_the_tasks_deadline():
    from datetime import timedelta

    from django.utils import timezone

    from runtime.tasks import within_task_deadline

    now = timezone.now()
    deadline = now + timedelta(minutes=5)
    assert within_task_deadline(now + timedelta(hours=1), deadline) == deadline
    assert within_task_deadline(now + timedelta(minutes=1), deadline) == now + timedelta(minutes=1)
    assert within_task_deadline(now + timedelta(hours=1), None) == now + timedelta(hours=1)


def test_only_the_parents_agent_creates_a_child_and_a_refusal_writes_nothing():
    alice = factories.agent()
    parent = factories.task(alice, budget={"cost_cents": 100})
    tasks_before = Task.objects.count()
    # An admin sees every task, but a child draws on the parent's allowance: its agent's right.
    admin = factories.console_user("admin").client()
    refused = post_json(
        admin, "/api/v1/tasks", {"name": "c", "parent": parent.pk, "budget": {"cost_cents": 10}}
    )
    assert_error(refused, 403, "not_authorized")
    assert Task.objects.count() == tasks_before
    assert not BudgetHold.objects.exists()
    # Another agent does not even see the parent.
    other = post_json(
        factories.agent().client(),
        "/api/v1/tasks",
        {"name": "c", "parent": parent.pk, "budget": {"cost_cents": 10}},
    )
    assert_error(other, 404, "not_found")
    assert Task.objects.count() == tasks_before


def test_a_new_attempt_is_refused_to_an_operator_and_open_to_an_admin():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    operator = factories.console_user("operator").client()
    assert_error(
        post_json(operator, f"/api/v1/tasks/{task.pk}/attempts", {}), 403, "not_authorized"
    )
    assert task.attempts.count() == 1
    admin = factories.console_user("admin").client()
    created = post_json(admin, f"/api/v1/tasks/{task.pk}/attempts", {"reason": "take over"})
    assert created.status_code == 201, created.content
    assert created.json()["number"] == 2
    event = Event.objects.filter(task=task, type="attempt.started").get()
    assert event.actor.startswith("user:")
    # The budget is read by whoever sees the task: the operator too.
    body = operator.get(f"/api/v1/tasks/{task.pk}/budget").json()
    assert (body["attempt"], body["meters"]["cost_cents"]["limit"]) == (2, 100)
