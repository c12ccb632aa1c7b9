"""Tool adapters: how an operation reaches its receiver, and what the receiver promises about
repeated calls (its contract)."""

from runtime.tools.base import (
    Contract,
    InvocationContext,
    ToolAdapter,
    ToolFailure,
    ToolResult,
    adapter_for,
    adapters,
    contract_of,
    register,
)

__all__ = [
    "Contract",
    "InvocationContext",
    "ToolAdapter",
    "ToolFailure",
    "ToolResult",
    "adapter_for",
    "adapters",
    "contract_of",
    "register",
]
