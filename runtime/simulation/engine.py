"""Running a schedule (docs/simulation.md): an emptied database, the fake clock, the world's
steps, the oracles after every step and over everything at the end; and the shrinker.

The schedule, the world and the oracles are in runtime.simulation.schedule, .world/.actions
and .oracles; this module re-exports what the command and the tests use."""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.test.utils import override_settings

from runtime import budgets
from runtime.simulation.actions import World
from runtime.simulation.clock import FakeClock, simulated_clock
from runtime.simulation.oracles import INVARIANTS, Oracles
from runtime.simulation.plants import PLANTS, planted
from runtime.simulation.schedule import (
    ACTIONS,
    Step,
    Violation,
    schedule_digest,
    schedule_for,
)

__all__ = [
    "ACTIONS",
    "INVARIANTS",
    "PLANTS",
    "Outcome",
    "Step",
    "Violation",
    "reset_database",
    "run",
    "schedule_digest",
    "schedule_for",
    "shrink",
]


@dataclass
class Outcome:
    steps: int
    checks: int
    violation: Violation | None = None
    failed_at: int | None = None  # index into the schedule
    trace: list[str] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)
    # machine -> the (from, to) pairs its journal shows were driven (runtime.simulation.edges)
    edges: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    seconds: float = 0.0

    def trace_digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()


_TABLES: list[str] = []


def reset_database() -> None:
    """Empty every table the simulation may have written (the schema stays) and the process
    caches keyed by ids, which replay.

    Rows are deleted, in one transaction, from the tables that hold any (one query finds them):
    the foreign keys are checked at the commit, when every table is empty. A TRUNCATE of every
    table, as Django's flush does, gives each one a new file on PostgreSQL: 1-2 s per run, which
    the shrinker pays for every candidate it replays; the deletes cost what the run wrote."""
    if not _TABLES:
        _TABLES.extend(
            connection.introspection.django_table_names(only_existing=True, include_views=False)
        )
    quote = connection.ops.quote_name
    probe = " UNION ALL ".join(
        f"SELECT {i} FROM (SELECT 1 FROM {quote(t)} LIMIT 1) AS t{i}"  # noqa: S608 (our tables)
        for i, t in enumerate(_TABLES)
    )
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(probe)
        used = [_TABLES[row[0]] for row in cur.fetchall()]
        for table in used:
            cur.execute(f"DELETE FROM {quote(table)}")  # noqa: S608 (a table name of ours)
    budgets._BUDGETS.clear()


def run(
    seed: int, schedule: list[Step], *, record: bool = True, plants: list[str] | None = None
) -> Outcome:
    """Replay ``schedule`` on an emptied database, with ``plants`` applied; stop at the first
    broken invariant (the world's checks as it acts, the oracles after every step and over
    everything at the end). An unexpected exception from a service (what would be a 500) is a
    failure too."""
    started = time.monotonic()
    reset_database()
    clock = FakeClock(seed)
    # The world's people sign in with passwords nobody types: a fast hash saves a second a run.
    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    with fast, planted(plants or []), simulated_clock(clock):
        world = World(seed, clock)
        oracles = Oracles(world.facts, world.tasks, world.valid, world.timer_due)

        def outcome(index: int, broken: Violation | None) -> Outcome:
            return Outcome(
                index,
                world.checks + oracles.checks,
                broken,
                None if broken is None else index - 1,
                world.trace,
                world.coverage() if broken is None else {},
                oracles.edges.edges,
                time.monotonic() - started,
            )

        for index, step in enumerate(schedule):
            try:
                note = world.step(index, step)
                oracles.after_step()
            except Violation as broken:
                return outcome(index + 1, broken)
            except Exception as exc:  # a service crashed (a 500): that is a finding
                crash = Violation("no-unexpected-error", f"{step.action}: {exc!r}"[:500])
                return outcome(index + 1, crash)
            if record:
                world.trace.append(f"{index} {step.action} {note}")
        try:
            oracles.full()
        except Violation as broken:
            return outcome(len(schedule), broken)
        return outcome(len(schedule), None)


# A trace line of a step that did nothing: "<index> <action> [<fallback>: ...]nothing|refused".
_IDLE = re.compile(r"^\d+ \w+ (\w+: )*(nothing|refused|enough)")


def shrink(
    seed: int,
    schedule: list[Step],
    outcome: Outcome,
    *,
    seconds: float,
    plants: list[str] | None = None,
) -> list[Step]:
    """Delta debugging (ddmin) over the recorded steps: the shortest sublist found within
    ``seconds`` that still breaks the same invariant."""
    assert outcome.violation is not None and outcome.failed_at is not None
    name = outcome.violation.invariant
    deadline = time.monotonic() + seconds

    def fails(candidate: list[Step]) -> bool:
        result = run(seed, candidate, record=False, plants=plants)
        return result.violation is not None and result.violation.invariant == name

    current = schedule[: outcome.failed_at + 1]
    # First drop, at once, the steps that found nothing to do or were refused.
    idle = {int(line.split(" ", 1)[0]) for line in outcome.trace if _IDLE.match(line)}
    candidate = [s for i, s in enumerate(current) if i not in idle]
    if len(candidate) < len(current) and fails(candidate):
        current = candidate
    n = 2
    while len(current) >= 2 and time.monotonic() < deadline:
        size = max(1, len(current) // n)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        reduced = False
        for i in range(len(chunks)):
            if time.monotonic() >= deadline:
                break
            candidate = [s for j, c in enumerate(chunks) if j != i for s in c]
            if candidate and fails(candidate):
                current, n, reduced = candidate, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), n * 2)
    return current


def vendor() -> str:
    return connection.vendor
