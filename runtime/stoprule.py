"""The stop rule's parts that need a query or the tools; the rule itself is written once in
``runtime.rules.stop`` (re-exported here for the modules that import it by this name): when a
task admits no more covered work, and what a stop makes of work that has not finished."""

from __future__ import annotations

from collections.abc import Iterable

from runtime.models import Invocation
from runtime.rules.stop import (
    CONFIRMED_OUTCOMES,
    STOPPED_UNCONFIRMED_EVENT,
    not_stopping_sql,
    stop_asked,
    stop_covers,
    stop_reason,
    stop_settles_to,
    stopping,
    task_stopping,
)
from runtime.tools import Contract, contract_of

__all__ = [
    "CONFIRMED_OUTCOMES",
    "STOPPED_UNCONFIRMED_EVENT",
    "not_stopping_sql",
    "stop_asked",
    "stop_covers",
    "stop_reason",
    "stop_target",
    "stopping",
    "task_stopping",
    "unconfirmed_calls_txn",
]


def unconfirmed_calls_txn(operation_ids: Iterable[str], *, before: int | None = None) -> set[str]:
    """Those of ``operation_ids`` with a call (numbered below ``before``, when given) whose
    effect nobody confirmed. Read inside the stopping transaction, under the operations' row
    locks (no call of theirs can be reported meanwhile)."""
    ids = list(operation_ids)
    if not ids:
        return set()
    calls = Invocation.objects.filter(operation_id__in=ids)
    if before is not None:
        calls = calls.filter(number__lt=before)
    return set(calls.exclude(outcome__in=CONFIRMED_OUTCOMES).values_list("operation_id", flat=True))


def stop_target(tool: str, *, unconfirmed: bool) -> str:
    """What a stop makes of covered work of ``tool`` that is not running
    (``rules.stop.stop_settles_to`` with the tool's contract)."""
    return stop_settles_to(pure=contract_of(tool) == Contract.PURE, unconfirmed=unconfirmed)
