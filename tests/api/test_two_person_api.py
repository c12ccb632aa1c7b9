"""The two-person rule over REST (issue 39): an approval carries ``approvals_required`` and
``approved_by``; an approve that is not the last one required answers 200 with the request still
pending; the same person's second approve is a 409 ``approval_already_approved`` that changes
nothing; the bulk endpoint applies the rule per item; a declared tool's admin sets the rule
(``approval.approvers``, ``approvers_param``, ``approvers_above``), checked with a 400 naming the
field. Runs on SQLite too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime.models import Approval, ApprovalVote, DeclaredTool
from runtime.tools.declared import declarations_forget
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = [pytest.mark.django_db]

TWO = {"account": "acct-api", "amount_cents": 150000}


def _gated(owner: Any, params: dict[str, Any] = TWO, tool: str = "demo.payments.charge") -> Any:
    task = factories.task(owner)
    op = factories.operation(owner, task, tool=tool, params=dict(params))
    return Approval.objects.get(operation=op)


def _approve(who: Any, approval: Approval) -> Any:
    return post_json(
        who.client(),
        f"/api/v1/approvals/{approval.pk}/decision",
        {"decision": "approve", "reason": "ok", "params_hash": approval.params_hash},
    )


def test_an_approval_needs_two_people_and_says_who_approved_so_far():
    owner = factories.agent()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    approval = _gated(owner)
    shown = alice.client().get(f"/api/v1/approvals/{approval.pk}").json()
    assert (shown["approvals_required"], shown["approved_by"]) == (2, [])

    first = _approve(alice, approval)
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "pending"
    assert first.json()["approved_by"] == [alice.actor.label]

    again = _approve(alice, approval)
    error = assert_error(again, 409, "approval_already_approved")
    assert "1 of 2 approvals" in error["message"]
    assert ApprovalVote.objects.filter(approval=approval).count() == 1
    listed = alice.client().get("/api/v1/approvals?status=pending").json()["results"]
    assert [(a["id"], a["approved_by"]) for a in listed] == [(approval.pk, [alice.actor.label])]

    bulk = post_json(
        bob.client(),
        "/api/v1/approvals/decisions",
        {
            "decisions": [
                {
                    "approval": approval.pk,
                    "decision": "approve",
                    "params_hash": approval.params_hash,
                }
            ]
        },
    )
    assert bulk.status_code == 200, bulk.content
    assert bulk.json()["results"] == [
        {
            "approval": approval.pk,
            "status": 200,
            "approval_status": "approved",
            "approvals_required": 2,
            "approved_by": [alice.actor.label, bob.actor.label],
        }
    ]
    operation = owner.client().get(f"/api/v1/operations/{approval.operation_id}").json()
    assert operation["status"] == "pending"
    assert operation["approval"]["approved_by"] == [alice.actor.label, bob.actor.label]


@pytest.fixture
def _declarations() -> Iterator[None]:
    declarations_forget()
    yield
    declarations_forget()


def _declared(**approval: Any) -> dict[str, Any]:
    return {
        "name": "acme.treasury.wire",
        "kind": "http",
        "contract": "replay",
        "url": "https://bank.example.com/wires",
        "params_schema": {
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "memo": {"type": "string"}},
        },
        "approval": {"required": "conditional", "param": "amount", "above": 100, **approval},
    }


@pytest.mark.usefixtures("_declarations")
@pytest.mark.parametrize(
    ("approval", "field"),
    [
        ({"approvers": 0}, "approval.approvers"),
        ({"approvers": 6}, "approval.approvers"),
        (
            {"approvers": 2, "approvers_param": "memo", "approvers_above": 5},
            "approval.approvers_param",
        ),
        ({"approvers": 2, "approvers_param": "amount"}, "approval.approvers_above"),
        ({"approvers_param": "amount", "approvers_above": 5}, "approval.approvers_param"),
    ],
)
def test_a_declared_two_person_rule_is_checked_and_a_bad_one_changes_nothing(approval, field):
    admin = factories.console_user("admin")
    response = post_json(admin.client(), "/api/v1/tools/declared", _declared(**approval))
    error = assert_error(response, 400, "invalid_input")
    assert error.get("field") == field, error
    assert not DeclaredTool.objects.exists()


@pytest.mark.usefixtures("_declarations")
def test_a_declared_tool_needs_two_approvers_above_its_threshold():
    admin = factories.console_user("admin")
    body = _declared(approvers=2, approvers_param="amount", approvers_above=10000)
    response = post_json(admin.client(), "/api/v1/tools/declared", body)
    assert response.status_code == 201, response.content
    assert response.json()["approval"]["approvers"] == 2
    owner = factories.agent()
    entry = next(
        t
        for t in owner.client().get("/api/v1/tools").json()["results"]
        if t["name"] == body["name"]
    )
    assert entry["approval"]["approvers"] == 2
    assert entry["approval"]["approvers_when"] == "amount above 10000"

    assert _gated(owner, {"amount": 500}, body["name"]).approvals_required == 1
    assert _gated(owner, {"amount": 50000}, body["name"]).approvals_required == 2
