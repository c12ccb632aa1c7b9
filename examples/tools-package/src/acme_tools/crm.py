"""``acme.crm.create_contact``: a CRM that does not deduplicate, but can be searched by the
reference the caller stores with each contact. The tool stores the operation's idempotency key
there, so after a call nobody heard back from, the console asks (``lookup``) instead of creating
the contact twice or troubling a person."""

from __future__ import annotations

from acme_tools.outcomes import call, outcome
from acme_tools.receivers import Crm
from runtime.tools import Contract, InvocationContext, ToolAdapter, ToolResult


class CreateContact(ToolAdapter):
    name = "acme.crm.create_contact"
    version = "1"
    supported_versions = ("1",)
    description = "Creates a contact in the CRM (asked by reference after an unanswered call)."
    contract = Contract.LOOKUP
    max_attempts = 4
    # A network call: a worker runs it alone, never in a drainer's batch (quick_calls False).
    params_schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "email": {
                "type": "string",
                "minLength": 3,
                "maxLength": 320,
                "pattern": "^[^@]+@[^@]+$",
            },
            "name": {"type": "string", "minLength": 1, "maxLength": 200},
        },
        "required": ["email", "name"],
        "additionalProperties": False,
    }

    def __init__(self, crm: Crm | None = None) -> None:
        self.crm = crm or Crm()

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        response = call(
            lambda: self.crm.create_contact(
                email=ctx.params["email"],
                name=ctx.params["name"],
                external_ref=ctx.idempotency_key,
            )
        )
        return outcome(response)

    def lookup(self, ctx: InvocationContext) -> ToolResult | None:
        """What happened under this operation's key: the contact, or None when there is none
        (then the console calls ``invoke`` again)."""
        response = call(lambda: self.crm.find_contact(external_ref=ctx.idempotency_key))
        if response.status == 404:
            return None
        result = outcome(response)
        result.receipt = {**(result.receipt or {}), "via": "lookup"}
        return result
