"""Planted defects, for the simulation only (docs/simulation.md, "Plants"): each is a patch of
the runtime function it breaks, applied for the length of one run, so nothing of them lives in
the runtime itself. A plant shows the oracles catch a defect nobody told them about: none of
them names a plant, and each plant is judged by whether any invariant breaks earlier than it
does without the plant (runtime.simulation.catch).

Names a runtime module imported from another (``from runtime.stoprule import ...``) are
patched in every module that holds them, so a plant breaks the function wherever it is called."""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from runtime import approval_gate, budget_allocations, budgets, compensation, stoprule
from runtime.models import Invocation, Operation
from runtime.tools.demo import InventoryReserve
from runtime.transitions import accept


def _everywhere(stack: ExitStack, module: Any, name: str, replacement: Any) -> None:
    """Patch ``module.name`` and every runtime module's name bound to the same object."""
    original = getattr(module, name)
    for loaded in list(sys.modules.values()):
        if not getattr(loaded, "__name__", "").startswith("runtime."):
            continue
        if getattr(loaded, name, None) is original:
            stack.enter_context(mock.patch.object(loaded, name, replacement))


def _stale_accept(stack: ExitStack) -> None:
    """The acceptance skips its fence (lease generation, state version, token): the general
    path compares the report with the row's own values, and the one-statement path matches any
    claim of a running operation."""
    general = accept._report_general_txn
    signature = inspect.signature(general)

    def report_unfenced(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        row = Operation.objects.filter(pk=bound.arguments["operation_id"]).values_list(
            "lease_generation", "state_version"
        )
        current = row.first()
        if current is not None:
            bound.arguments["lease_generation"], bound.arguments["state_version"] = current
        return general(*bound.args, **bound.kwargs)

    fast = accept.accept_txn

    def accept_unfenced(op: Operation, **kwargs: Any) -> Any:
        fence = ("lease_generation", "state_version", "lease_token_digest")
        row = Operation.objects.filter(pk=op.pk).values_list(*fence).first()
        if row is not None:
            op = copy.copy(op)
            op.lease_generation, op.state_version = row[0], row[1]
            kwargs["lease_token_digest"] = row[2]
        return fast(op, **kwargs)

    stack.enter_context(mock.patch.object(accept, "_report_general_txn", report_unfenced))
    stack.enter_context(mock.patch.object(accept, "lease_token_matches", lambda *a: True))
    stack.enter_context(mock.patch.object(accept, "accept_txn", accept_unfenced))


def _stop_unlocked(stack: ExitStack) -> None:
    """The read of a call's outcome for a stop (or any ending) misses the calls still in flight
    or lost with their lease, as a read made without the operation's lock before the call's own
    record would: such work is ended as if no call had been made."""

    def unlocked(operation_ids: Any, *, before: int | None = None) -> set[str]:
        calls = Invocation.objects.filter(
            operation_id__in=list(operation_ids), outcome__isnull=False
        ).exclude(outcome=Invocation.OUTCOME_LOST)
        if before is not None:
            calls = calls.filter(number__lt=before)
        confirmed = stoprule.CONFIRMED_OUTCOMES
        return set(calls.exclude(outcome__in=confirmed).values_list("operation_id", flat=True))

    _everywhere(stack, stoprule, "unconfirmed_calls_txn", unlocked)


def _release_expired(stack: ExitStack) -> None:
    """The release gate does not see that an approval expired (its clock reads long ago)."""
    long_ago = datetime(2000, 1, 1, tzinfo=UTC)
    stack.enter_context(mock.patch.object(approval_gate, "db_now", lambda: long_ago))


def _confirmed_widened(stack: ExitStack) -> None:
    """What counts as a confirmed outcome is widened: an ``unknown`` answer counts as known."""
    widened = (*stoprule.CONFIRMED_OUTCOMES, Invocation.OUTCOME_UNKNOWN)
    _everywhere(stack, stoprule, "CONFIRMED_OUTCOMES", widened)


def _meter_dropped(stack: ExitStack) -> None:
    """Settlement stops posting a usage meter: only the builtin meters are posted, so a meter a
    task declared itself (``tokens`` here) never moves."""
    record = budgets.record_usage_txn

    def record_builtin(*, meter_id: int, **kwargs: Any) -> bool:
        name = budgets.BudgetMeter.objects.filter(pk=meter_id).values_list("meter", flat=True)
        if name.first() not in budgets.BUILTIN_METERS:
            return False
        return record(meter_id=meter_id, **kwargs)

    _everywhere(stack, budgets, "record_usage_txn", record_builtin)


def _settle_keeps_hold(stack: ExitStack) -> None:
    """A call's settlement posts its usage but forgets to release the hold it covered."""
    settle, move = budgets.budget_settle_txn, budgets._holds_move_txn
    settling = [False]

    def settle_flagged(**kwargs: Any) -> None:
        settling[0] = True
        try:
            settle(**kwargs)
        finally:
            settling[0] = False

    def move_unless_settling(op: Operation, source: str, target: str, **kwargs: Any) -> None:
        if settling[0] and (source, target) == ("held", "settled"):
            return
        move(op, source, target, **kwargs)

    _everywhere(stack, budgets, "budget_settle_txn", settle_flagged)
    stack.enter_context(mock.patch.object(budgets, "_holds_move_txn", move_unless_settling))


def _lookup_skipped(stack: ExitStack) -> None:
    """A worker repeating a call whose earlier outcome went unconfirmed does not find what the
    receiver holds under the key (the lookup asks under another key): it acts again."""
    stack.enter_context(mock.patch.object(InventoryReserve, "lookup", lambda self, ctx: None))


def _child_unbooked(stack: ExitStack) -> None:
    """A child's ending never settles its allocation in its parent's ledger: the parent books
    none of what the child spent."""
    _everywhere(stack, budget_allocations, "child_settle_txn", lambda **kwargs: None)


def _saga_skips(stack: ExitStack) -> None:
    """The saga does not see that a reservation can be undone: it is left reserved."""
    real = compensation.compensable

    def compensable(op: Operation) -> bool:
        return op.tool != "demo.inventory.reserve" and real(op)

    _everywhere(stack, compensation, "compensable", compensable)


PLANTS: dict[str, Callable[[ExitStack], None]] = {
    "stale-accept": _stale_accept,
    "stop-unlocked": _stop_unlocked,
    "release-expired": _release_expired,
    "confirmed-widened": _confirmed_widened,
    "meter-dropped": _meter_dropped,
    "settle-keeps-hold": _settle_keeps_hold,
    "lookup-skipped": _lookup_skipped,
    "child-unbooked": _child_unbooked,
    "saga-skips": _saga_skips,
}


@contextmanager
def planted(names: list[str]) -> Iterator[None]:
    """Apply the named plants for the length of the block (none: nothing is patched)."""
    unknown = sorted(set(names) - set(PLANTS))
    if unknown:
        raise KeyError(f"no plant named {', '.join(unknown)}")
    with ExitStack() as stack:
        for name in names:
            PLANTS[name](stack)
        yield
