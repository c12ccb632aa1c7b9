"""``manage.py simulate``: the seeded simulation (runtime.simulation; docs/simulation.md) on the
configured database, which it creates (PostgreSQL) and migrates first. ``make simulate``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test.utils import override_settings

from runtime.plants import PLANTS
from runtime.simulation.engine import Step, run, schedule_digest, schedule_for, shrink


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


class Command(BaseCommand):
    help = "Run the seeded simulation; exit 1 when an invariant breaks."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--steps", type=int, default=1000)
        parser.add_argument("--plant", default="", help=f"one of {', '.join(PLANTS)}")
        parser.add_argument("--shrink-seconds", type=float, default=120.0)
        parser.add_argument("--schedule", default="", help="replay this saved schedule (JSON)")
        parser.add_argument("--trace", action="store_true", help="print every step")

    def handle(self, *args: Any, **opts: Any) -> None:
        plants = [p for p in opts["plant"].split(",") if p]
        unknown = set(plants) - set(PLANTS)
        if unknown:
            raise CommandError(f"no plant named {', '.join(sorted(unknown))}")
        _database_ensure()
        call_command("migrate", interactive=False, verbosity=0)
        seed, steps = opts["seed"], opts["steps"]
        if opts["schedule"]:
            saved = json.loads(Path(opts["schedule"]).read_text())
            schedule = [Step(*s) for s in saved]
        else:
            schedule = schedule_for(seed, steps)
        with override_settings(SIMULATION_PLANTS=plants):
            outcome = run(seed, schedule)
            out = self.stdout
            if opts["trace"]:
                for line in outcome.trace:
                    out.write(line)
            out.write(f"database {connection.vendor}")
            out.write(f"seed {seed} plants {','.join(plants) or 'none'}")
            out.write(f"steps {outcome.steps} of {len(schedule)}")
            out.write(f"invariants checked {outcome.checks}")
            out.write(f"schedule {schedule_digest(schedule)}")
            if outcome.violation is None or outcome.failed_at is None:
                out.write("covered " + ", ".join(f"{k} {v}" for k, v in outcome.coverage.items()))
                out.write("ok: no invariant broken")
                return
            out.write(f"FAILED invariant {outcome.violation.invariant}: {outcome.violation.detail}")
            out.write(f"at step {outcome.failed_at}: {schedule[outcome.failed_at].as_list()}")
            short = shrink(seed, schedule, outcome, seconds=opts["shrink_seconds"])
            path = Path(settings.DATA_DIR) / f"simulation-seed{seed}-shrunk.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps([s.as_list() for s in short]))
            out.write(f"shrunk to {len(short)} steps (schedule {schedule_digest(short)}):")
            for s in short:
                out.write(f"  {s.as_list()}")
            out.write(
                f"replay: make simulate SEED={seed} STEPS={outcome.failed_at + 1}"
                + (f" PLANT={','.join(plants)}" if plants else "")
            )
            out.write(
                f"replay the shrunk schedule: make simulate SEED={seed} SCHEDULE={path}"
                + (f" PLANT={','.join(plants)}" if plants else "")
            )
        sys.exit(1)
