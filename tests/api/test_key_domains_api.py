"""Idempotency key domains over REST (issue 22): a step whose name holds ":" no longer shares a
key with a notification or takes a saga's compensation key ahead of it; an operation stored
under a key derived before parts were escaped is found again by its re-proposal; a caller's
own key may not take a derived key's shape."""

from __future__ import annotations

import pytest

from runtime.cancellation import task_fail
from runtime.keys import key_legacy
from runtime.models import Event, Operation, Task
from runtime.sandbox.models import Charge, Notification
from tests import factories
from tests.api.support import assert_error, post_json
from tests.factories import run_claimable

pytestmark = [pytest.mark.django_db]


def _ops_url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}/operations"


def test_a_step_named_like_a_notification_and_the_notification_are_two_operations():
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    step = post_json(
        client, _ops_url(task.pk), {"tool": "demo.echo", "step": "notify:a", "params": {}}
    )
    assert step.status_code == 201, step.content
    note = post_json(
        client,
        _ops_url(task.pk),
        {"tool": "demo.notify", "step": "a", "params": {"to": "demo.echo", "message": "hi"}},
    )
    assert note.status_code == 201, note.content
    assert note.json()["id"] != step.json()["id"]
    assert note.json()["idempotency_key"] != step.json()["idempotency_key"]
    assert Operation.objects.filter(task=task).count() == 2


def test_a_step_cannot_take_the_key_of_a_compensation_so_the_saga_refunds():
    alice = factories.agent()
    task = factories.task(alice, compensate_on=["failed"])
    client = alice.client()
    charge = post_json(
        client,
        _ops_url(task.pk),
        {
            "tool": "demo.payments.charge",
            "step": "pay",
            "params": {"account": "acct", "amount_cents": 700},
        },
    )
    assert charge.status_code == 201, charge.content
    run_claimable(task.pk)
    charge_id = Operation.objects.get(pk=charge.json()["id"]).result["id"]
    # A step spelled as the charge's key plus ":compensate", with the refund tool: before
    # escaping its key was exactly the compensation's, taken ahead of it.
    squatter = post_json(
        client,
        _ops_url(task.pk),
        {
            "tool": "demo.payments.refund",
            "step": "pay:demo.payments.charge:v1:compensate",
            "params": {"charge": "ch_elsewhere"},
            "executor": "agent",
        },
    )
    assert squatter.status_code == 201, squatter.content

    task_fail(alice.actor, task.pk, "the order was abandoned")
    run_claimable(task.pk)

    original = Operation.objects.get(pk=charge.json()["id"])
    assert original.status == "compensated"
    refund = Operation.objects.get(compensates=original)
    assert refund.status == "succeeded"
    assert refund.idempotency_key != squatter.json()["idempotency_key"]
    assert Charge.objects.filter(kind="refund", amount_cents=-700).count() == 1
    assert charge_id


def test_an_operation_stored_under_its_legacy_key_is_found_again_without_a_second_effect():
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    body = {"tool": "demo.notify", "step": "ship:eu/1", "params": {"to": "a@b.c", "message": "m"}}
    first = post_json(client, _ops_url(task.pk), body)
    assert first.status_code == 201, first.content
    # As stored before escaping: the parts joined as they were.
    escaped = first.json()["idempotency_key"]
    namespace, _, derived = escaped.partition("/")
    legacy = f"{namespace}/{key_legacy(derived)}"
    assert legacy != escaped
    Operation.objects.filter(pk=first.json()["id"]).update(idempotency_key=legacy)
    run_claimable(task.pk)
    assert Notification.objects.filter(key=legacy).count() == 1
    events = Event.objects.filter(task=task).count()

    again = post_json(client, _ops_url(task.pk), body)
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["idempotency_key"] == legacy
    run_claimable(task.pk)
    assert Operation.objects.filter(task=task).count() == 1
    assert Event.objects.filter(task=task).count() == events
    assert Notification.objects.count() == 1
    # Other parameters under the same intent are still a reuse of its key.
    assert_error(
        post_json(client, _ops_url(task.pk), {**body, "params": {"to": "a@b.c", "message": "x"}}),
        422,
        "idempotency_key_reused",
    )


def test_a_legacy_key_held_by_another_intent_is_not_this_ones():
    """The legacy reading of a step "notify:a" is a notification's key: that notification stays
    its own operation and the step gets a new one."""
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    note = post_json(
        client,
        _ops_url(task.pk),
        {"tool": "demo.notify", "step": "a", "params": {"to": "demo.echo"}},
    )
    assert note.status_code == 201
    step = post_json(
        client, _ops_url(task.pk), {"tool": "demo.echo", "step": "notify:a", "params": {"x": 1}}
    )
    assert step.status_code == 201, step.content
    assert step.json()["id"] != note.json()["id"]


def test_a_wait_stored_under_its_legacy_key_is_found_again():
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    body = {"kind": "wait_signal", "step": "await:payment", "signal": "paid"}
    first = post_json(client, _ops_url(task.pk), body)
    assert first.status_code == 201, first.content
    namespace, _, derived = first.json()["idempotency_key"].partition("/")
    Operation.objects.filter(pk=first.json()["id"]).update(
        idempotency_key=f"{namespace}/{key_legacy(derived)}"
    )
    again = post_json(client, _ops_url(task.pk), body)
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert Operation.objects.filter(task=task).count() == 1


@pytest.mark.parametrize("prefix", ["", "own-namespace"])
def test_a_given_key_in_a_derived_keys_shape_is_refused_and_changes_nothing(prefix):
    alice = factories.agent()
    task = factories.task(alice)
    client = alice.client()
    squat = f"{task.pk}:pay:demo.payments.charge:v1:compensate:demo.payments.refund:v1"
    if prefix:
        squat = f"{alice.actor.agent_id}/{squat}"
    response = post_json(
        client,
        _ops_url(task.pk),
        {"tool": "demo.echo", "step": "s", "idempotency_key": squat, "params": {}},
    )
    error = assert_error(response, 400, "invalid_input")
    assert "idempotency_key" in error["message"]
    assert not Operation.objects.filter(task=task).exists()
    assert Task.objects.get(pk=task.pk).state_version == task.state_version
