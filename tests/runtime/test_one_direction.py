"""An operation's id followed from its execution enters each room once, in one direction (issue
35): the worker's executor enters the claim once and the acceptance once, and no call climbs
from a lower layer of ``tests.layers.LAYERS`` back into a higher one, except a callback the
higher one handed down (a ``lambda`` or a local function: the retry of a contended statement,
the facts a rule asks for only when it needs them). Traced with ``sys.setprofile`` over a real
execution, on the one-statement path (PostgreSQL) and the general one."""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any, NamedTuple

import pytest

from runtime.executor import operation_execute
from runtime.models import Operation
from tests import factories
from tests.layers import layer_of

pytestmark = pytest.mark.django_db


class Call(NamedTuple):
    caller: str
    callee: str
    function: str
    handed_down: bool  # a lambda or a local function: a callback, not a climb


def _traced(operation_id: str) -> list[Call]:
    calls: list[Call] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "")
        if caller == callee or not (
            caller.startswith("runtime.") and callee.startswith("runtime.")
        ):
            return
        if callee.startswith("runtime.models") or caller.startswith("runtime.models"):
            return  # the models are the bottom; Django calls back into them from anywhere
        code = frame.f_code
        handed = code.co_name == "<lambda>" or "<locals>" in code.co_qualname
        calls.append(Call(caller, callee, code.co_qualname, handed))

    sys.setprofile(profile)
    try:
        operation_execute(operation_id)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize(
    ("tool", "params"),
    [
        ("demo.echo", {"x": 1}),  # the common case: the one-statement forms where they run
        ("demo.payments.charge", {"account": "a", "amount_cents": 5}),  # the general writers
    ],
)
def test_an_execution_enters_the_claim_and_the_acceptance_once_and_never_climbs(tool, params):
    owner = factories.agent()
    task = factories.task(owner, "rooms")
    op = factories.operation(owner, task, tool=tool, params=params)
    calls = _traced(op.pk)
    assert Operation.objects.get(pk=op.pk).status == "succeeded"

    climbs = [c for c in calls if not c.handed_down and layer_of(c.callee) > layer_of(c.caller)]
    assert climbs == [], climbs
    entered = Counter(c.callee for c in calls if not c.handed_down and c.caller != c.callee)
    transitions = {m: n for m, n in entered.items() if m.startswith("runtime.transitions.")}
    assert transitions.get("runtime.transitions.claim") == 1, transitions
    assert transitions.get("runtime.transitions.accept") == 1, transitions
    # Each room the executor hands the operation to, it hands it to once.
    from_executor = Counter(
        c.callee for c in calls if c.caller == "runtime.executor" and not c.handed_down
    )
    assert from_executor["runtime.transitions.claim"] == 1
    assert from_executor["runtime.transitions.accept"] == 1
    assert from_executor["runtime.tool_invocation"] == 1
