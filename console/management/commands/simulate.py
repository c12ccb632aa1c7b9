"""``manage.py simulate``: the seeded simulation (runtime.simulation; docs/simulation.md) on the
configured database, which it creates (PostgreSQL) and migrates first. ``make simulate``.

With ``--catch-rate N`` it runs every plant (or those ``--plant`` names) over N seeds drawn at
random (or ``--seeds``), each against the same seed without a plant, and prints the table of
docs/simulation.md, "Catch rates"."""

from __future__ import annotations

import json
import logging
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from runtime.simulation.engine import (
    PLANTS,
    Outcome,
    Step,
    run,
    schedule_digest,
    schedule_for,
    shrink,
)


def _database_ensure() -> None:
    """Create the configured PostgreSQL database when it does not exist (the simulation's
    own, never the suite's or the console's)."""
    db = settings.DATABASES["default"]
    if "postgresql" not in str(db["ENGINE"]):
        return
    conninfo = psycopg.conninfo.make_conninfo(
        host=str(db.get("HOST") or "127.0.0.1"),
        port=str(db.get("PORT") or 5432),
        user=str(db.get("USER") or "postgres"),
        dbname="postgres",
        **({"password": str(db["PASSWORD"])} if db.get("PASSWORD") else {}),
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if found.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def _speed(outcome: Outcome, cpu: float) -> str:
    rate = outcome.steps / outcome.seconds if outcome.seconds else 0.0
    return (
        f"time {outcome.seconds:.1f} s, {rate:.1f} steps/s "
        f"(this process's CPU {cpu:.1f} s, {1000 * cpu / max(1, outcome.steps):.0f} ms a step)"
    )


class Command(BaseCommand):
    help = "Run the seeded simulation; exit 1 when an invariant breaks."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--steps", type=int, default=1000)
        parser.add_argument("--plant", default="", help=f"one of {', '.join(PLANTS)}")
        parser.add_argument("--shrink-seconds", type=float, default=120.0)
        parser.add_argument("--schedule", default="", help="replay this saved schedule (JSON)")
        parser.add_argument("--trace", action="store_true", help="print every step")
        parser.add_argument(
            "--catch-rate",
            type=int,
            default=0,
            help="run each plant over this many random seeds and print its catch rate",
        )
        parser.add_argument("--seeds", default="", help="the catch rate's seeds (comma-separated)")

    def handle(self, *args: Any, **opts: Any) -> None:
        # The journal's line per transition (runtime.journal) is for operators; a run makes
        # tens of thousands, and its own trace (--trace) says what each step did.
        logging.getLogger("runtime.journal").setLevel(logging.WARNING)
        plants = [p for p in opts["plant"].split(",") if p]
        unknown = set(plants) - set(PLANTS)
        if unknown:
            raise CommandError(f"no plant named {', '.join(sorted(unknown))}")
        _database_ensure()
        call_command("migrate", interactive=False, verbosity=0)
        if opts["catch_rate"] or opts["seeds"]:
            self._catch_rates(plants or list(PLANTS), opts)
            return
        seed, steps = opts["seed"], opts["steps"]
        if opts["schedule"]:
            saved = json.loads(Path(opts["schedule"]).read_text())
            schedule = [Step(*s) for s in saved]
        else:
            schedule = schedule_for(seed, steps)
        cpu = time.process_time()
        outcome = run(seed, schedule, plants=plants)
        cpu = time.process_time() - cpu
        out = self.stdout
        if opts["trace"]:
            for line in outcome.trace:
                out.write(line)
        out.write(f"database {connection.vendor}")
        out.write(f"seed {seed} plants {','.join(plants) or 'none'}")
        out.write(f"steps {outcome.steps} of {len(schedule)}")
        out.write(f"invariants checked {outcome.checks}")
        out.write(f"schedule {schedule_digest(schedule)}")
        out.write(_speed(outcome, cpu))
        if outcome.violation is None or outcome.failed_at is None:
            out.write("covered " + ", ".join(f"{k} {v}" for k, v in outcome.coverage.items()))
            out.write("ok: no invariant broken")
            return
        self._failed(seed, schedule, outcome, plants, opts["shrink_seconds"])

    def _failed(
        self, seed: int, schedule: list[Step], outcome: Any, plants: list[str], seconds: float
    ) -> None:
        """Report a broken invariant (``outcome``: an Outcome with its violation and step), shrink
        its schedule (saved under DATA_DIR) and say how to replay it; exits 1."""
        out = self.stdout
        out.write(f"FAILED invariant {outcome.violation.invariant}: {outcome.violation.detail}")
        out.write(f"at step {outcome.failed_at}: {schedule[outcome.failed_at].as_list()}")
        short = shrink(seed, schedule, outcome, seconds=seconds, plants=plants)
        path = Path(settings.DATA_DIR) / f"simulation-seed{seed}-shrunk.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([s.as_list() for s in short]))
        out.write(f"shrunk to {len(short)} steps (schedule {schedule_digest(short)}):")
        for s in short:
            out.write(f"  {s.as_list()}")
        suffix = f" PLANT={','.join(plants)}" if plants else ""
        out.write(f"replay: make simulate SEED={seed} STEPS={outcome.failed_at + 1}{suffix}")
        out.write(f"replay the shrunk schedule: make simulate SEED={seed} SCHEDULE={path}{suffix}")
        sys.exit(1)

    def _catch_rates(self, plants: list[str], opts: dict[str, Any]) -> None:
        """Each plant over the same seeds: caught on a seed when some invariant breaks earlier
        than it does on that seed without the plant (within the steps)."""
        out, steps = self.stdout, opts["steps"]
        if opts["seeds"]:
            seeds = [int(s) for s in opts["seeds"].split(",") if s]
        else:
            draw = random.SystemRandom()
            seeds = [draw.randrange(1, 1_000_000) for _ in range(opts["catch_rate"])]
        out.write(f"database {connection.vendor}; {steps} steps; seeds {','.join(map(str, seeds))}")
        started, ran = time.monotonic(), 0
        baseline: dict[int, int | None] = {}
        for seed in seeds:
            clean = run(seed, schedule_for(seed, steps), record=False)
            ran += clean.steps
            baseline[seed] = clean.failed_at
            if clean.violation is not None:
                out.write(
                    f"seed {seed} without a plant: {clean.violation} (step {clean.failed_at})"
                )
        rows = []
        for plant in plants:
            caught: list[tuple[int, int, str]] = []
            for seed in seeds:
                planted = run(seed, schedule_for(seed, steps), record=False, plants=[plant])
                ran += planted.steps
                first = baseline[seed]
                if planted.violation is None or planted.failed_at is None:
                    continue
                if first is None or planted.failed_at < first:
                    caught.append((seed, planted.failed_at, planted.violation.invariant))
            by = sorted({name for _, _, name in caught})
            median = statistics.median([at for _, at, _ in caught]) if caught else None
            rows.append((plant, len(caught), median, by, [s for s, _, _ in caught]))
            out.write(
                f"{plant}: caught on {len(caught)} of {len(seeds)} seeds"
                + (f", median step {median:.0f}, by {', '.join(by)}" if caught else "")
                + "".join(f"\n  seed {s} step {at}: {name}" for s, at, name in caught)
            )
        elapsed = time.monotonic() - started
        out.write("")
        out.write(f"| plant | caught (of {len(seeds)} seeds) | median step | by |")
        out.write("|---|---|---|---|")
        for plant, n, median, by, _ in rows:
            step = "-" if median is None else f"{median:.0f}"
            out.write(f"| `{plant}` | {n} ({100 * n // len(seeds)}%) | {step} | {', '.join(by)} |")
        out.write(f"\n{ran} steps in {elapsed:.0f} s ({ran / elapsed:.1f} steps/s)")
        missed = [p for p, n, *_ in rows if n * 5 < len(seeds) * 4]
        if missed:
            out.write(f"below 80%: {', '.join(missed)}")
            sys.exit(1)
