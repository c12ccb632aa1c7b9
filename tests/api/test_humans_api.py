"""The human side over REST, on whichever database the run uses (these tests carry no postgres
marker, so they also run embedded on SQLite): the shapes, the flows end to end, and bad input
answered with a clear 4xx in the contract's error format, never a 500, with nothing changed."""

from __future__ import annotations

import pytest

from runtime.models import Approval, Operation, Signal, TaskCommand
from tests import factories
from tests.api.support import assert_error, post_json, post_raw

pytestmark = pytest.mark.django_db

APPROVAL_FIELDS = {
    "id",
    "operation",
    "status",
    "params_hash",
    "proposal_version",
    "params",
    "requested_by",
    "edited_by",
    "decided_by",
    "decided_at",
    "reason",
    "expires_at",
}


def _gated(owner):
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 10001}
    )
    return task, op, Approval.objects.get(operation=op)


def test_the_pending_list_and_an_approval_have_the_contract_fields():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    listed = operator.client().get("/api/v1/approvals?status=pending").json()["results"]
    assert [a["id"] for a in listed] == [approval.pk]
    assert set(listed[0]) >= APPROVAL_FIELDS
    assert listed[0]["operation"] == op.pk and listed[0]["status"] == "pending"
    # The agent sees its own; another agent sees nothing.
    assert len(owner.client().get("/api/v1/approvals").json()["results"]) == 1
    assert factories.agent().client().get("/api/v1/approvals").json()["results"] == []
    assert_error(factories.agent().client().get(f"/api/v1/approvals/{approval.pk}"), 404)
    assert_error(operator.client().get("/api/v1/approvals?status=maybe"), 400, "invalid_input")


def test_approval_timeout_seconds_is_honoured_per_operation():
    owner = factories.agent()
    task = factories.task(owner)
    response = post_json(
        owner.client(),
        f"/api/v1/tasks/{task.pk}/operations",
        {
            "tool": "demo.payments.charge",
            "step": "pay",
            "params": {"account": "a", "amount_cents": 20000},
            "approval_timeout_seconds": 90,
        },
    )
    assert response.status_code == 201, response.json()
    approval = response.json()["approval"]
    assert approval["status"] == "pending"
    stored = Approval.objects.get(pk=approval["id"])
    assert (stored.expires_at - stored.created_at).total_seconds() == 90
    bad = post_json(
        owner.client(),
        f"/api/v1/tasks/{task.pk}/operations",
        {
            "tool": "demo.payments.charge",
            "step": "pay-2",
            "params": {"account": "a", "amount_cents": 20000},
            "approval_timeout_seconds": 0,
        },
    )
    assert_error(bad, 400)


def test_decide_end_to_end_and_malformed_decisions_change_nothing():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    client = operator.client()
    url = f"/api/v1/approvals/{approval.pk}/decision"
    assert_error(post_raw(client, url, "{not json"), 400)
    assert_error(post_json(client, url, ["approve"]), 400)
    assert_error(post_json(client, url, {"decision": "maybe"}), 400, "invalid_input")
    assert_error(post_json(client, url, {"decision": "approve", "reason": 5}), 400)
    assert_error(post_json(client, url, {"decision": "deny", "reason": "\x00"}), 400)
    assert_error(
        post_json(client, "/api/v1/approvals/apr_nope/decision", {"decision": "approve"}), 404
    )
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    ok = post_json(
        client, url, {"decision": "approve", "reason": "", "params_hash": approval.params_hash}
    )
    assert ok.status_code == 200 and ok.json()["status"] == "approved"
    assert Operation.objects.get(pk=op.pk).status == "pending"


def test_edit_renew_and_bulk_refuse_bad_input_with_4xx():
    owner, operator, admin = (
        factories.agent(),
        factories.console_user("operator"),
        factories.console_user("admin"),
    )
    _, _, approval = _gated(owner)
    edit = f"/api/v1/approvals/{approval.pk}/edit"
    assert_error(post_json(operator.client(), edit, {"params": [1, 2]}), 400)
    assert_error(post_json(operator.client(), edit, {"params": {"account": "a"}}), 400)
    assert_error(
        post_json(owner.client(), edit, {"params": {"account": "b", "amount_cents": 5}}), 403
    )
    renew = f"/api/v1/approvals/{approval.pk}/renew"
    assert_error(post_json(admin.client(), renew, {"expires_in_seconds": -1}), 400)
    assert_error(
        post_json(admin.client(), renew, {"expires_in_seconds": 60}), 409, "wait_not_expired"
    )
    bulk = "/api/v1/approvals/decisions"
    assert_error(post_json(operator.client(), bulk, {"decisions": "all"}), 400)
    assert_error(post_json(operator.client(), bulk, {"decisions": []}), 400)
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_signals_waits_and_control_over_rest():
    owner = factories.agent()
    task = factories.task(owner)
    client = owner.client()
    signals = f"/api/v1/tasks/{task.pk}/signals"
    assert_error(post_json(client, signals, {"name": "go"}), 400)
    assert_error(post_json(client, signals, {"event_id": "e", "name": "go", "payload": [1]}), 400)
    assert (
        post_json(client, signals, {"event_id": "e1", "name": "go"}).json()["disposition"]
        == "buffered"
    )
    wait = post_json(
        client,
        f"/api/v1/tasks/{task.pk}/operations",
        {"kind": "wait_signal", "step": "await-go", "signal": "go", "timeout_seconds": 60},
    )
    assert wait.status_code == 201 and wait.json()["status"] == "succeeded"
    timer = post_json(
        client,
        f"/api/v1/tasks/{task.pk}/operations",
        {"kind": "timer", "step": "nap", "timeout_seconds": 30},
    )
    assert timer.status_code == 201 and timer.json()["status"] == "waiting"
    assert_error(
        post_json(client, f"/api/v1/tasks/{task.pk}/operations", {"kind": "timer", "step": "x"}),
        400,
    )
    assert [s["disposition"] for s in client.get(signals).json()["results"]] == ["buffered"]
    assert Signal.objects.get(event_id="e1").operation_id == wait.json()["id"]

    assert_error(post_json(client, f"/api/v1/tasks/{task.pk}/steer", {"direction": 7}), 400)
    assert post_json(client, f"/api/v1/tasks/{task.pk}/pause", {}).status_code == 202
    assert_error(
        post_json(
            client, f"/api/v1/tasks/{task.pk}/operations", {"tool": "demo.echo", "step": "s"}
        ),
        409,
        "task_paused",
    )
    resumed = post_json(client, f"/api/v1/tasks/{task.pk}/resume", {})
    assert resumed.status_code == 202 and resumed.json()["paused"] is False
    assert TaskCommand.objects.filter(task=task).count() == 2
    assert_error(post_json(client, "/api/v1/tasks/tsk_nope/pause", {}), 404)


def test_expired_waits_list_is_for_admins_and_validates_its_filter():
    admin, owner = factories.console_user("admin"), factories.agent()
    assert admin.client().get("/api/v1/waits").json()["results"] == []
    assert_error(admin.client().get("/api/v1/waits?status=pending"), 400)
    assert owner.client().get("/api/v1/waits").json()["results"] == []
    task = factories.task(owner)
    op = factories.operation(owner, task)
    assert_error(post_json(admin.client(), f"/api/v1/waits/{op.pk}/transform", {}), 409)
    assert_error(post_json(owner.client(), f"/api/v1/waits/{op.pk}/end", {}), 403)
