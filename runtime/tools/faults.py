"""Fault knobs of the demo tools (``"_fault"`` in params), so recovery is exercised for real: a
crash ends the worker process with ``os._exit``, exactly as a killed worker would."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from runtime.crashpoints import install_crash_action
from runtime.errors import InvalidInput
from runtime.models import Invocation
from runtime.tools.base import InvocationContext, ToolFailure

KNOBS = (
    "permanent",
    "crash_before_effect",
    "crash_after_effect",
    "hang",
    "unknown",
    "stall_before_effect",
    "error_after_effect",
    "crash_before_accept",
    "crash_after_accept",
)


@dataclass(frozen=True)
class Fault:
    kind: str = ""
    count: int = 0

    def active(self, ctx: InvocationContext) -> bool:
        if not self.kind:
            return False
        if self.kind == "transient":
            return ctx.invocation_number <= self.count
        if self.kind == "permanent":
            return True
        # The remaining knobs strike on the first invocation only.
        return ctx.invocation_number == 1


def fault_parse(params: dict[str, object]) -> Fault:
    work_seconds(params)
    raw = params.get("_fault")
    if raw in (None, ""):
        return Fault()
    if not isinstance(raw, str):
        raise InvalidInput("_fault must be a string")
    if raw.startswith("transient:"):
        try:
            count = int(raw.split(":", 1)[1])
        except ValueError:
            raise InvalidInput("_fault transient:N needs a whole number N") from None
        if count < 0:
            raise InvalidInput("_fault transient:N needs N >= 0")
        return Fault("transient", count)
    if raw not in KNOBS:
        raise InvalidInput(f"unknown _fault {raw!r}")
    return Fault(raw)


MAX_WORK_SECONDS = 600


def work_seconds(params: dict[str, object]) -> float:
    """``"_work_seconds": N`` makes a demo tool take N seconds, heartbeating its lease."""
    raw = params.get("_work_seconds", 0)
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | float)
        or not 0 <= raw <= MAX_WORK_SECONDS
    ):
        raise InvalidInput(f"_work_seconds must be a number from 0 to {MAX_WORK_SECONDS}")
    return float(raw)


def work(ctx: InvocationContext) -> None:
    """Long-running work that keeps its lease: heartbeat (under its own generation) at a third
    of the lease, and stop early when told the work was cancelled or the lease was lost."""
    remaining = work_seconds(ctx.params)
    step = max(0.2, settings.LEASE_SECONDS / 3)
    while remaining > 0:
        pause = min(step, remaining)
        time.sleep(pause)
        remaining -= pause
        if ctx.heartbeat():
            raise ToolFailure(ToolFailure.TRANSIENT, "stopped: cancelled or lease lost")


def before_effect(ctx: InvocationContext) -> Fault:
    """Apply the knobs that strike before the receiver is reached; return the fault for the
    after-effect phase."""
    fault = fault_parse(ctx.params)
    if not fault.active(ctx):
        return fault
    if fault.kind == "transient":
        raise ToolFailure(
            ToolFailure.TRANSIENT, f"injected transient failure #{ctx.invocation_number}"
        )
    if fault.kind == "permanent":
        raise ToolFailure(ToolFailure.PERMANENT, "injected permanent failure")
    if fault.kind == "crash_before_effect":
        os._exit(137)
    if fault.kind == "stall_before_effect":
        _stall_until_taken_over(ctx)
    return fault


def _stall_until_taken_over(ctx: InvocationContext) -> None:
    """A worker that stalls before reaching the receiver (a long GC pause, a frozen VM) and wakes
    after its lease was taken over and the new holder finished: without heartbeating, wait until
    a newer generation's invocation has an outcome, then go on to the receiver as if nothing
    happened. Bounded, so a misconfigured test cannot hang a worker forever."""
    limit = time.monotonic() + settings.LEASE_SECONDS * 20 + 30
    while time.monotonic() < limit:
        if Invocation.objects.filter(
            operation_id=ctx.operation_id,
            lease_generation__gt=ctx.fencing_token,
            outcome__isnull=False,
        ).exists():
            return
        time.sleep(0.1)


def after_effect(ctx: InvocationContext, fault: Fault) -> None:
    """Apply the knobs that strike after the receiver committed."""
    if not fault.active(ctx):
        return
    if fault.kind == "crash_after_effect":
        os._exit(137)
    if fault.kind == "unknown":
        raise ToolFailure(ToolFailure.UNKNOWN, "injected lost response after the effect")
    if fault.kind == "error_after_effect":
        # Not a classified failure: an adapter bug striking after the receiver committed.
        raise RuntimeError("injected unexpected error after the effect")
    if fault.kind in ("crash_before_accept", "crash_after_accept"):
        _crash_at_acceptance(committed=fault.kind == "crash_after_accept")
    if fault.kind == "hang":
        # Block past the lease's expiry (without heartbeating), then try to complete late.
        time.sleep(settings.LEASE_SECONDS * 2 + 1)


def _exit_as_killed() -> None:
    os._exit(137)


def _crash_at_acceptance(*, committed: bool) -> None:
    """End this worker process, as a kill would, at the acceptance of the result it is about to
    report: with the acceptance written but not committed (it rolls back: the lease expires and
    a newer generation recovers by the receiver's contract), or just after its commit, before
    the worker acknowledged its message (the redelivery finds the work accepted)."""

    def at_acceptance() -> None:
        if committed:
            transaction.on_commit(_exit_as_killed)
        else:
            _exit_as_killed()

    install_crash_action("report.before_commit", at_acceptance)
    install_crash_action("report.batch_before_commit", at_acceptance)
