"""Alerts that visibly work (issue 39 point 5), in a real browser: "Send a test" posts a signed
test to a webhook (a receiver on this machine) and the page says what it answered; "Send a test
e-mail" writes a message to the console's mail directory and says where; a webhook that cannot
be reached says why; /notifications/ names each receiver (a person's name, a webhook's name)
and says why a delivery failed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.test.utils import override_settings
from playwright.sync_api import Page, expect

from runtime.models import AuditRecord, NotificationEndpoint, Operation
from runtime.notifications.dispatch import dispatch_due, notification_task_id
from runtime.notifications.endpoints import endpoint_create
from runtime.notifications.fanout import fan_out
from runtime.tools.notify import SIGNATURE_HEADER
from tests import factories
from tests.browser.conftest import login
from tests.conftest import KeptProcesses, free_port

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


class _Receiver(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.seen.append(  # type: ignore[attr-defined]
            {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
        )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def mail_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mail")


def test_send_a_test_to_a_webhook_and_by_e_mail_shows_each_outcome(
    page: Page,
    transactional_db: None,
    kept_processes: KeptProcesses,
    receiver: ThreadingHTTPServer,
    mail_dir: Path,
):
    # A local receiver is allowed in this deployment (as `make run` users would set it).
    server = kept_processes.server(
        NOTIFY_ALLOW_PRIVATE_HOSTS="1",
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
    )
    admin = factories.console_user("admin")
    user = admin.actor_user()
    user.email = "admin@example.test"
    user.save(update_fields=["email"])
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/settings/notifications/")

    form = page.locator("#endpoint-form")
    form.get_by_label("Name").fill("local receiver")
    form.get_by_label("URL").fill(f"http://127.0.0.1:{receiver.server_port}/hook")
    form.get_by_role("button", name="Add webhook").click()
    issued = page.locator("#issued-endpoint")
    expect(issued.get_by_role("button", name="Send a test now")).to_be_visible()
    endpoint = NotificationEndpoint.objects.get(name="local receiver")
    page.goto(f"{server.url}/settings/notifications/")
    item = page.locator(f'#endpoint-list li[data-endpoint="{endpoint.pk}"]')
    item.get_by_role("button", name="Send a test").click()
    said = page.locator("ul.messages li.success")
    expect(said).to_contain_text(
        f"Test post delivered to http://127.0.0.1:{receiver.server_port}/…: it answered HTTP 200."
    )
    seen = receiver.seen  # type: ignore[attr-defined]
    assert len(seen) == 1 and seen[0]["path"] == "/hook"
    assert seen[0]["body"]["kind"] == "test" and admin.actor.label in seen[0]["body"]["text"]
    assert seen[0]["headers"][SIGNATURE_HEADER].startswith("v1=")

    # A webhook nobody listens at: the page says why, in the receiver's words.
    closed = free_port()
    form.get_by_label("Name").fill("nobody home")
    form.get_by_label("URL").fill(f"http://127.0.0.1:{closed}/hook")
    form.get_by_role("button", name="Add webhook").click()
    dead = NotificationEndpoint.objects.get(name="nobody home")
    page.goto(f"{server.url}/settings/notifications/")
    page.locator(f'#endpoint-list li[data-endpoint="{dead.pk}"]').get_by_role(
        "button", name="Send a test"
    ).click()
    failed = page.locator("ul.messages li.error")
    expect(failed).to_contain_text(
        f"Test post to http://127.0.0.1:{closed}/… failed: cannot connect"
    )

    # E-mail: to the person's address, written to the mail directory.
    page.get_by_role("button", name="Send a test e-mail").click()
    expect(page.locator("ul.messages li.success")).to_contain_text(
        f"Test e-mail delivered to admin@example.test: written to {mail_dir}."
    )
    mails = list(mail_dir.iterdir())
    assert len(mails) == 1 and "admin@example.test" in mails[0].read_text()
    tests = AuditRecord.objects.filter(action="notification.test").order_by("at")
    assert [(t.actor, t.detail["delivered"]) for t in tests] == [
        (admin.actor.label, True),
        (admin.actor.label, False),
        (admin.actor.label, True),
    ]
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_the_notifications_page_names_each_receiver_and_why_a_delivery_failed(page: Page, server):
    admin = factories.console_user("admin")
    operator = factories.console_user("operator")
    user = operator.actor_user()
    user.email = "op@example.test"
    user.save(update_fields=["email"])
    NotificationEndpoint.objects.all().delete()
    hook, _ = _endpoint(admin, "on-call hook", "http://127.0.0.1:9/hook")
    owner = factories.agent()
    factories.operation(
        owner,
        factories.task(owner),
        tool="demo.payments.charge",
        params={"account": "acct-1042", "amount_cents": 40000},
    )
    now = datetime.now(UTC)
    fan_out(now)
    dispatch_due(now)
    # This process allows no private host: the post to 127.0.0.1 fails, permanently.
    factories.run_claimable(notification_task_id(now))
    post = Operation.objects.get(tool="notify.webhook")
    assert post.status == "failed"

    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/notifications/")
    to_hook = page.locator(f'#notification-table td[data-recipient="endpoint:{hook.pk}"]')
    expect(to_hook).to_contain_text("the webhook on-call hook")
    row = page.locator(f'#notification-table tr:has(td[data-recipient="endpoint:{hook.pk}"])')
    expect(row.locator("[data-delivery]")).to_have_text("failed")
    expect(row.locator(".delivery-reason")).to_contain_text(
        "127.0.0.1 is not a globally routable address; set NOTIFY_ALLOW_PRIVATE_HOSTS=1"
    )
    to_person = page.locator(f'#notification-table td[data-recipient="user:{user.pk}"]')
    expect(to_person).to_contain_text(operator.actor.name)
    assert page.page_errors == []  # type: ignore[attr-defined]


def _endpoint(admin: Any, name: str, url: str) -> tuple[NotificationEndpoint, str]:
    """An admin's webhook made as the settings page makes it (its URL checked when it is sent,
    not here: the server allows what this process does not)."""
    with override_settings(NOTIFY_ALLOW_PRIVATE_HOSTS=True):
        return endpoint_create(admin.actor, name=name, url=url, fmt="webhook", kinds=[])
