from __future__ import annotations

from typing import Any

from runtime.tools import InvocationContext


def context(
    params: dict[str, Any], *, key: str = "key-1", fencing_token: int = 1, invocation: int = 1
) -> InvocationContext:
    """What the console passes to a tool for one invocation of an operation."""
    return InvocationContext(
        operation_id="op_1",
        task_id="task_1",
        step="step",
        idempotency_key=key,
        params=params,
        fencing_token=fencing_token,
        invocation_number=invocation,
        deadline=None,
    )
