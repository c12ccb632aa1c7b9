"""Tool adapters: how an operation reaches its receiver, and what the receiver promises about
repeated calls (its contract)."""

# The built-in adapters register themselves when imported (after base, which they build on);
# the declared tools' source installs itself (declared), with its HTTP kind (http).
from runtime.tools import checks as _checks  # noqa: F401
from runtime.tools import declared as _declared  # noqa: F401
from runtime.tools import demo as _demo  # noqa: F401
from runtime.tools import http as _http  # noqa: F401
from runtime.tools import model_call as _model_call  # noqa: F401
from runtime.tools import notify as _notify  # noqa: F401
from runtime.tools.base import (
    Contract,
    InvocationContext,
    ToolAdapter,
    ToolFailure,
    ToolResult,
    adapter_at,
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
    "adapter_at",
    "adapter_for",
    "adapters",
    "contract_of",
    "register",
]
