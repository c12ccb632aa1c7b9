"""The demo tools over REST: the receivers' effects view (what a receiver committed under a
key, from its own records; an agent sees only keys of its own operations), and the switch that
turns demo tools and their fault knobs off."""

from __future__ import annotations

import pytest
from django.test import override_settings

from runtime.sandbox import receivers
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _charged(owner):
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a1", "amount_cents": 250}
    )
    receivers.payments_charge(
        key=op.idempotency_key, body={"account": "a1", "amount_cents": 250}, fencing_token=1
    )
    return op


def test_an_agent_reads_the_effects_under_its_own_key():
    owner = factories.agent()
    op = _charged(owner)
    response = owner.client().get(
        "/api/v1/demo/receivers/payments/effects", {"key": op.idempotency_key}
    )
    assert response.status_code == 200
    effects = response.json()["effects"]
    assert len(effects) == 1
    assert effects[0]["amount_cents"] == 250
    assert effects[0]["kind"] == "charge"


def test_another_agent_gets_404_and_a_console_user_sees_any_key():
    owner, stranger = factories.agent(), factories.agent()
    op = _charged(owner)
    url = "/api/v1/demo/receivers/payments/effects"
    assert stranger.client().get(url, {"key": op.idempotency_key}).status_code == 404
    support = factories.console_user("support")
    assert len(support.client().get(url, {"key": op.idempotency_key}).json()["effects"]) == 1


def test_unknown_receiver_and_switched_off_demo_tools_are_404():
    support = factories.console_user("support")
    assert support.client().get("/api/v1/demo/receivers/bank/effects?key=x").status_code == 404
    with override_settings(DEMO_TOOLS=False):
        response = support.client().get("/api/v1/demo/receivers/payments/effects?key=x")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_demo_tools_and_their_fault_knobs_are_off_where_demo_tools_are_off():
    owner = factories.agent()
    task = factories.task(owner)
    with override_settings(DEMO_TOOLS=False):
        response = owner.client().post(
            f"/api/v1/tasks/{task.pk}/operations",
            {"tool": "demo.echo", "step": "s", "params": {"_fault": "crash_after_effect"}},
            format="json",
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_tool"


def test_an_unknown_fault_knob_is_refused():
    owner = factories.agent()
    task = factories.task(owner)
    response = owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.echo", "step": "s", "params": {"_fault": "explode"}},
        format="json",
    )
    assert response.status_code == 400
