"""Similar items of the support queue, to settle together: unresolved operations of the same
tool, sent to the same receiver, that failed the same way (fourteen identical lost
notifications are one decision, not fourteen cards to read)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runtime.models import Operation
from runtime.rules.statuses import OperationStatus

# The parameters that name where a call goes, first found wins: the notification tools'
# endpoint or address, an HTTP tool's URL, a payment's account. A tool naming none of them
# groups by tool and error alone.
RECEIVER_PARAMS = ("endpoint", "url", "to", "channel", "account")


@dataclass
class Group:
    tool: str
    receiver: str
    error: str
    operations: list[Operation] = field(default_factory=list)


def receiver_of(op: Operation) -> str:
    params: Any = op.params if isinstance(op.params, dict) else {}
    for name in RECEIVER_PARAMS:
        value = params.get(name)
        if isinstance(value, str | int) and str(value):
            return str(value)
    return ""


def error_of(op: Operation) -> str:
    """The failure as a person reads it: the error's kind and message, else the status's
    reason."""
    error: Any = op.error if isinstance(op.error, dict) else {}
    if error:
        return f"{error.get('kind', '')}: {error.get('message', '')}".strip(": ")
    return op.status_reason or ""


def similar_groups(operations: Iterable[Operation], least: int = 2) -> list[Group]:
    """The groups of at least ``least`` unresolved operations (work stopped for a person is
    settled differently, and is left out) sharing tool, receiver and error, largest first; each
    keeps the order it was given."""
    groups: dict[tuple[str, str, str], Group] = {}
    for op in operations:
        if op.status != OperationStatus.UNRESOLVED:
            continue
        key = (op.tool, receiver_of(op), error_of(op))
        groups.setdefault(key, Group(*key)).operations.append(op)
    found = [g for g in groups.values() if len(g.operations) >= least]
    return sorted(found, key=lambda g: -len(g.operations))
