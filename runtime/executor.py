"""The worker's side of the path: claim under a new lease generation, run the tool adapter with
the operation's stable key and the generation as fencing token, report the result for fenced
acceptance. Duplicate or late deliveries find nothing to claim and do nothing. A claimed call of
a tool that waits is made in one of the process's slots (runtime.slots), the delivery returning
once it is claimed; every other call is made by the delivery itself."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from runtime.crashpoints import crash_point
from runtime.db import contention_retry
from runtime.drainers import (
    Registration,
    Taken,
    call_drained_singly,
    call_quick,
    drain_take,
    drain_wait,
    drainable_tools,
    drainer_wanted,
    draining_enabled,
)
from runtime.errors import StaleLease
from runtime.executions import execution_current
from runtime.logcontext import work_bound
from runtime.models import Operation
from runtime.outbox import outbox_continued, outbox_traces
from runtime.publish import DRAIN_QUEUE, publish
from runtime.slots import Slot, slot_reserve
from runtime.stopping import CancelWatch
from runtime.tool_invocation import tool_invoke
from runtime.tools.base import adapters, waits
from runtime.tracing import annotate, continued, span, work_span
from runtime.transitions.accept import lease_report
from runtime.transitions.accept_batch import operations_report_batch
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import claim_refused_record, operation_claim
from runtime.transitions.claim_batch import operations_claim_batch
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.handover import operation_report_and_claim
from runtime.transitions.lease import Lease

log = logging.getLogger(__name__)
Trace = dict[str, Any] | None  # a stored trace context (runtime.tracing.carrier)


@dataclass(frozen=True)
class Delivery:
    """What one delivery did: its outcome, and whether the call it claimed was one a drainer
    may take (quick, or run one at a time): only such a delivery looks for a backlog to drain;
    and whether it was quick (a drainer it starts waits for proposals: runtime.executor._drain)."""

    outcome: str
    drainable: bool = False
    quick: bool = False


def operation_execute(operation_id: str) -> str:
    """Run one delivery of an operation; returns what happened, for logs and tests."""
    return operation_deliver(operation_id).outcome


def operation_deliver(operation_id: str) -> Delivery:
    """Run one delivery of an operation (claim, invoke, report). Preconditions: no transaction
    open."""
    execution_id = execution_current()
    # Every log line about this delivery carries its ids (runtime.logcontext), and its spans
    # continue the proposal's trace (runtime.tracing).
    with (
        work_bound(operation_id=operation_id, execution_id=execution_id),
        outbox_continued(operation_id),
    ):
        return _execute(operation_id, execution_id)


# A delivery that handed its claimed call to a slot (runtime.slots): it reports there.
IN_SLOT = "in_slot"


def _execute(operation_id: str, execution_id: str) -> Delivery:
    lease = _leased(operation_id, execution_id, _claim(operation_id, execution_id))
    if lease is None:
        return Delivery("nothing_to_claim")
    op = lease.operation
    adapter = adapters().get(op.tool)
    if adapter is not None and waits(adapter):
        # A call that waits: into a free slot of this process, if it has one; otherwise (no
        # slots here, or all taken) made here as any call, so the process takes no more work.
        slot = slot_reserve()
        if slot is not None and slot.run(_run_in_slot, execution_id, lease, slot):
            return Delivery(IN_SLOT)
    with work_bound(op):
        outcome = _run_claimed(operation_id, execution_id, lease)
    quick = call_quick(op.tool, op.params)
    drainable = quick or call_drained_singly(op.tool, op.kind)
    return Delivery(outcome, drainable=drainable, quick=quick)


def _claim(operation_id: str, execution_id: str) -> Lease | Refusal:
    with span("operation.claim", operation_id=operation_id, execution_id=execution_id) as current:
        claim = contention_retry(lambda: operation_claim(operation_id, execution_id=execution_id))
        if current is None:
            return claim  # tracing off
        if isinstance(claim, Refusal):
            annotate(current, refused=claim.reason)
        else:
            annotate(
                current,
                task_id=claim.operation.task_id,
                lease_generation=claim.lease_generation,
                invocation_number=claim.invocation_number,
            )
        return claim


def _leased(operation_id: str, execution_id: str, claim: Lease | Refusal) -> Lease | None:
    """The lease a claim took, or None after recording why there was nothing to claim."""
    if isinstance(claim, Refusal):
        if claim.operation_exists:
            claim_refused_record(operation_id, execution_id, claim.reason)
        log.debug("nothing to claim: %s", claim.reason)
        return None
    return claim


def _run_claimed(operation_id: str, execution_id: str, lease: Lease) -> str:
    return _report(execution_id, lease, _invoke_watched(lease))


def _run_in_slot(execution_id: str, lease: Lease, slot: Slot) -> None:
    """A slot's call: made under its cancel watch and reported fenced, as a delivery's; a call
    that ignores its cancel is settled and abandoned, not its process ended (runtime.slots)."""
    with work_bound(lease.operation, execution_id=execution_id):
        _report(execution_id, lease, _invoke_watched(lease, terminate=slot.abandon))


def _invoke_watched(
    lease: Lease, terminate: Callable[[], None] | None = None, trace: Trace = None
) -> Report:
    """Make the claimed call under a cancel watch (a call that ignores a cancel past the grace
    period is ended by this worker: Limits; ``terminate`` is how, after it settled the call:
    by default this process ends)."""
    with CancelWatch(
        operation_id=lease.operation_id,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        terminate=terminate,
    ):
        return _invoke(lease.operation, lease, trace)


def _report(execution_id: str, lease: Lease, report: Report) -> str:
    operation_id = lease.operation_id
    try:
        with work_span(
            "operation.accept", lease, execution_id=execution_id, outcome=report.outcome
        ):
            lease_report(lease, report, execution_id=execution_id)
    except StaleLease:
        log.info(
            "late result for %s under generation %s rejected", operation_id, lease.lease_generation
        )
        return "rejected"
    log.debug("operation %s reported %s", operation_id, report.outcome)
    return report.outcome


def queue_drain(queue: str, *, asked: bool = False, patient: bool = True) -> int:
    """Drain ``queue`` (runtime.drainers) while proposals come, for up to DRAIN_SECONDS: its
    quick calls in batches, its other calls one at a time through the one-operation path, none
    of them with a Celery message of its own; returns how many calls were run.

    The worker asks after the delivery of a call a drainer may take (runtime.worker); it starts
    draining only when DRAIN_BACKLOG messages or more wait for the queue and fewer than
    DRAINERS_PER_QUEUE (1) drain it (or when ``asked``: a ``runtime.drain_queue`` message). A
    drainer asks for a helper once its batches come back full or calls wait on its list of
    single calls. On the way out it leaves the registry first and then takes what its lists
    still hold. Unless ``patient`` (or asked), a drainer that sees no proposal within
    DRAIN_INTERVAL_SECONDS leaves at once and its process does not try again for ten
    DRAIN_IDLE_SECONDS: the backlog it saw is messages (a held backlog released), which its
    worker takes faster than a drainer waiting for proposals that do not come.

    Preconditions: in a worker process, no transaction open. Nothing happens where batches are
    off (``drainers.draining_enabled``: the embedded mode, or DRAIN_BATCH=0)."""
    if not draining_enabled():
        return 0
    if not asked and time.monotonic() < _quiet_until.get(queue, 0.0):
        return 0
    if not (asked or drainer_wanted(queue)):
        return 0
    execution_id = execution_current()
    with work_bound(execution_id=execution_id):
        # The cap is checked again as the drainer joins, in one step with its entry.
        cap = None if asked else int(settings.DRAINERS_PER_QUEUE)
        patient = patient or asked
        ran = _drain(queue, drainable_tools(queue), execution_id, cap, patient=patient)
    if ran == 0 and not patient:
        # A backlog of messages and no proposal arriving (a held backlog released): this worker
        # takes the messages, and does not look for proposals again for a while.
        _quiet_until[queue] = time.monotonic() + 10 * float(settings.DRAIN_IDLE_SECONDS)
    return ran


# Per queue, until when this process does not try to drain it (queue_drain).
_quiet_until: dict[str, float] = {}


def _drain(
    queue: str, tools: list[str], execution_id: str, cap: int | None, *, patient: bool
) -> int:
    """``patient``: wait DRAIN_IDLE_SECONDS for a first proposal (a drainer asked for);
    otherwise a drainer that finds none within DRAIN_INTERVAL_SECONDS leaves at once (the
    backlog it saw is messages, which it takes faster as a worker)."""
    registration = Registration(queue)
    if not registration.join(cap):
        return 0
    ran = 0
    limit = int(settings.DRAIN_BATCH)
    interval = float(settings.DRAIN_INTERVAL_SECONDS)
    stop_at = time.monotonic() + float(settings.DRAIN_SECONDS)
    helped = False
    idle_since: float | None = None
    singles = _Singles(execution_id)
    try:
        while registration.registered:
            taken_at = time.monotonic()
            taken = drain_take(queue, limit)
            ran += _drain_taken(taken, tools, singles)
            ids, single = taken.batch, taken.single
            if not ids and single is None:
                # A moment without proposals does not end the session: leaving makes the next
                # proposals publish messages again, and coming back costs a backlog.
                idle_since = idle_since or taken_at
                if _idle_over(taken_at - idle_since, patient or ran > 0, taken_at >= stop_at):
                    break
                registration.renew_due()
                # Woken by the next id as it arrives (no sleep to wait out: a call run alone
                # is taken at once, as its Celery message would have been).
                drain_wait(queue, interval)
                continue
            idle_since = None
            if time.monotonic() >= stop_at:
                # Out of time with work left: another turn for this queue, after what waits
                # before it; it takes what is left on the lists.
                singles.settle()
                registration.leave()
                _drain_again(queue)
                return ran
            registration.renew_due()
            if (len(ids) == limit or taken.singles_left > 0) and not helped:
                # A helper for a backlog this drainer cannot keep up with: a full batch, or a
                # call run alone waiting behind the one it runs (while it is registered the
                # other workers get no message for those calls).
                _drain_again(queue)
                helped = True
            if len(ids) < limit and single is None:
                # Proposals arrive slower than this drainer runs them: the next batch is taken
                # no sooner than an interval after this one, so it gathers instead of the
                # drainer claiming one call per transaction (a batch that took longer than the
                # interval is followed at once: no latency is added under load).
                time.sleep(max(0.0, taken_at + interval - time.monotonic()))
        return ran + _drain_leaving(registration, queue, limit, tools, singles)
    finally:
        registration.leave()


def _drain_taken(taken: Taken, tools: list[str], singles: _Singles) -> int:
    """Run what one look at the lists took: its quick calls in a batch, then its call run alone;
    returns how many calls were run."""
    if taken.batch or taken.single is None:
        # No call to hand over to, or quick calls first: the call made is reported now.
        singles.settle()
    ran = _drain_batch(taken.batch, tools, singles.execution_id)
    if taken.single is not None:
        singles.run(taken.single)
        ran += 1
    return ran


def _idle_over(idle_for: float, patient: bool, out_of_time: bool) -> bool:
    """Whether a drainer that has seen no proposal for ``idle_for`` seconds leaves: after
    DRAIN_IDLE_SECONDS when ``patient`` (asked for, or it ran calls), after
    DRAIN_INTERVAL_SECONDS otherwise, and at once when out of time."""
    wait = settings.DRAIN_IDLE_SECONDS if patient else settings.DRAIN_INTERVAL_SECONDS
    return idle_for >= float(wait) or out_of_time


def _drain_leaving(
    registration: Registration, queue: str, limit: int, tools: list[str], singles: _Singles
) -> int:
    """Leave first, then take what was left to this drainer until then (runtime.drainers)."""
    crash_point("drain.leaving")
    registration.leave()
    ran = 0
    while (taken := drain_take(queue, limit)).batch or taken.single is not None:
        ran += _drain_taken(taken, tools, singles)
    singles.settle()
    return ran


class _Singles:
    """A drainer's calls run alone, each through the one-operation path's writers: claimed
    under its own lease, made under its cancel watch, accepted fenced. The call just made is
    reported when the drainer takes the next one, and its acceptance and that call's claim
    share one transaction (operations.operation_report_and_claim): a commit per call instead of
    two under a backlog. Nothing waits for a next call: a look at the lists that finds none, or
    finds quick calls, reports the call at once (``settle``)."""

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.pending: tuple[Lease, Report] | None = None

    def run(self, operation_id: str) -> None:
        """Claim ``operation_id`` (with the acceptance of the call made before it, if any) and
        make the call; its report waits for the next call or ``settle``."""
        execution_id = self.execution_id
        # The call's own trace (it came with no message), read before the claim spends its row.
        trace = outbox_traces([operation_id]).get(operation_id)
        with work_bound(operation_id=operation_id, execution_id=execution_id):
            if self.pending is None:
                with continued(trace):
                    claim = _claim(operation_id, execution_id)
            else:
                made, report = self.pending
                self.pending = None
                accepted, claim = operation_report_and_claim(
                    made, report, operation_id, execution_id=execution_id
                )
                if accepted is None:
                    log.info("late result for %s rejected", made.operation_id)
            lease = _leased(operation_id, execution_id, claim)
            if lease is not None:
                with work_bound(lease.operation):
                    self.pending = (lease, _invoke_watched(lease, trace=trace))

    def settle(self) -> None:
        """Report the call made, alone (no next call to hand over to)."""
        if self.pending is not None:
            made, report = self.pending
            self.pending = None
            with work_bound(made.operation, execution_id=self.execution_id):
                _report(self.execution_id, made, report)


def _drain_batch(ids: list[str], tools: list[str], execution_id: str) -> int:
    if not ids:
        return 0
    traces = outbox_traces(ids)  # each call's own trace (none of them came with a message)
    batch = contention_retry(lambda: operations_claim_batch(ids, tools, execution_id=execution_id))
    if batch.leases:
        crash_point("drain.after_claim")
        # Quick calls only: each is made in turn, without a cancel watch (a cancel requested
        # meanwhile is settled by the acceptance, which finds the task stopping).
        reports = [
            (lease.operation, _invoke(lease.operation, lease, traces.get(lease.operation_id)))
            for lease in batch.leases
        ]
        operations_report_batch(
            reports, lease_token=batch.leases[0].lease_token, execution_id=execution_id
        )
    for operation_id in batch.handed_back:
        operation_execute(operation_id)
    return len(ids)


def _drain_again(queue: str) -> None:
    try:
        publish(DRAIN_QUEUE, queue, queue=queue)
    except Exception:
        # Nothing is lost: the announcements stay for the sweeper.
        log.warning("could not hand %s's backlog on", queue, exc_info=True)


def _invoke(op: Operation, lease: Lease, trace: Trace = None) -> Report:
    """Run the adapter outside any transaction: the receiver's commit is its own; ``trace``:
    the one the call continues when it is not the current one (a drainer's call)."""
    with (
        work_bound(op),
        continued(trace),
        work_span(
            "operation.tool_call", lease, tool=op.tool, tool_version=op.tool_version
        ) as current,
    ):
        report = tool_invoke(op, lease)
        annotate(current, outcome=report.outcome, error_kind=report.error_kind or None)
        return report
