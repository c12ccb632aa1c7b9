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

import contextlib
import json
import os
import secrets
import signal
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

# The agent whose token `make run` prints (runstack's demo accounts): that token sees the story.
DEMO_AGENT = "demo-agent"
# A healthy team's day: at most this many of the story's items wait for people at once, however
# long it runs; the agent closes its own tasks once their work is done.
OPEN_REFUNDS = 4
OPEN_NOTICES = 2
# Under the requests' hour of validity: a refund nobody decided is withdrawn before it expires,
# so expired waits do not pile up either.
REFUND_PATIENCE_SECONDS = 50 * 60
APPROVAL_AMOUNT_CENTS = 25_000  # above demo.payments.charge's approval threshold
REPORT_SCHEMA = {
    "type": "object",
    "required": ["week", "orders", "refunds"],
    "properties": {"week": {"type": "string"}, "orders": {"type": "integer"}},
}


@dataclass
class Story:
    """What the story has open across passes: each refund's and notice's task with the operation
    it waits on (and when it started), and tasks to complete once their work has ended."""

    refunds: dict[str, tuple[str, float]] = field(default_factory=dict)
    notices: dict[str, str] = field(default_factory=dict)
    closing: list[str] = field(default_factory=list)


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
        except KeyboardInterrupt:
            # Ctrl-C reaches this process only (the stack has a session of its own): the pass
            # in flight stops here, and the stack is stopped below, in that order.
            self.stdout.write("\nThe demo stopped (Ctrl-C); what it started stays in the console.")
        finally:
            if stack is not None:
                _stack_stop(stack)

    def _run(self, url: str, options: dict[str, Any]) -> None:
        # The client is a package of its own (pip install ./client), installed by `make demo`
        # and `make install`; running the console itself does not need it.
        from agent_console_client import Client  # noqa: PLC0415 (optional package)

        accounts = self._accounts()
        token = token_issue_for_agent(DEMO_AGENT).secret
        story = Story()
        with Client(base_url=url, token=token) as console:
            n = 0
            while True:
                n += 1
                try:
                    done = story_pass(console, n, timeout=float(options["timeout"]), story=story)
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


def story_pass(console: Any, n: int, *, timeout: float, story: Story | None = None) -> Pass:
    """One pass of the story through ``console`` (an agent_console_client.Client). ``story``
    carries what is open from one pass to the next (a fresh one: a single pass): the pass first
    closes what people settled, then adds work only up to OPEN_REFUNDS and OPEN_NOTICES."""
    from agent_console_client.models import HUMAN_STATUSES, TERMINAL_STATUSES  # noqa: PLC0415

    settled = TERMINAL_STATUSES | HUMAN_STATUSES
    story = story if story is not None else Story()
    done = Pass()
    stamp = time.strftime("%H:%M:%S")
    _tidy(console, story, done)
    _refunds(console, n, stamp, done, story)
    inventory = console.create_task(f"reserve stock ({stamp})", {"sku": "SKU-7"})
    flaky = console.propose(
        inventory.id,
        "demo.inventory.reserve",
        {"sku": "SKU-7", "qty": 2, "_fault": "transient:2"},
        step="reserve",
    )
    story.closing.append(inventory.id)
    unknown = None
    if len(story.notices) < OPEN_NOTICES:
        notice = console.create_task(f"tell the customer ({stamp})")
        unknown = console.propose(
            notice.id,
            "demo.notify",
            {
                "to": "customer@example.com",
                "message": "your refund is on its way",
                "_fault": "unknown",
            },
            step="notify",
        )
        story.notices[notice.id] = unknown.id
    _report(console, n, stamp, done)
    _budget(console, stamp, done, story)

    done.flaky = console.wait_operation(flaky.id, until=settled, timeout=timeout).status
    done.lines.append(f"flaky inventory call {flaky.id}: {done.flaky} after retries")
    if unknown is not None:
        done.unresolved = console.wait_operation(unknown.id, until=settled, timeout=timeout).status
        done.lines.append(f"notification {unknown.id}: {done.unresolved} (for support staff)")
    return done


def _tidy(console: Any, story: Story, done: Pass) -> None:
    """The agent's own housekeeping: a refund or notice whose operation ended closes its task
    (completed when it succeeded, else cancelled), a refund nobody decided in
    REFUND_PATIENCE_SECONDS is withdrawn, and finished work is completed."""
    from agent_console_client import errors  # noqa: PLC0415 (optional package, see handle)

    now = time.monotonic()
    for task_id, (op_id, since) in list(story.refunds.items()):
        if _close(console, task_id, op_id):
            del story.refunds[task_id]
        elif now - since > REFUND_PATIENCE_SECONDS:
            _cancel(console, task_id, "no decision within 50 minutes: refunded another way")
            del story.refunds[task_id]
    for task_id, op_id in list(story.notices.items()):
        if _close(console, task_id, op_id):
            del story.notices[task_id]
    for task_id in list(story.closing):
        try:
            console.complete_task(task_id)
        except errors.ConsoleError:
            continue  # its work is still running: next pass
        story.closing.remove(task_id)
    done.lines.append(
        f"open: {len(story.refunds)} refund(s), {len(story.notices)} notice(s) for people"
    )


def _close(console: Any, task_id: str, op_id: str) -> bool:
    """Close ``task_id`` when its operation ended: True when it did (or the task is gone)."""
    from agent_console_client import errors  # noqa: PLC0415 (optional package, see handle)
    from agent_console_client.models import TERMINAL_STATUSES  # noqa: PLC0415

    status = console.get_operation(op_id).status
    if status not in TERMINAL_STATUSES:
        return False
    if status == "succeeded":
        try:
            console.complete_task(task_id)
            return True
        except errors.ConsoleError:
            pass  # not completable (ended meanwhile): cancelled below, which ends it either way
    _cancel(console, task_id, f"its operation ended {status}")
    return True


def _cancel(console: Any, task_id: str, reason: str) -> None:
    from agent_console_client import errors  # noqa: PLC0415 (optional package, see handle)

    with contextlib.suppress(errors.ConsoleError):  # already ended: nothing to close
        console.cancel_task(task_id, reason)


def _refunds(console: Any, n: int, stamp: str, done: Pass, story: Story) -> None:
    """Refunds over the approval threshold, two a pass while fewer than OPEN_REFUNDS wait for a
    person."""
    pairs = ((1040 + n, APPROVAL_AMOUNT_CENTS), (2040 + n, APPROVAL_AMOUNT_CENTS + 5))
    for order, amount in pairs[: max(0, OPEN_REFUNDS - len(story.refunds))]:
        task = console.create_task(f"refund order #{order} ({stamp})", {"order": order})
        op = console.propose(
            task.id,
            "demo.payments.charge",
            {"account": f"cust-{order}", "amount_cents": amount},
            step="refund",
        )
        story.refunds[task.id] = (op.id, time.monotonic())
        done.approvals.append(op.id)
    if done.approvals:
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


def _budget(console: Any, stamp: str, done: Pass, story: Story) -> None:
    """Calls against a small budget until one is refused."""
    from agent_console_client import errors  # noqa: PLC0415 (optional package, see handle)

    budget = console.create_task(f"summarise tickets ({stamp})", budget={"cost_cents": 100})
    story.closing.append(budget.id)
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
            # Its own session: the terminal's Ctrl-C reaches the demo, which stops the stack
            # after its pass (the stack going first ended the pass in a connection error).
            start_new_session=True,
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


def _stack_stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the stack as Ctrl-C would (runstack stops its processes on SIGINT)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
