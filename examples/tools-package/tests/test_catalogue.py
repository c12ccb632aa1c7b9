"""The package's tools are fit for the console's catalogue: the checks the console runs on
them at start (a name, a version, a valid parameter schema, the methods their contract needs),
and what the catalogue publishes."""

from __future__ import annotations

import pytest
from acme_tools import CreateContact, SendInvoice, VoidInvoice, register_tools

from runtime.errors import InvalidInput
from runtime.tools import ToolAdapter
from runtime.tools.base import registrations_captured
from runtime.tools.loading import tool_problems

TOOLS = [CreateContact(), SendInvoice(), VoidInvoice()]
NAMES = [tool.name for tool in TOOLS]


@pytest.mark.parametrize("tool", TOOLS, ids=NAMES)
def test_the_console_accepts_each_tool(tool: ToolAdapter):
    assert tool_problems(tool, NAMES) == []


def test_register_tools_registers_the_three():
    with registrations_captured() as captured:
        register_tools()
    assert [tool.name for tool in captured] == [
        "acme.crm.create_contact",
        "acme.billing.send_invoice",
        "acme.billing.void_invoice",
    ]


def test_parameters_are_held_to_the_schema():
    SendInvoice().validate({"customer": "c", "amount_cents": 100, "currency": "EUR"})
    with pytest.raises(InvalidInput) as refused:
        SendInvoice().validate({"customer": "c", "amount_cents": "100", "currency": "EUR"})
    assert refused.value.details["field"] == "params.amount_cents"
    with pytest.raises(InvalidInput):
        CreateContact().validate({"email": "not-an-address", "name": "Ada"})


def test_large_invoices_wait_for_an_operator():
    tool = SendInvoice()
    assert not tool.requires_approval({"customer": "c", "amount_cents": 50_000, "currency": "EUR"})
    assert tool.requires_approval({"customer": "c", "amount_cents": 50_001, "currency": "EUR"})
    assert tool.approver_role == "operator"
