"""The cancel watch beside a worker-run call (runtime.stopping.CancelWatch): one thread per
process makes every call's looks, kept from call to call; a call whose block was left is never
acted for afterwards, and leaving waits for a look in flight. (The watch ending a real worker's
hung call: tests/runtime/test_admission_and_stopping.py.)"""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from runtime import stopping
from runtime.cancellation import task_cancel
from runtime.executions import execution_for_agent
from runtime.models import Operation
from runtime.rules.statuses import OperationStatus as S
from runtime.stopping import CancelWatch
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories
from tests.concurrency import in_thread
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def quick_grace(settings) -> None:
    settings.CANCEL_GRACE_SECONDS = 0.4  # looks every 0.1 s


def _running() -> tuple[factories.Principal, Operation, Lease]:
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.slow", params={"seconds": 0})
    lease = operation_claim(op.pk, execution_id=execution_for_agent("watch-test").pk)
    assert isinstance(lease, Lease)
    return owner, op, lease


def _watch(lease: Lease, ended: list[str]) -> CancelWatch:
    return CancelWatch(
        operation_id=lease.operation_id,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        terminate=lambda: ended.append(lease.operation_id),
    )


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cancel-watch"]


def test_one_thread_makes_the_looks_of_every_call_of_a_process(quick_grace):
    _, _, lease = _running()
    seen: list[threading.Thread] = []  # the objects themselves: an ident can be reused
    for _ in range(5):
        with _watch(lease, []):
            seen.extend(_watch_threads())
    assert len(seen) == 5 and all(t is seen[0] for t in seen)
    assert _watch_threads() == [seen[0]]


def test_a_call_that_ignores_its_cancel_is_ended_after_the_grace(quick_grace):
    owner, op, lease = _running()
    ended: list[str] = []
    with _watch(lease, ended):
        task_cancel(owner.actor, op.task_id)
        wait_for(lambda: ended == [op.pk], timeout=30, what="the watch to end the call")
    op.refresh_from_db()
    assert op.status == S.CANCELLED and op.error["kind"] == "terminated"


def test_a_call_whose_block_was_left_is_never_acted_for(quick_grace):
    owner, op, lease = _running()
    ended: list[str] = []
    with _watch(lease, ended):
        pass
    task_cancel(owner.actor, op.task_id)
    # A second watch (of the same running call) sees the cancel and ends it after the grace:
    # by then the first watch, had it still been kept, would have acted too.
    second: list[str] = []
    with _watch(lease, second):
        wait_for(lambda: second == [op.pk], timeout=30, what="the second watch to act")
    assert ended == []


def test_leaving_waits_for_a_look_in_flight(quick_grace, monkeypatch):
    _, _, lease = _running()
    looking, release = threading.Event(), threading.Event()
    order: list[str] = []
    real = stopping.cancel_seen

    def held(*args: Any) -> bool:
        looking.set()
        release.wait(30)
        order.append("look done")
        return real(*args)

    monkeypatch.setattr(stopping, "cancel_seen", held)
    watch = _watch(lease, [])
    watch.__enter__()
    assert looking.wait(30), "the watcher made no look"

    def leave() -> None:
        watch.__exit__(None, None, None)
        order.append("left")

    thread, left = in_thread(leave, "leave")
    # The leaving thread is inside the watcher's end(), waiting for the lock the look holds.
    wait_for(
        lambda: any(
            frame.f_code.co_name == "end"
            for ident, frame in sys._current_frames().items()
            if ident == thread.ident
        ),
        timeout=30,
        what="the leaving thread to wait in end()",
    )
    assert order == []
    release.set()
    left.result(timeout=30)
    assert order == ["look done", "left"]
