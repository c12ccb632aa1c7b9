"""``model.call``: one request of an agent to its language model, recorded as an operation the
agent runs itself (executor=agent), present in every deployment (not a demo tool): the agent
proposes it with an estimate (``{"model_tokens": N}``, held against the task's budget, so a
budget that cannot cover it refuses the call before it is made), claims it, makes the request
and completes it with the usage the model reported (``model_tokens``, and ``cost_cents`` when it
knows the price), which is posted to the task's ledger. The client's adapters record each model
request under it as a turn of a durable run, the response in its result for a restarted agent to
replay (client/agent_console_client/_turns.py)."""

from __future__ import annotations

from runtime.tools.base import (
    Contract,
    InvocationContext,
    ToolAdapter,
    ToolFailure,
    ToolResult,
    register,
)


class ModelCall(ToolAdapter):
    name = "model.call"
    version = "1"
    supported_versions = ("1",)
    description = (
        "One request to a language model, made by the agent itself (executor agent); its usage "
        "(model_tokens, cost_cents) is posted to the task's budget."
    )
    # Asking a model again has no effect outside the console but its cost, which the ledger
    # counts: a call whose report was lost may simply be made again.
    contract = Contract.PURE
    agent_run = True
    tool_class = "model"
    params_schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "model": {"type": "string", "minLength": 1, "maxLength": 200},
            "call": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
            "purpose": {"type": "string", "maxLength": 500},
        },
        "required": ["model"],
    }

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        raise ToolFailure(
            ToolFailure.PERMANENT,
            "model.call is run by the agent that proposes it (executor agent)",
        )


register(ModelCall())
