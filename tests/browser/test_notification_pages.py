"""Notifications in a real browser: the link a message carries opens that exact approval (its
id and parameter hash shown, no decision taken by opening it); /notifications/ shows the
delivery and links its operation; /settings/notifications/ saves a person's channel and quiet
hours and lets an admin add a webhook (its secret shown once) and remove it; a task's page
watches the task; on a 390 px screen nothing scrolls sideways."""

from __future__ import annotations

import re
from datetime import UTC, datetime, time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test.utils import override_settings
from playwright.sync_api import Browser, Page, expect

from runtime.models import (
    Approval,
    NotificationEndpoint,
    NotificationPreference,
    Operation,
    TaskWatch,
)
from runtime.notifications.dispatch import dispatch_due
from runtime.notifications.fanout import fan_out
from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _operator_with_email() -> factories.Principal:
    person = factories.console_user("operator")
    user = person.actor_user()
    user.email = "op@example.test"
    user.save(update_fields=["email"])
    return person


def _approval_message(base_url: str) -> tuple[Approval, Operation]:
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 40000}
    )
    now = datetime.now(UTC)
    with override_settings(CONSOLE_URL=base_url):
        fan_out(now)
        dispatch_due(now)
    return Approval.objects.get(operation=op), Operation.objects.get(tool="notify.email")


def test_the_messages_link_opens_that_approval_and_the_delivery_is_shown(page: Page, server):
    operator = _operator_with_email()
    approval, message = _approval_message(server.url)
    link = re.search(r"http\S+", message.params["body"])
    assert link is not None
    login(page, server.url, operator.actor.name)
    page.goto(link.group(0))
    card = page.locator(f'section[data-approval="{approval.pk}"]')
    expect(card).to_be_visible()
    expect(card).to_contain_text(approval.params_hash)
    query = parse_qs(urlsplit(page.url).query)
    assert (query["approval"], query["params_hash"]) == ([approval.pk], [approval.params_hash])
    # Opening the link decided nothing.
    assert Approval.objects.get(pk=approval.pk).status == "pending"

    page.locator("nav a", has_text="Notifications").click()
    page.wait_for_url(f"{server.url}/notifications/")
    row = page.locator("#notification-table tr[data-kind=approval_requested]")
    expect(row).to_contain_text("email")
    expect(row.locator("[data-delivery]")).to_have_text("pending")
    row.locator(f'a[href="/operations/{message.pk}/"]').click()
    page.wait_for_url(f"{server.url}/operations/{message.pk}/")
    expect(page.locator("body")).to_contain_text("notify.email")
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_a_person_sets_quiet_hours_and_watches_a_task(page: Page, server):
    operator = _operator_with_email()
    owner = factories.agent()
    task = factories.task(owner)
    login(page, server.url, operator.actor.name)
    page.goto(f"{server.url}/settings/notifications/")
    form = page.locator("#preferences-form")
    form.locator("input[name=email]").fill("night@example.test")
    form.locator("input[name=quiet_start]").fill("22:00")
    form.locator("input[name=quiet_end]").fill("07:00")
    form.locator("input[name=timezone]").fill("Europe/Paris")
    form.get_by_role("button", name="Save").click()
    expect(page.locator("ul.messages")).to_contain_text("saved")
    pref = NotificationPreference.objects.get(user_id=operator.actor.user_id)
    assert (pref.email, pref.quiet_start, pref.quiet_end, pref.timezone) == (
        "night@example.test",
        time(22, 0),
        time(7, 0),
        "Europe/Paris",
    )
    # An admin's webhook form is not offered to an operator.
    expect(page.locator("#endpoint-form")).to_have_count(0)

    page.goto(f"{server.url}/tasks/{task.pk}/")
    page.get_by_role("button", name="Watch this task").click()
    expect(page.locator("ul.messages")).to_contain_text("You watch this task")
    expect(page.get_by_role("button", name="Stop watching")).to_be_visible()
    assert TaskWatch.objects.filter(task=task, user_id=operator.actor.user_id).exists()
    page.get_by_role("button", name="Stop watching").click()
    expect(page.get_by_role("button", name="Watch this task")).to_be_visible()
    assert not TaskWatch.objects.filter(task=task).exists()


def test_an_admin_adds_a_webhook_sees_its_secret_once_and_removes_it(page: Page, server):
    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/settings/notifications/")
    form = page.locator("#endpoint-form")
    form.locator("input[name=name]").fill("ops hook")
    form.locator("input[name=url]").fill("https://hooks.example.test/secret-path?t=abc")
    form.locator("input[value=approval_requested]").check()
    form.get_by_role("button", name="Add webhook").click()
    secret = page.locator("#issued-secret").inner_text()
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    endpoint = NotificationEndpoint.objects.get()
    # Nothing of the secret, nor the URL's path, is stored in clear.
    assert secret not in str(endpoint.__dict__)
    assert "secret-path" not in endpoint.url_sealed
    assert endpoint.kinds == ["approval_requested"]
    page.goto(f"{server.url}/settings/notifications/")
    expect(page.locator("#issued-secret")).to_have_count(0)
    item = page.locator(f'#endpoint-list li[data-endpoint="{endpoint.pk}"]')
    expect(item).to_contain_text("https://hooks.example.test/")
    expect(item).not_to_contain_text("secret-path")
    page.once("dialog", lambda dialog: dialog.accept())
    item.get_by_role("button", name="Remove").click()
    expect(page.locator("ul.messages")).to_contain_text("removed")
    assert not NotificationEndpoint.objects.get(pk=endpoint.pk).active


def test_the_pages_fit_a_390_px_screen(browser: Browser, server):
    _operator_with_email()
    _approval_message(server.url)
    admin = factories.console_user("admin")
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        phone = ctx.new_page()
        login(phone, server.url, admin.actor.name)
        for path in ("/notifications/", "/settings/notifications/"):
            phone.goto(f"{server.url}{path}")
            assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390, path
    finally:
        ctx.close()
