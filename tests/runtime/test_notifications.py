"""Notifications as operations (runtime.notifications, runtime.notify_events, runtime/tools/
notify.py): triggers write one event in their own transaction and nothing else; the fan-out
reaches the people whose role can act (and watchers); each message is an operation of the
day's system task with its own key; quiet hours and the once-a-minute digest hold; webhooks are
signed (the client's check accepts them, refuses altered or replayed ones) and never reach
private hosts unless allowed."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, time, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agent_console_client import webhook_signature_valid
from django.core import mail
from django.db import transaction
from django.test.utils import override_settings

from runtime.cancellation import task_fail
from runtime.errors import InvalidInput, UnknownTool
from runtime.keys import given_key_check, key_notice
from runtime.models import (
    Approval,
    AuditRecord,
    Notification,
    NotificationEvent,
    NotificationPreference,
    NotificationTask,
    Operation,
    TaskWatch,
)
from runtime.notifications.dispatch import approval_link, dispatch_due, notification_task_id
from runtime.notifications.endpoints import endpoint_create, endpoint_remove
from runtime.notifications.fanout import fan_out
from runtime.notifications.people import preference_save, quiet_until
from runtime.notifications.reminders import expiry_notice_sweep
from runtime.notify_secrets import PrivateHost, host_addresses
from runtime.specs import OperationSpec
from runtime.tool_invocation import invocation_context
from runtime.tools import ToolFailure, adapter_for
from runtime.transitions.propose import operation_propose, operation_propose_txn
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True)]

CHARGE = {"account": "acct-1", "amount_cents": 25000}  # above 10000: an operator decides


def _operator(email: str = "op@example.test") -> factories.Principal:
    person = factories.console_user("operator")
    user = person.actor_user()
    user.email = email
    user.save(update_fields=["email"])
    return person


def _gated(owner: factories.Principal, step: str = "pay") -> tuple[Operation, Approval]:
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.payments.charge", params=CHARGE, step=step)
    return op, Approval.objects.get(operation=op)


def test_a_pending_approval_is_noted_once_in_its_transaction_and_not_when_it_rolls_back():
    owner = factories.agent()
    task = factories.task(owner)
    with pytest.raises(RuntimeError), transaction.atomic():
        operation_propose_txn(
            owner.actor,
            task.pk,
            OperationSpec(tool="demo.payments.charge", params=CHARGE, step="gone"),
        )
        assert NotificationEvent.objects.filter(kind="approval_requested").count() == 1
        raise RuntimeError("the proposal's transaction rolls back")
    assert not NotificationEvent.objects.exists()

    op, approval = _gated(owner)
    event = NotificationEvent.objects.get(kind="approval_requested")
    assert (event.approval_id, event.operation_id, event.task_id) == (
        approval.pk,
        op.pk,
        op.task_id,
    )
    assert event.data["params_hash"] == approval.params_hash
    # Nothing was looked up or sent in that transaction: no notification, no message yet.
    assert not Notification.objects.exists()
    assert not Operation.objects.filter(tool__startswith="notify.").exists()


def test_the_approvers_get_one_email_operation_in_the_system_task_with_a_link_to_the_approval():
    operator = _operator()
    factories.console_user("support")  # no role to act on an approval: not told
    owner = factories.agent()
    op, approval = _gated(owner)
    now = datetime.now(UTC)
    assert fan_out(now) == 1
    assert dispatch_due(now) == 1
    assert fan_out(now) == 0 and dispatch_due(now) == 0  # once

    (note,) = Notification.objects.all()
    assert (note.recipient, note.channel, note.reason) == (
        f"user:{operator.actor.user_id}",
        "email",
        "operator",
    )
    message = Operation.objects.get(pk=note.operation_id)
    day_task = NotificationTask.objects.get().task_id
    assert message.task_id == day_task != op.task_id
    assert message.tool == "notify.email"
    event = NotificationEvent.objects.get()
    assert message.idempotency_key == "sys_runtime/" + key_notice(
        event.pk, f"user:{operator.actor.user_id}", "email"
    )
    assert message.params["to"] == ["op@example.test"]
    link = approval_link(approval)
    assert approval.pk in link and approval.params_hash in link
    assert link in message.params["body"]
    # The subject task is untouched: its one operation, its journal without the message.
    assert list(Operation.objects.filter(task_id=op.task_id).values_list("pk", flat=True)) == [
        op.pk
    ]

    factories.run_claimable(day_task)
    message.refresh_from_db()
    assert message.status == "succeeded"
    (sent,) = mail.outbox
    assert sent.to == ["op@example.test"]
    assert link in sent.body
    assert sent.extra_headers["Idempotency-Key"] == message.idempotency_key


def test_the_day_task_is_made_once():
    now = datetime.now(UTC)
    first = notification_task_id(now)
    assert notification_task_id(now + timedelta(seconds=1)) == first
    assert notification_task_id(now + timedelta(days=1)) != first


def test_watchers_hear_of_a_failed_task_and_admins_too_but_not_operators():
    owner = factories.agent()
    task = factories.task(owner)
    admin = factories.console_user("admin")
    watcher = _operator("watcher@example.test")
    factories.console_user("operator")  # neither watching nor able to act
    for person, email in ((admin, "admin@example.test"),):
        user = person.actor_user()
        user.email = email
        user.save(update_fields=["email"])
    TaskWatch.objects.create(task=task, user_id=watcher.actor.user_id, created_at=datetime.now(UTC))
    task_fail(owner.actor, task.pk, "gave up")
    now = datetime.now(UTC)
    fan_out(now)
    reasons = dict(Notification.objects.values_list("recipient", "reason"))
    assert reasons == {
        f"user:{admin.actor.user_id}": "admin",
        f"user:{watcher.actor.user_id}": "watcher",
    }


def test_later_notifications_within_the_minute_are_folded_into_one_digest():
    operator = _operator()
    owner = factories.agent()
    t0 = datetime.now(UTC)
    _gated(owner, "a")
    fan_out(t0)
    assert dispatch_due(t0) == 1
    _gated(owner, "b")
    _gated(owner, "c")
    fan_out(t0 + timedelta(seconds=10))
    # Within the minute: no second message; both wait for the next one.
    assert dispatch_due(t0 + timedelta(seconds=20)) == 0
    waiting = Notification.objects.filter(operation__isnull=True)
    assert waiting.count() == 2
    assert {n.due_at for n in waiting} == {t0 + timedelta(seconds=60)}
    assert dispatch_due(t0 + timedelta(seconds=59)) == 0
    assert dispatch_due(t0 + timedelta(seconds=61)) == 1
    digest = Operation.objects.filter(tool="notify.email").order_by("created_at").last()
    assert digest is not None
    assert len(digest.params["notifications"]) == 2
    assert digest.params["subject"].endswith("(2)")
    assert Notification.objects.filter(operation=digest).count() == 2
    first = Notification.objects.filter(operation=digest).order_by("created_at", "id").first()
    assert first is not None
    assert digest.idempotency_key == "sys_runtime/" + key_notice(
        f"digest-{first.pk}", f"user:{operator.actor.user_id}", "email"
    )


def test_quiet_hours_hold_notifications_until_they_end():
    operator = _operator()
    NotificationPreference.objects.create(
        user_id=operator.actor.user_id,
        quiet_start=time(22, 0),
        quiet_end=time(7, 0),
        timezone="UTC",
        updated_at=datetime.now(UTC),
    )
    owner = factories.agent()
    _gated(owner)
    night = datetime(2026, 12, 4, 23, 30, tzinfo=UTC)
    fan_out(night)
    note = Notification.objects.get()
    assert note.held == "quiet_hours"
    assert note.due_at == datetime(2026, 12, 5, 7, 0, tzinfo=UTC)
    assert dispatch_due(night + timedelta(hours=3)) == 0
    assert dispatch_due(datetime(2026, 12, 5, 7, 1, tzinfo=UTC)) == 1


def test_quiet_until_spans_midnight_and_reads_the_persons_time_zone():
    pref = NotificationPreference(quiet_start=time(22, 0), quiet_end=time(7, 0), timezone="UTC")
    assert quiet_until(pref, datetime(2026, 1, 1, 21, 59, tzinfo=UTC)) is None
    assert quiet_until(pref, datetime(2026, 1, 1, 6, 0, tzinfo=UTC)) == datetime(
        2026, 1, 1, 7, 0, tzinfo=UTC
    )
    day = NotificationPreference(
        quiet_start=time(12, 0), quiet_end=time(13, 0), timezone="Asia/Tokyo"
    )
    # 03:30 UTC is 12:30 in Tokyo: quiet until 13:00 there, 04:00 UTC.
    until = quiet_until(day, datetime(2026, 1, 1, 3, 30, tzinfo=UTC))
    assert until is not None and until.astimezone(UTC) == datetime(2026, 1, 1, 4, 0, tzinfo=UTC)
    assert quiet_until(NotificationPreference(), datetime(2026, 1, 1, tzinfo=UTC)) is None


def test_private_loopback_and_link_local_hosts_are_refused_unless_allowed():
    for host in ("127.0.0.1", "localhost", "10.1.2.3", "169.254.169.254", "::1", "192.168.0.1"):
        with pytest.raises(PrivateHost):
            host_addresses(host, 80)
    with override_settings(NOTIFY_ALLOW_PRIVATE_HOSTS=True):
        assert host_addresses("127.0.0.1", 80) == ["127.0.0.1"]


class _Receiver(BaseHTTPRequestHandler):
    got: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append({"headers": dict(self.headers), "body": body})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def _webhook_context() -> Any:
    owner = factories.agent()
    task = factories.task(owner)
    op = Operation(
        pk="op_test",
        task_id=task.pk,
        tool="notify.webhook",
        step="notify.approval_requested",
        idempotency_key="sys_runtime/notice:nev_1:endpoint%3Aenv-webhook:webhook",
        params={"endpoint": "env-webhook", "payload": {"kind": "approval_requested"}},
    )
    return invocation_context(op, fencing_token=1, invocation_number=1)


def test_a_webhook_is_signed_and_the_check_refuses_altered_or_replayed_ones():
    _Receiver.got = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        with override_settings(
            NOTIFY_WEBHOOK_URL=url, NOTIFY_WEBHOOK_SECRET="s3cret", NOTIFY_ALLOW_PRIVATE_HOSTS=True
        ):
            ctx = _webhook_context()
            adapter_for("notify.webhook").invoke(ctx)
        with override_settings(NOTIFY_WEBHOOK_URL=url, NOTIFY_WEBHOOK_SECRET="s3cret"):
            # The same webhook on a loopback address, not allowed: refused, never retried.
            with pytest.raises(ToolFailure) as refused:
                adapter_for("notify.webhook").invoke(ctx)
            assert refused.value.kind == ToolFailure.PERMANENT
    finally:
        server.shutdown()
    (got,) = _Receiver.got
    headers, body = got["headers"], got["body"]
    assert headers["Idempotency-Key"] == ctx.idempotency_key
    assert json.loads(body)["id"] == ctx.idempotency_key
    ts, sig = headers["X-Console-Timestamp"], headers["X-Console-Signature"]
    assert sig.startswith("v1=")
    assert webhook_signature_valid("s3cret", timestamp=ts, body=body, signature=sig)
    assert not webhook_signature_valid("other", timestamp=ts, body=body, signature=sig)
    altered = body.replace(b"approval_requested", b"approval_granted")
    assert not webhook_signature_valid("s3cret", timestamp=ts, body=altered, signature=sig)
    assert not webhook_signature_valid(
        "s3cret", timestamp=str(int(ts) + 1), body=body, signature=sig
    )
    # Replayed later than the tolerance: refused although the signature is the one sent.
    assert not webhook_signature_valid(
        "s3cret", timestamp=ts, body=body, signature=sig, now=int(ts) + 301
    )


def test_slack_endpoint_gets_its_own_message_and_webhook_payload_links_the_approval():
    with override_settings(
        NOTIFY_WEBHOOK_URL="https://hooks.example.test/x",
        NOTIFY_WEBHOOK_SECRET="s",
        NOTIFY_SLACK_WEBHOOK_URL="https://hooks.slack.example.test/T/B/C",
    ):
        owner = factories.agent()
        _, approval = _gated(owner)
        now = datetime.now(UTC)
        fan_out(now)
        assert dispatch_due(now) == 2
    hook = Operation.objects.get(tool="notify.webhook")
    (item,) = hook.params["payload"]["items"]
    assert (item["approval"], item["params_hash"]) == (approval.pk, approval.params_hash)
    assert item["link"] == approval_link(approval)
    slack = Operation.objects.get(tool="notify.slack")
    assert approval_link(approval) in slack.params["text"]
    assert adapter_for("notify.slack").contract == "none"
    assert adapter_for("notify.webhook").contract == "replay"


def test_an_unresolved_operation_reaches_support_not_operators():
    support = factories.console_user("support")
    user = support.actor_user()
    user.email = "support@example.test"
    user.save(update_fields=["email"])
    _operator()
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.notify", params={"to": "x", "message": "m", "_fault": "unknown"}
    )
    factories.run_claimable(task.pk)
    op.refresh_from_db()
    assert op.status == "unresolved"
    event = NotificationEvent.objects.get(kind="operation_unresolved")
    assert event.operation_id == op.pk
    fan_out(datetime.now(UTC))
    assert list(Notification.objects.values_list("recipient", "reason")) == [
        (f"user:{support.actor.user_id}", "support")
    ]


def test_a_callers_key_may_not_take_the_notice_domain():
    with pytest.raises(ValueError):
        given_key_check("notice:nev_1:user%3A1:email")
    with pytest.raises(InvalidInput):
        preference_save(
            _operator().actor,
            email_enabled=True,
            email="",
            quiet_start=time(1, 0),
            quiet_end=None,
            tz="UTC",
        )


def test_no_agent_may_propose_a_notification_tool():
    owner = factories.agent()
    task = factories.task(owner)
    for tool in ("notify.email", "notify.webhook", "notify.slack"):
        with pytest.raises(UnknownTool):
            operation_propose(
                owner.actor,
                task.pk,
                OperationSpec(
                    tool=tool,
                    params={"to": ["x@example.test"], "subject": "s", "body": "b"},
                    step="spam",
                ),
            )
    assert not Operation.objects.filter(tool__startswith="notify.").exists()


def test_an_approval_about_to_expire_is_reminded_once_and_a_wait_reaches_admins():
    admin = factories.console_user("admin")
    user = admin.actor_user()
    user.email = "admin@example.test"
    user.save(update_fields=["email"])
    owner = factories.agent()
    _, approval = _gated(owner)
    wait = factories.operation(
        owner,
        factories.task(owner),
        kind="wait_signal",
        tool="",
        signal="go",
        timeout_seconds=3600,
    )
    now = datetime.now(UTC)
    # Nothing is close to expiring yet.
    assert expiry_notice_sweep(now) == 0
    later = approval.expires_at - timedelta(seconds=300)
    Operation.objects.filter(pk=wait.pk).update(wait_until=later + timedelta(seconds=60))
    assert expiry_notice_sweep(later) == 2
    assert expiry_notice_sweep(later + timedelta(seconds=5)) == 0  # once
    fan_out(later)
    kinds = dict(Notification.objects.values_list("kind", "reason"))
    assert kinds["approval_expiring"] == "operator"  # an admin holds the operator's right
    assert kinds["wait_expiring"] == "admin"


def test_adding_and_removing_a_webhook_is_audited_with_its_admin_and_never_its_url():
    """Where notifications go is an access change (they link to approvals): each addition and
    removal is an audit record naming the admin, beside the tokens' ones; the URL's path and
    query (a secret for many receivers) stay sealed."""
    admin = factories.console_user("admin")
    endpoint, _ = endpoint_create(
        admin.actor,
        name="on-call",
        url="https://hooks.example.test/secret-path?t=abc",
        fmt="webhook",
        kinds=[],
    )
    endpoint_remove(admin.actor, endpoint.pk)
    records = AuditRecord.objects.filter(subject=f"endpoint:{endpoint.pk}").order_by("id")
    assert [(r.action, r.actor) for r in records] == [
        ("endpoint.added", admin.actor.label),
        ("endpoint.removed", admin.actor.label),
    ]
    assert all("secret-path" not in json.dumps(r.detail) for r in records)
