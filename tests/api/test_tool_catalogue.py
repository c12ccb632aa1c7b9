"""The tool catalogue (GET /api/v1/tools, issue 24 point 9): every tool with its version,
receiver contract, approval rule and the JSON Schema of its parameters; proposals and edits are
held to that schema (400 invalid_input naming the field), and what it accepts is accepted.

No postgres mark: these run on SQLite too."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.jsonschemas import json_instance_check, json_schema_compile, json_schema_validate
from runtime.models import Approval, Operation
from runtime.tools import ToolAdapter, adapters
from runtime.tools.base import _REGISTRY
from tests import factories
from tests.api.support import assert_error

pytestmark = [pytest.mark.django_db]


def _catalogue(principal: Any) -> dict[str, dict[str, Any]]:
    response = principal.client().get("/api/v1/tools")
    assert response.status_code == 200, response.content
    return {entry["name"]: entry for entry in response.json()["results"]}


def test_the_catalogue_lists_each_tool_with_contract_approval_and_params_schema():
    tools = _catalogue(factories.agent())
    # The runtime's own tools (the notification adapters) are nobody else's to propose.
    assert set(tools) == {name for name, a in adapters().items() if not a.system_only}
    assert "notify.email" in adapters() and "notify.email" not in tools
    charge = tools["demo.payments.charge"]
    assert charge["contract"] == "replay" and charge["version"] == "1"
    assert charge["approval"] == {
        "required": "conditional",
        "when": "amount_cents above 10000",
        "approver_role": "operator",
        "timeout_seconds": 3600,
        # The two-person rule: above a second, higher threshold, two distinct approvers.
        "approvers": 2,
        "approvers_when": "amount_cents above 100000",
    }
    schema = charge["params_schema"]
    assert set(schema["required"]) == {"account", "amount_cents"}
    assert schema["properties"]["amount_cents"]["type"] == "integer"
    assert schema["properties"]["amount_cents"]["maximum"] == 2**53 - 1
    assert tools["demo.inventory.reserve"]["contract"] == "lookup"
    assert tools["demo.notify"]["contract"] == "none"
    assert tools["demo.echo"]["approval"]["required"] == "never"
    # People read it too (a console role's token).
    assert set(_catalogue(factories.console_user("support"))) == set(tools)


@pytest.mark.parametrize("adapter", list(_REGISTRY.values()), ids=lambda a: a.name)
def test_every_registered_tool_declares_a_valid_self_contained_params_schema(
    adapter: ToolAdapter,
):
    schema = adapter.params_schema
    assert isinstance(schema, dict) and schema.get("type") == "object", adapter.name
    json_schema_validate(schema, "params_schema")  # valid for its draft, refers only inside
    assert "params_schema" in type(adapter).__dict__, f"{adapter.name} declares no schema"
    if type(adapter).requires_approval is not ToolAdapter.requires_approval:
        assert adapter.approval_when, f"{adapter.name} may need approval but does not say when"
    if type(adapter).approvals_required is not ToolAdapter.approvals_required:
        assert adapter.approvers > 1 and adapter.approvers_when, (
            f"{adapter.name} may need more approvers but does not say how many or when"
        )


def _propose(owner: Any, task: Any, tool: str, params: Any, step: str = "s") -> Any:
    return owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": tool, "step": step, "params": params},
        format="json",
    )


@pytest.mark.parametrize(
    ("tool", "params", "field"),
    [
        ("demo.payments.charge", {"account": "a", "amount_cents": "500"}, "params.amount_cents"),
        ("demo.payments.charge", {"account": "a", "amount_cents": 500.0}, "params.amount_cents"),
        ("demo.payments.charge", {"amount_cents": 500}, "params.account"),
        ("demo.inventory.reserve", {"sku": "s", "qty": 0}, "params.qty"),
        ("demo.notify", {"to": "x@example.com", "message": 5}, "params.message"),
        ("demo.slow", {"seconds": 121}, "params.seconds"),
        ("demo.echo", {"_fault": "explode"}, "params._fault"),
    ],
)
def test_a_proposal_the_schema_refuses_is_400_naming_the_field(tool, params, field):
    owner = factories.agent()
    task = factories.task(owner)
    error = assert_error(_propose(owner, task, tool, params), 400, "invalid_input")
    assert error["field"] == field, error
    assert error["message"].startswith(field), error
    assert not Operation.objects.filter(task=task).exists()


@pytest.mark.parametrize(
    ("tool", "params", "status"),
    [
        ("demo.payments.charge", {"account": "a", "amount_cents": 500}, "pending"),
        ("demo.payments.charge", {"account": "a", "amount_cents": 25000}, "waiting_approval"),
        ("demo.echo", {"_fault": "transient:2", "anything": [1]}, "pending"),
    ],
)
def test_what_the_published_schema_accepts_is_created(tool, params, status):
    owner = factories.agent()
    task = factories.task(owner)
    # The catalogue's schema, as an agent reads it, accepts these parameters...
    published = _catalogue(owner)[tool]["params_schema"]
    json_instance_check(params, json_schema_compile(published), "params")
    # ...and so does the proposal.
    response = _propose(owner, task, tool, params)
    assert response.status_code == 201, response.content
    assert response.json()["status"] == status


def test_an_edit_is_held_to_the_same_schema():
    owner = factories.agent()
    task = factories.task(owner)
    gated = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 25000}
    )
    approval = gated.approvals.get()
    operator = factories.console_user("operator")
    response = operator.client().post(
        f"/api/v1/approvals/{approval.pk}/edit",
        {"params": {"amount_cents": 30000}, "reason": "typo"},
        format="json",
    )
    error = assert_error(response, 400, "invalid_input")
    assert error["field"] == "params.account", error
    assert Approval.objects.filter(operation=gated).count() == 1
