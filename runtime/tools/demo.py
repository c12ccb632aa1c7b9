"""The sandbox's demo tools. Each reaches a simulated receiver that keeps its own records."""

from __future__ import annotations

from typing import Any

from runtime.tools import faults
from runtime.tools.base import (
    Contract,
    InvocationContext,
    ToolAdapter,
    ToolResult,
    register,
    require_mapping,
)


class Echo(ToolAdapter):
    name = "demo.echo"
    version = "1"
    contract = Contract.PURE
    demo = True

    def validate(self, params: dict[str, Any]) -> None:
        faults.fault_parse(require_mapping(params))

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        fault = faults.before_effect(ctx)
        result = {k: v for k, v in ctx.params.items() if k != "_fault"}
        faults.after_effect(ctx, fault)
        return ToolResult(result=result, usage={"tool_calls": 1})


register(Echo())
