"""A short multi-process stress run: several worker processes, a sweeper with a tiny lease,
faults that kill and stall workers, and cancels and fails arriving at random while the work runs.
At the end: no deadlock in any process's log, no covered operation claimed after its task's stop
was accepted, and every receiver effect committed at most once per key."""

from __future__ import annotations

import contextlib
import random
from collections import Counter

import pytest

from runtime.cancellation import task_cancel, task_fail
from runtime.errors import TaskRefused
from runtime.models import Event, Operation
from runtime.sandbox.models import Charge, Notification, Reservation
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {
    "LEASE_SECONDS": 2,
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 1,
    "RETRY_BASE_SECONDS": 0.1,
    "RETRY_CAP_SECONDS": 0.5,
}

SHAPES = [
    ("demo.echo", {"_work_seconds": 0.3}),
    ("demo.echo", {"_fault": "transient:1"}),
    ("demo.payments.charge", {"account": "acct", "amount_cents": 500}),
    (
        "demo.payments.charge",
        {"account": "acct", "amount_cents": 700, "_fault": "crash_after_effect"},
    ),
    ("demo.inventory.reserve", {"sku": "s", "qty": 1}),
    ("demo.inventory.reserve", {"sku": "s", "qty": 2, "_fault": "stall_before_effect"}),
    ("demo.inventory.reserve", {"sku": "s", "qty": 3, "_fault": "unknown"}),
    ("demo.notify", {"to": "ops@example.com", "message": "hi"}),
]
LIVE = ("pending", "running", "retry_scheduled", "compensating")
# What the run must at least have done for its checks to mean anything (a run stops 8 tasks, of
# which some may end on their own first, and commits a few dozen effects).
MIN_STOPS = 4
MIN_STOPS_IN_FLIGHT = 2
MIN_EFFECTS = 2


def test_random_stops_against_racing_workers_keep_every_invariant(workers):
    rng = random.Random(20261202)
    pool = workers.start(count=3, concurrency=2, **FAST)
    beat = workers.start_beat(**FAST)
    agents = [factories.agent() for _ in range(3)]
    tasks = []
    for n in range(12):
        owner = agents[n % len(agents)]
        task = factories.task(owner, name=f"stress {n}", compensate_on=["cancelled", "failed"])
        tasks.append((owner, task))
        for step, (tool, params) in enumerate(rng.sample(SHAPES, 4)):
            factories.operation(owner, task, step=f"s{step}", tool=tool, params=dict(params))

    # Stop two thirds of the tasks at random moments while their work is in flight.
    stops = rng.sample(tasks, 8)
    accepted = 0
    for owner, task in stops:
        wait_for(
            lambda t=task: Event.objects.filter(task=t, type="operation.claimed").exists(),
            timeout=60,
            what="some work of the task to start",
        )
        stop = task_cancel if rng.random() < 0.5 else task_fail
        with contextlib.suppress(TaskRefused):  # the task may have ended on its own first
            stop(owner.actor, task.pk, "stress")
            accepted += 1

    def settled() -> bool:
        return not Operation.objects.filter(
            task__in=[t for _, t in tasks], status__in=LIVE
        ).exists()

    wait_for(settled, timeout=240, interval=0.5, what="every operation to settle")

    logs = "".join(w.log.read_text(errors="replace") for w in [*pool, beat])
    assert "deadlock detected" not in logs
    assert "IntegrityError" not in logs

    # The run stressed what it claims to: stops were accepted, several while work of their
    # task was running (a claim before the stop settled after it), and effects were committed.
    stopped = in_flight = 0
    for _, task in tasks:
        stop = (
            Event.objects.filter(task=task, type__in=("task.cancel_requested", "task.failed"))
            .order_by("seq")
            .first()
        )
        if stop is None:
            continue
        stopped += 1
        running = set(
            Event.objects.filter(task=task, type="operation.claimed", seq__lt=stop.seq).values_list(
                "operation_id", flat=True
            )
        )
        settled_after = set(
            Event.objects.filter(task=task, seq__gt=stop.seq, operation_id__in=running)
            .filter(data__has_key="to")
            .values_list("operation_id", flat=True)
        )
        in_flight += bool(settled_after)
        late = Event.objects.filter(
            task=task,
            type="operation.claimed",
            seq__gt=stop.seq,
            operation__compensates__isnull=True,
        )
        assert not late.exists(), f"claimed after the stop: {list(late.values('operation'))}"

    effects = {}
    for model in (Charge, Reservation, Notification):
        rows = model.objects.all()
        if model is Charge:
            rows = rows.filter(kind="charge")
        per_key = Counter(rows.values_list("key", flat=True))
        assert all(n == 1 for n in per_key.values()), (model.__name__, per_key.most_common(3))
        effects[model.__name__] = len(per_key)
    counts = {"stops": (accepted, stopped), "in flight": in_flight, "effects": effects}
    print(counts)
    assert accepted == stopped >= MIN_STOPS, counts
    assert in_flight >= MIN_STOPS_IN_FLIGHT, counts
    assert all(n >= MIN_EFFECTS for n in effects.values()), counts
