"""``acme.billing.send_invoice`` and its compensation ``acme.billing.void_invoice``: an
invoicing API that keeps the first answer per ``Idempotency-Key`` (so a repeated call is
harmless: contract ``replay``). An invoice above 500.00 waits for an operator's approval; a
saga that fails after the invoice was sent voids it."""

from __future__ import annotations

from typing import Any

from acme_tools.outcomes import call, outcome
from acme_tools.receivers import Billing
from runtime.tools import Contract, InvocationContext, ToolAdapter, ToolResult

APPROVAL_ABOVE_CENTS = 50_000


class SendInvoice(ToolAdapter):
    name = "acme.billing.send_invoice"
    version = "1"
    supported_versions = ("1",)
    description = "Sends an invoice (the first answer per idempotency key; voided to undo)."
    contract = Contract.REPLAY
    # Admission control: TOOL_CONCURRENCY=acme.billing=N caps the calls running at once.
    tool_class = "acme.billing"
    max_attempts = 6
    max_elapsed_seconds = 6 * 3600.0
    approval_when = f"amount_cents above {APPROVAL_ABOVE_CENTS}"
    approver_role = "operator"
    approval_timeout_seconds = 4 * 3600
    compensation_tool = "acme.billing.void_invoice"
    params_schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "customer": {"type": "string", "minLength": 1, "maxLength": 100},
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 100_000_000},
            "currency": {"enum": ["EUR", "GBP", "USD"]},
        },
        "required": ["customer", "amount_cents", "currency"],
        "additionalProperties": False,
    }

    def __init__(self, billing: Billing | None = None) -> None:
        self.billing = billing or Billing()

    def requires_approval(self, params: dict[str, Any]) -> bool:
        return int(params["amount_cents"]) > APPROVAL_ABOVE_CENTS

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        response = call(
            lambda: self.billing.send_invoice(
                idempotency_key=ctx.idempotency_key,
                fencing_token=ctx.fencing_token,
                customer=ctx.params["customer"],
                amount_cents=ctx.params["amount_cents"],
                currency=ctx.params["currency"],
            )
        )
        # A usage meter: a task's budget may cap it ({"budget": {"invoiced_cents": 100000}}).
        return outcome(response, usage={"invoiced_cents": float(ctx.params["amount_cents"])})

    def compensation_params(self, result: Any) -> dict[str, Any]:
        return {"invoice": result["id"]}


class VoidInvoice(ToolAdapter):
    name = "acme.billing.void_invoice"
    version = "1"
    supported_versions = ("1",)
    description = "Voids an invoice (the compensation of acme.billing.send_invoice)."
    contract = Contract.REPLAY  # voiding twice leaves the same invoice
    tool_class = "acme.billing"
    max_attempts = 10
    params_schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"invoice": {"type": "string", "pattern": "^in_[0-9a-f]+$"}},
        "required": ["invoice"],
        "additionalProperties": False,
    }

    def __init__(self, billing: Billing | None = None) -> None:
        self.billing = billing or Billing()

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        return outcome(call(lambda: self.billing.void_invoice(invoice=ctx.params["invoice"])))
