"""The sweeper's clock, in a process of its own: every SWEEP_SECONDS it takes back expired
leases, republishes outbox rows no claim has consumed, starts schedules' due slots (each once:
runtime.schedules) and (embedded mode) purges the broker's spent messages.

Why not Celery beat sending a task to the workers: the sweeper is what rescues work from hung
worker processes, so it must not wait in the queue behind them. With every prefork child stuck
in a tool call, a sweep message would never be taken, and neither would the lease takeover it
carries. This process talks only to the database (and publishes through the outbox relay), so
it runs whatever the pool and the broker are doing."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections, connection

from runtime.sweeper import sweep_once

log = logging.getLogger("runtime.sweeper")


class Command(BaseCommand):
    help = "Run the sweeper every SWEEP_SECONDS until stopped (make run starts it as 'beat')."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="sweep once and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["once"]:
            self.stdout.write(f"{sweep_once()}\n")
            return
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        interval = float(settings.SWEEP_SECONDS)
        # A log record, not a print: with LOG_FORMAT=json every line of this process is JSON.
        log.info("beat: sweeping every %gs", interval)
        while not stop.is_set():
            started = time.monotonic()
            try:
                counts = sweep_once()
            except Exception:
                # A database that restarts or a broker that is away must not end the clock:
                # drop the connection (the next sweep opens a fresh one) and try again.
                log.warning("sweep failed; retried in %ss", interval, exc_info=True)
                connection.close()
            else:
                if any(counts.values()):
                    log.info("sweep: %s", {k: v for k, v in counts.items() if v})
                close_old_connections()
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
