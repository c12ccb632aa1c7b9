"""Run the whole system in the foreground: web (console.server: uvicorn, ASGI), a Celery worker
with WORKERS prefork children, a notifier (a Celery worker with NOTIFY_WORKERS children that
reads the notifications' queue alone) and beat (the sweeper's process, `manage.py beat`), under
a supervisor: a process that dies is restarted, one that keeps dying stops the stack. Ctrl-C
stops them all.

In embedded mode (what `make run` gives a first-time user) the processes log to
DATA_DIR/logs/<name>.log, and the terminal shows, once the web server answers, where the logs
are, the demo accounts and the URL, last, so that request and sweep lines never bury them.
`--logs terminal` (the default with services, where an orchestrator collects output) keeps
every process's output on the terminal."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.supervisor import Supervisor
from runtime.accounts import console_user_create
from runtime.actors import ROLES
from runtime.tokens import token_issue_for_agent

log = logging.getLogger("console.runstack")
# Its announcement (where the logs are, the accounts, the URL) is for whoever starts the stack,
# whatever LOG_LEVEL keeps from the rest.
log.setLevel(logging.INFO)


def worker_pools(python: str) -> dict[str, list[str]]:
    """The default layout's Celery worker pools: "worker" reads every queue but the
    notifications' own (settings.WORK_QUEUES) with WORKERS processes; "notifier" reads that one
    with NOTIFY_WORKERS, so a dead webhook retried with backoff holds none of the work pool's
    slots. Per-class pools for other tool classes (TOOL_QUEUES) are a deployment's choice: here
    the work pool reads their queues too."""

    def pool(name: str, queues: list[str], concurrency: int) -> list[str]:
        return [
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
            str(concurrency),
            "-Q",
            ",".join(queues),
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{name}-{os.getpid()}@%h",
        ]

    pools = {"worker": pool("worker", settings.WORK_QUEUES, settings.WORKERS)}
    notify_queues = [q for q in settings.CELERY_QUEUES if q not in settings.WORK_QUEUES]
    if notify_queues:
        pools["notifier"] = pool("notifier", notify_queues, settings.NOTIFY_WORKERS)
    return pools


class Command(BaseCommand):
    help = "Start web + worker + beat in the foreground (make run)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-beat", action="store_true")
        parser.add_argument(
            "--only",
            default="web,worker,beat",
            help="comma-separated processes to run (web, worker, beat); worker includes the "
            "notifier",
        )
        parser.add_argument(
            "--logs",
            choices=("file", "terminal"),
            default=None,
            help="where the processes log: files under DATA_DIR/logs (default in embedded "
            "mode) or this terminal (default with services)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        only = {p.strip() for p in options["only"].split(",") if p.strip()}
        if options["no_beat"]:
            only.discard("beat")
        if "web" in only:
            # Before anything is printed or created: a taken port would leave the web process
            # restarting in a loop behind a banner that says the console is up.
            port_check(options["host"], options["port"])
        embedded = settings.EMBEDDED_DATABASE
        accounts = self._demo_accounts() if embedded else ""
        to_file = (options["logs"] or ("file" if embedded else "terminal")) == "file"
        log_dir = Path(settings.DATA_DIR) / "logs" if to_file else None
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        commands = _commands(options, only)
        banner = _banner(options, commands, only, log_dir, accounts)
        supervisor = Supervisor(
            {name: cmd for name, cmd in commands.items() if name in only},
            env,
            log=self._say,
            log_dir=log_dir,
        )
        if "web" in only:
            # Printed once the server answers: after the processes' start-up lines, if any.
            probe = f"http://{_probe_host(options['host'])}:{options['port']}/healthz"
            threading.Thread(
                target=self._announce_when_ready, args=(probe, banner), daemon=True
            ).start()
        else:
            self._announce(banner)
        sys.exit(supervisor.run())

    def _say(self, line: str) -> None:
        """The supervisor's own lines (a process restarted, the stack stopping): with
        LOG_FORMAT=json log records like its children's lines, so every line is JSON."""
        if settings.LOG_FORMAT == "json":
            log.warning("%s", line)
        else:
            self.stderr.write(line)

    def _announce(self, lines: list[str]) -> None:
        if settings.LOG_FORMAT == "json":
            log.info("%s", "\n".join(lines))
            return
        self.stdout.write("\n".join(lines))
        self.stdout.flush()

    def _announce_when_ready(self, probe: str, lines: list[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(probe, timeout=2):  # noqa: S310 (our own server)
                    break
            except urllib.error.HTTPError:
                break  # it answers (503 while the broker is not ready yet): the page works
            except OSError:
                time.sleep(0.2)
        self._announce(lines)

    def _demo_accounts(self) -> str:
        """On the first embedded start: one console user per role and a demo agent token,
        kept in DATA_DIR/demo-accounts.txt (mode 600); returns what to print (the accounts
        once, then where the file is)."""
        path = Path(settings.DATA_DIR) / "demo-accounts.txt"
        if get_user_model().objects.exists():
            return f"Demo accounts: see {path}" if path.exists() else ""
        lines = ["Demo accounts (created on first start):"]
        for role in ROLES:
            password = secrets.token_urlsafe(9)
            user = console_user_create(role, role, password)
            # An address, so their notifications are seen: in DATA_DIR/mail, the file backend.
            user.email = f"{role}@example.com"
            user.save(update_fields=["email"])
            lines.append(
                f"  console user {role:<8} password {password}   (role {role}, {user.email})"
            )
        issued = token_issue_for_agent("demo-agent")
        lines.append(f"  agent token (demo-agent): {issued.secret}")
        text = "\n".join(lines) + "\n"
        path.write_text(text)
        path.chmod(0o600)
        return text


def port_check(host: str, port: int) -> None:
    """Refuse to start (CommandError: exit 1, the sentence on stderr) when ``host:port`` cannot
    be listened on, naming the port and how to pick another. The socket is bound as uvicorn
    binds it (SO_REUSEADDR), so a port left in TIME_WAIT by the last run is not "taken"."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CommandError(f"Cannot start: the host {host!r} is not an address ({exc}).") from exc
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
            probe.listen(1)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise CommandError(f"Cannot start on {host}:{port}: {exc.strerror}.") from exc
            raise CommandError(
                f"Cannot start: address already in use: port {port} on {host} is taken by "
                "another process. Stop it, or pick another port: make run PORT=8001 (or "
                "manage.py runstack --port 8001)."
            ) from exc


def _probe_host(host: str) -> str:
    """Where to ask for /healthz: a wildcard address is reached on the loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(  # noqa: S104
        host, f"[{host}]" if ":" in host else host
    )


def _commands(options: dict[str, Any], only: set[str]) -> dict[str, list[str]]:
    """Each process of the stack by name, its command line; ``only`` gains the parts a part it
    names brings along."""
    python = sys.executable
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
        **worker_pools(python),
    }
    if "worker" in only:
        # The worker pools are one part of the stack: --only worker starts the notifier too.
        only.add("notifier")
    if "beat" in only:
        # The sweeper's own process, never a task queued behind the workers it rescues.
        commands["beat"] = [
            python,
            str(Path(settings.BASE_DIR) / "manage.py"),
            "beat",
        ]
    return commands


def _banner(
    options: dict[str, Any],
    commands: dict[str, list[str]],
    only: set[str],
    log_dir: Path | None,
    accounts: str,
) -> list[str]:
    """What the stack says once it answers: where its logs go, who to sign in as, its mode."""
    mode = "embedded (SQLite, no Redis)" if settings.EMBEDDED_DATABASE else "services"
    url = f"http://{options['host']}:{options['port']}/"
    banner = []
    if log_dir is not None:
        banner.append(
            f"Logs: {log_dir}/{{{','.join(n for n in commands if n in only)}}}.log "
            "(--logs terminal shows them here)."
        )
    if accounts:
        banner.append(accounts.rstrip("\n"))
    banner.append(
        f"Agent console ({mode}) on {url} - lease {settings.LEASE_SECONDS}s, "
        f"sweep {settings.SWEEP_SECONDS}s, {settings.WORKERS} worker process(es)"
        + (f" and {settings.NOTIFY_WORKERS} for notifications" if "notifier" in commands else "")
        + ". Ctrl-C stops."
    )
    return banner
