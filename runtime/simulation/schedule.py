"""A schedule: the list of abstract steps drawn from the seed before anything runs. Each step is
an action, two numbers that pick its subject and variant (modulo what exists when the step runs)
and a fault. The same seed is the same schedule, byte for byte, and a schedule with steps removed
is still a schedule (the shrinker replays such sublists)."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

# Action -> weight. The weights put the steps where the risk is: work in flight (claims, calls,
# reports, a claim and its call in one step), takeovers between a call and its report, stops
# and expiries next to running or unconfirmed calls, people deciding and resolving, checks that
# can pass (an artifact delivered, accepted and checked in one step), children and their
# parents. Plain ticks and sweeps stay, so time also passes with nothing aimed at it.
ACTIONS: dict[str, int] = {
    "propose": 16,
    "claim": 8,
    "claim_batch": 3,
    "call": 9,
    "work": 7,
    "report": 16,
    "heartbeat": 2,
    "stall": 3,
    "late": 4,
    "takeover": 4,
    "tick": 3,
    "sweep": 4,
    "expire": 3,
    "cancel": 1,
    "pause": 1,
    "resume": 3,
    "fail": 1,
    "stop_live": 2,
    "complete": 2,
    "decide": 6,
    "edit": 1,
    "demote": 2,
    "upgrade": 1,
    "renew": 2,
    "resolve": 3,
    "new_task": 3,
    "new_attempt": 1,
    "child": 2,
    "signal": 3,
    "wake": 2,
    "wait_admin": 1,
    "upload": 2,
    "accept": 2,
    "checks": 1,
    "deliver": 3,
    "agent_claim": 3,
    "agent_report": 3,
}
FAULTS = ("none",) * 8 + ("crash", "lost")

# Where a step's process stops before its commit (the crash fault), per action.
CRASH_POINTS: dict[str, tuple[str, ...]] = {
    "report": ("report.before_commit", "report.batch_before_commit"),
    "late": ("report.before_commit",),
    "claim": ("claim.approval_released", "claim.after_read"),
    "work": ("claim.approval_released", "claim.after_read"),
    "claim_batch": ("claim.batch_before_commit",),
    "sweep": ("sweep.after_read", "approval.expire_locked"),
    "expire": ("sweep.after_read", "approval.expire_locked"),
    "cancel": ("cancel.after_lock", "rest.after_read"),
    "fail": ("cancel.after_lock", "rest.after_read"),
    "stop_live": ("cancel.after_lock", "rest.after_read", "control.applied"),
    "pause": ("control.applied",),
    "resume": ("control.applied",),
    "complete": ("complete.before_commit",),
    "decide": ("approval.before_commit",),
    "new_attempt": ("attempt.before_commit",),
    "resolve": ("resolve.before_lock",),
    "signal": ("signal.task_locked",),
    "propose": ("wait.registered", "wait.before_register"),
    "upload": ("artifact.after_put",),
    "accept": ("artifact.accept_before_commit",),
    "deliver": ("artifact.after_put", "artifact.accept_before_commit"),
    "agent_claim": ("claim.after_read",),
    "agent_report": ("report.before_commit",),
}


@dataclass(frozen=True)
class Step:
    action: str
    a: int
    b: int
    fault: str

    def as_list(self) -> list[Any]:
        return [self.action, self.a, self.b, self.fault]


def schedule_for(seed: int, steps: int) -> list[Step]:
    rng = random.Random(seed)
    names, weights = list(ACTIONS), list(ACTIONS.values())
    return [
        Step(
            rng.choices(names, weights)[0],
            rng.randrange(1 << 16),
            rng.randrange(1 << 16),
            rng.choice(FAULTS),
        )
        for _ in range(steps)
    ]


def schedule_digest(schedule: list[Step]) -> str:
    text = json.dumps([s.as_list() for s in schedule], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Violation(Exception):
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


class SimCrash(Exception):
    """The step's process stopped at a named crash point (before its commit)."""
