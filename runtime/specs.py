"""What a proposal asks for (an operation's specification): below the proposal
(runtime.transitions.propose) and the waits (runtime.transitions.propose_wait), which both
take it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.models import Operation


@dataclass
class OperationSpec:
    kind: str = Operation.KIND_TOOL
    tool: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    step: str = ""
    intent_version: int = 1
    idempotency_key: str | None = None
    estimate: dict[str, float] = field(default_factory=dict)
    executor: str = Operation.EXECUTOR_WORKER
    max_attempts: int | None = None
    signal: str = ""
    timeout_seconds: int | None = None
    approval_timeout_seconds: int | None = None
    # The runtime derived ``idempotency_key`` itself (runtime.keys; a check run's): exempt from
    # the rule that keeps callers' keys out of the derived domains. Never set from a request.
    key_derived: bool = False
