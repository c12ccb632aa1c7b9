"""``python manage.py demo [--once] [--url URL]``: a scripted agent keeps a running console busy
with a realistic story, through the Python client (agent_console_client) over HTTP, so that a
newcomer sees every page in use within a minute:

- refunds that need a person's approval (``demo.payments.charge`` above the threshold) wait on
  /approvals/;
- a flaky inventory call (``demo.inventory.reserve`` failing twice, then reserving) retries;
- a notification whose outcome is unknown (``demo.notify``: the receiver promises nothing about
  repeats) ends unresolved, for support staff on /unresolved/;
- a report with required checks is uploaded, accepted, checked and the task completed;
- a budget runs low: work is admitted until the ledger refuses the next call.

One pass with ``--once`` (each pass makes new tasks); otherwise a pass every ``--interval``
seconds until interrupted. The agent's token is minted here (the command runs beside the stack,
on its database); the demo accounts and the URL are printed last."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime.accounts import console_user_create
from runtime.actors import ROLES
from runtime.tokens import token_issue_for_agent

DEMO_AGENT = "demo-story"
APPROVAL_AMOUNT_CENTS = 25_000  # above demo.payments.charge's approval threshold
REPORT_SCHEMA = {
    "type": "object",
    "required": ["week", "orders", "refunds"],
    "properties": {"week": {"type": "string"}, "orders": {"type": "integer"}},
}


@dataclass
class Pass:
    """What one pass left for people to see."""

    approvals: list[str] = field(default_factory=list)
    flaky: str = ""
    unresolved: str = ""
    report_task: str = ""
    budget_refused: bool = False
    lines: list[str] = field(default_factory=list)


class Command(BaseCommand):
    help = "Keep a running console busy with a demo story (refunds, flaky calls, checks...)."

    def add_arguments(self, parser: CommandParser) -> None:
        port = os.environ.get("PORT", "8000")
        parser.add_argument("--url", default=f"http://127.0.0.1:{port}", help="the console")
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--interval", type=float, default=30.0, help="seconds between passes")
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="seconds to wait for a pass's work"
        )
        parser.add_argument(
            "--with-stack",
            action="store_true",
            help="start the stack first (manage.py runstack, its output in DATA_DIR/logs), and "
            "stop it on the way out (make demo)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = str(options["url"]).rstrip("/")
        stack = _stack_start(url) if options["with_stack"] else None
        try:
            self._run(url, options)
        finally:
            if stack is not None:
                stack.terminate()
                stack.wait(timeout=30)

    def _run(self, url: str, options: dict[str, Any]) -> None:
        # The client is a package of its own (pip install ./client), installed by `make demo`
        # and `make install`; running the console itself does not need it.
        from agent_console_client import Client  # noqa: PLC0415 (optional package)

        accounts = self._accounts()
        token = token_issue_for_agent(DEMO_AGENT).secret
        with Client(base_url=url, token=token) as console:
            n = 0
            while True:
                n += 1
                try:
                    done = story_pass(console, n, timeout=float(options["timeout"]))
                except Exception as exc:
                    raise CommandError(f"the demo pass failed: {exc!r}") from exc
                self.stdout.write("\n".join(done.lines))
                # Last after each pass: who to sign in as and where to look.
                self.stdout.write(accounts)
                self.stdout.write(f"Open {url}/approvals/, {url}/unresolved/ and {url}/tasks/")
                self.stdout.flush()
                if options["once"]:
                    break
                time.sleep(float(options["interval"]))

    def _accounts(self) -> str:
        """The people to sign in as: the embedded demo accounts when `make run` made them,
        else one console user per role made now (printed once)."""
        path = Path(settings.DATA_DIR) / "demo-accounts.txt"
        if path.exists():
            return path.read_text().rstrip("\n")
        users = get_user_model().objects.filter(username__startswith="demo-")
        if users.exists():
            return "Demo accounts: demo-operator, demo-support, demo-admin (passwords printed once)"
        lines = ["Demo accounts (created now):"]
        for role in ROLES:
            password = secrets.token_urlsafe(9)
            user = console_user_create(f"demo-{role}", role, password)
            # An address, so their notifications reach DATA_DIR/mail (the file backend).
            user.email = f"demo-{role}@example.com"
            user.save(update_fields=["email"])
            lines.append(f"  console user demo-{role:<8} password {password}   (role {role})")
        return "\n".join(lines)


def story_pass(console: Any, n: int, *, timeout: float) -> Pass:
    """One pass of the story through ``console`` (an agent_console_client.Client)."""
    from agent_console_client.models import HUMAN_STATUSES, TERMINAL_STATUSES  # noqa: PLC0415

    settled = TERMINAL_STATUSES | HUMAN_STATUSES

    done = Pass()
    stamp = time.strftime("%H:%M:%S")
    _refunds(console, n, stamp, done)
    inventory = console.create_task(f"reserve stock ({stamp})", {"sku": "SKU-7"})
    flaky = console.propose(
        inventory.id,
        "demo.inventory.reserve",
        {"sku": "SKU-7", "qty": 2, "_fault": "transient:2"},
        step="reserve",
    )
    notice = console.create_task(f"tell the customer ({stamp})")
    unknown = console.propose(
        notice.id,
        "demo.notify",
        {"to": "customer@example.com", "message": "your refund is on its way", "_fault": "unknown"},
        step="notify",
    )
    _report(console, n, stamp, done)
    _budget(console, stamp, done)

    done.flaky = console.wait_operation(flaky.id, until=settled, timeout=timeout).status
    done.lines.append(f"flaky inventory call {flaky.id}: {done.flaky} after retries")
    done.unresolved = console.wait_operation(unknown.id, until=settled, timeout=timeout).status
    done.lines.append(f"notification {unknown.id}: {done.unresolved} (for support staff)")
    return done


def _refunds(console: Any, n: int, stamp: str, done: Pass) -> None:
    """Two refunds over the approval threshold: they wait for a person."""
    for order, amount in ((1040 + n, APPROVAL_AMOUNT_CENTS), (2040 + n, APPROVAL_AMOUNT_CENTS + 5)):
        task = console.create_task(f"refund order #{order} ({stamp})", {"order": order})
        op = console.propose(
            task.id,
            "demo.payments.charge",
            {"account": f"cust-{order}", "amount_cents": amount},
            step="refund",
        )
        done.approvals.append(op.id)
    done.lines.append(f"refunds waiting for approval: {', '.join(done.approvals)}")


def _report(console: Any, n: int, stamp: str, done: Pass) -> None:
    """A task whose required checks pass on the artifact it uploads, completed."""
    report = console.create_task(
        f"weekly report ({stamp})",
        required_checks=[
            {
                "name": "has report",
                "checker": "artifact_present",
                "config": {"artifact": "report.json"},
            },
            {
                "name": "report shape",
                "checker": "json_schema",
                "config": {"artifact": "report.json", "schema": REPORT_SCHEMA},
            },
        ],
    )
    body = json.dumps({"week": stamp, "orders": 42 + n, "refunds": 2}).encode()
    artifact = console.upload_artifact(report.id, "report.json", body, "application/json")
    version = console.get_task(report.id).state_version
    console.accept_artifact(artifact.id, version)
    ended = console.complete_task(report.id)
    done.report_task = report.id
    done.lines.append(f"report {report.id}: checks passed, task {ended.outcome}")


def _budget(console: Any, stamp: str, done: Pass) -> None:
    """Calls against a small budget until one is refused."""
    from agent_console_client import errors  # noqa: PLC0415 (optional package, see handle)

    budget = console.create_task(f"summarise tickets ({stamp})", budget={"cost_cents": 100})
    for i in range(5):
        try:
            console.propose(
                budget.id,
                "demo.echo",
                {"ticket": i, "_usage": {"cost_cents": 40}},
                step=f"summarise {i}",
                estimate={"cost_cents": 40},
            )
        except errors.BudgetExhausted:
            done.budget_refused = True
            done.lines.append(f"budget of {budget.id} ran low: call {i + 1} refused")
            break


def _stack_start(url: str) -> subprocess.Popen[bytes]:
    """``manage.py runstack`` on the URL's port, its output in DATA_DIR/logs/stack.log; returns
    once the server answers."""
    port = url.rsplit(":", 1)[-1].split("/")[0]
    logs = Path(settings.DATA_DIR) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / "stack.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", port],
            cwd=settings.BASE_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError(f"the stack stopped: see {logs / 'stack.log'}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):  # noqa: S310 (ours)
                return proc
        except urllib.error.HTTPError:
            return proc  # it answers (503 until the broker is up)
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise CommandError(f"the stack did not answer at {url}: see {logs / 'stack.log'}")
