"""A pending approval reaches a real SMTP server (aiosmtpd) and a real webhook receiver through
real worker processes, exactly once at each receiver although the worker that sent it is
killed after sending and before its acceptance: the retry carries the same key, and the
receivers keep one effect per key. The message links to that approval (its id and parameter
hash), and the webhook's signature verifies."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agent_console_client import webhook_signature_valid
from aiosmtpd.controller import Controller

from runtime.models import Approval, Invocation, Notification, Operation
from runtime.notifications.dispatch import approval_link
from tests import factories
from tests.conftest import free_port, wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {
    "LEASE_SECONDS": 3,
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 2,
    "RETRY_BASE_SECONDS": 0.3,
}
SECRET = "webhook-test-secret"


class Gate:
    """Holds the receiver's first answer until the test has killed the sender."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()


class Mailbox:
    """An SMTP receiver that keeps one message per Idempotency-Key (its dedupe) and counts
    every delivery; the first delivery's answer waits at the gate."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.deliveries: list[str] = []
        self.kept: dict[str, Any] = {}

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        key = str(message["Idempotency-Key"]).strip()  # a long header may come folded
        self.deliveries.append(key)
        self.kept.setdefault(key, message)
        if len(self.deliveries) == 1:
            self.gate.arrived.set()
            await asyncio.get_running_loop().run_in_executor(None, self.gate.release.wait, 60)
        return "250 OK"


class Hooks:
    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.deliveries: list[str] = []
        self.kept: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()


def _hook_server(hooks: Hooks) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            key = self.headers["Idempotency-Key"]
            with hooks.lock:
                hooks.deliveries.append(key)
                first = len(hooks.deliveries) == 1
                hooks.kept.setdefault(key, {"headers": dict(self.headers), "body": body})
            if first:
                hooks.gate.arrived.set()
                hooks.gate.release.wait(60)
            try:
                self.send_response(200)
                self.end_headers()
            except OSError:
                pass  # the sender is dead

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_pending_approval_reaches_smtp_and_a_webhook_once_though_the_sender_dies(workers):
    mail_gate, hook_gate = Gate(), Gate()
    mailbox = Mailbox(mail_gate)
    smtp_port = free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    hooks = Hooks(hook_gate)
    server = _hook_server(hooks)
    env = {
        **FAST,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": smtp_port,
        "NOTIFY_WEBHOOK_URL": f"http://127.0.0.1:{server.server_address[1]}/hook",
        "NOTIFY_WEBHOOK_SECRET": SECRET,
        "NOTIFY_ALLOW_PRIVATE_HOSTS": "1",
        "CONSOLE_URL": "http://console.test",
    }
    try:
        (worker,) = workers.start(count=1, concurrency=1, **env)
        workers.start_beat(**env)
        operator = factories.console_user("operator")
        user = operator.actor_user()
        user.email = "operator@example.test"
        user.save(update_fields=["email"])
        owner = factories.agent()
        task = factories.task(owner)
        op = factories.operation(
            owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 50000}
        )
        approval = Approval.objects.get(operation=op)

        # Each receiver gets its message (in either order); the sender is killed before it
        # hears the answer, then the answer is let go (to a dead socket).
        gates = [mail_gate, hook_gate]
        while gates:
            gate = wait_for(
                lambda: next((g for g in gates if g.arrived.is_set()), None),
                timeout=60,
                what=f"a receiver to get its first message:\n{worker.tail()}",
            )
            assert worker.kill_children()
            gate.release.set()
            gates.remove(gate)

        messages = wait_for(
            lambda: (
                list(Operation.objects.filter(tool__startswith="notify.", status="succeeded"))
                if Operation.objects.filter(tool__startswith="notify.", status="succeeded").count()
                == 2
                else None
            ),
            timeout=90,
            what=f"both messages to be accepted:\n{worker.tail()}",
        )
    finally:
        mail_gate.release.set()
        hook_gate.release.set()
        smtp.stop()
        server.shutdown()

    by_tool = {m.tool: m for m in messages}
    for message in messages:
        # Sent again under a newer lease after the first sender died: the same key.
        invocations = list(Invocation.objects.filter(operation=message).order_by("number"))
        assert len(invocations) >= 2, message.tool
        assert invocations[0].outcome == Invocation.OUTCOME_LOST
        assert message.task_id != task.pk  # the day's notification task, not the charge's
    # Each receiver saw the retry and kept the message once, under the key it was given.
    assert len(mailbox.deliveries) >= 2 and set(mailbox.deliveries) == {
        by_tool["notify.email"].idempotency_key
    }
    assert len(mailbox.kept) == 1
    assert len(hooks.deliveries) >= 2 and set(hooks.deliveries) == {
        by_tool["notify.webhook"].idempotency_key
    }
    assert len(hooks.kept) == 1

    link = approval_link(approval).replace("http://localhost:8000", "http://console.test")
    (kept_mail,) = mailbox.kept.values()
    assert kept_mail["To"] == "operator@example.test"
    assert link in kept_mail.get_content()
    (kept_hook,) = hooks.kept.values()
    headers, body = kept_hook["headers"], kept_hook["body"]
    assert webhook_signature_valid(
        SECRET,
        timestamp=headers["X-Console-Timestamp"],
        body=body,
        signature=headers["X-Console-Signature"],
    )
    (item,) = json.loads(body)["items"]
    assert (item["approval"], item["params_hash"]) == (approval.pk, approval.params_hash)
    assert item["link"] == link
    assert Notification.objects.filter(operation__isnull=False).count() == 2
