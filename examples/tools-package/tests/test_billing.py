"""acme.billing.send_invoice: the invoicing API keeps the first answer per idempotency key, so a
retried call sends nothing twice; a stale lease holder is refused; the void undoes it."""

from __future__ import annotations

import pytest
from acme_tools import SendInvoice, VoidInvoice
from acme_tools.receivers import Billing, fail_next
from support import context

from runtime.tools import ToolFailure

PARAMS = {"customer": "cus_42", "amount_cents": 12_500, "currency": "EUR"}


def test_a_repeat_under_the_same_key_returns_the_first_invoice():
    tool = SendInvoice()
    first = tool.invoke(context(PARAMS, key="k"))
    again = tool.invoke(context(PARAMS, key="k", invocation=2))
    other = tool.invoke(context(PARAMS, key="k2"))
    assert again.result == first.result
    assert other.result["id"] != first.result["id"]
    assert [i["id"] for i in Billing().invoices()] == [first.result["id"], other.result["id"]]
    assert first.usage == {"tool_calls": 1, "invoiced_cents": 12_500.0}


def test_after_a_timeout_the_retry_replays_the_invoice_sent():
    tool = SendInvoice()
    fail_next("timeout")
    with pytest.raises(ToolFailure) as unanswered:
        tool.invoke(context(PARAMS, key="k"))
    assert unanswered.value.kind == ToolFailure.UNKNOWN
    replayed = tool.invoke(context(PARAMS, key="k", invocation=2))
    assert [i["id"] for i in Billing().invoices()] == [replayed.result["id"]]


def test_an_older_lease_holder_is_refused_once_a_newer_one_acted():
    tool = SendInvoice()
    tool.invoke(context(PARAMS, key="k", fencing_token=2))
    with pytest.raises(ToolFailure) as stale:
        tool.invoke(context(PARAMS, key="k", fencing_token=1))
    assert stale.value.kind == ToolFailure.PERMANENT
    assert "stale_fencing_token" in stale.value.message


def test_the_compensation_voids_the_invoice_and_voiding_twice_is_harmless():
    sent = SendInvoice().invoke(context(PARAMS, key="k"))
    params = SendInvoice().compensation_params(sent.result)
    void = VoidInvoice()
    void.validate(params)
    assert void.invoke(context(params, key="undo")).result == {
        "id": sent.result["id"],
        "status": "void",
    }
    assert void.invoke(context(params, key="undo", invocation=2)).result["status"] == "void"
    assert [i["status"] for i in Billing().invoices()] == ["void"]


def test_voiding_an_unknown_invoice_is_a_permanent_failure():
    with pytest.raises(ToolFailure) as failed:
        VoidInvoice().invoke(context({"invoice": "in_0"}))
    assert failed.value.kind == ToolFailure.PERMANENT


def test_a_refused_connection_is_transient():
    class Down(Billing):
        def send_invoice(self, **kwargs):
            raise ConnectionRefusedError("connection refused")

    with pytest.raises(ToolFailure) as failed:
        SendInvoice(billing=Down()).invoke(context(PARAMS))
    assert failed.value.kind == ToolFailure.TRANSIENT
