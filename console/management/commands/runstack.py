"""Run the whole system in the foreground: web (console.server: uvicorn, ASGI), a Celery worker
with WORKERS prefork children, and beat (the sweeper's process, `manage.py beat`), under a
supervisor: a process that dies is restarted, one that keeps dying stops the stack. Ctrl-C
stops all three."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from console.supervisor import Supervisor
from runtime.accounts import console_user_create
from runtime.actors import ROLES
from runtime.tokens import token_issue_for_agent


class Command(BaseCommand):
    help = "Start web + worker + beat in the foreground (make run)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-beat", action="store_true")
        parser.add_argument(
            "--only",
            default="web,worker,beat",
            help="comma-separated processes to run (web, worker, beat)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        only = {p.strip() for p in options["only"].split(",") if p.strip()}
        if options["no_beat"]:
            only.discard("beat")
        embedded = settings.EMBEDDED_DATABASE
        if embedded:
            self._demo_accounts()
        python = sys.executable
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        commands = {
            "web": [
                python,
                "-m",
                "console.server",
                "--host",
                options["host"],
                "--port",
                str(options["port"]),
            ],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--loglevel",
                "INFO",
                "--pool",
                "prefork",
                "--concurrency",
                str(settings.WORKERS),
                "-Q",
                # One worker pool for every queue here; per-class pools are a deployment choice.
                ",".join(settings.CELERY_QUEUES),
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"worker-{os.getpid()}@%h",
            ],
        }
        if "beat" in only:
            # The sweeper's own process, never a task queued behind the workers it rescues.
            commands["beat"] = [
                python,
                str(Path(settings.BASE_DIR) / "manage.py"),
                "beat",
            ]
        mode = "embedded (SQLite, no Redis)" if embedded else "services"
        self.stdout.write(
            f"Agent console ({mode}) on http://{options['host']}:{options['port']}/ "
            f"- lease {settings.LEASE_SECONDS}s, sweep {settings.SWEEP_SECONDS}s, "
            f"{settings.WORKERS} worker process(es). Ctrl-C stops."
        )
        self.stdout.flush()
        supervisor = Supervisor(
            {name: cmd for name, cmd in commands.items() if name in only},
            env,
            log=lambda line: self.stderr.write(line),
        )
        sys.exit(supervisor.run())

    def _demo_accounts(self) -> None:
        """On the first embedded start: one console user per role and a demo agent token,
        printed once and kept in DATA_DIR/demo-accounts.txt (mode 600)."""
        path = Path(settings.DATA_DIR) / "demo-accounts.txt"
        if get_user_model().objects.exists():
            if path.exists():
                self.stdout.write(f"Demo accounts: see {path}")
            return
        lines = ["Demo accounts (created on first start):"]
        for role in ROLES:
            password = secrets.token_urlsafe(9)
            console_user_create(role, role, password)
            lines.append(f"  console user {role:<8} password {password}   (role {role})")
        issued = token_issue_for_agent("demo-agent")
        lines.append(f"  agent token (demo-agent): {issued.secret}")
        text = "\n".join(lines) + "\n"
        path.write_text(text)
        path.chmod(0o600)
        self.stdout.write(text)
