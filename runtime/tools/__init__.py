"""Tool adapters: how an operation reaches its receiver, and what the receiver promises about
repeated calls (its contract)."""

# The built-in adapters register themselves when imported (after base, which they build on).
from runtime.tools import checks as _checks  # noqa: F401
from runtime.tools import demo as _demo  # noqa: F401
from runtime.tools import notify as _notify  # noqa: F401
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
