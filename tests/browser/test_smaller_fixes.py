"""The smaller things a team on shift hit (issue 39 point 8), in a real browser: "Mark succeeded"
asks for the evidence before any question; no time says "UTC UTC"; GET /logout/ is a page with
the button; cancelling an expired wait's step is said in plain words, with a typed reason; the
dashboard's unresolved counts agree; the search finds a parameter value."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Operation
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _expired_charge() -> tuple[Operation, Approval]:
    owner = factories.agent()
    op = factories.operation(
        owner,
        factories.task(owner, "pay the supplier"),
        tool="demo.payments.charge",
        params={"account": "acct-1042", "amount_cents": 30000},
    )
    Approval.objects.filter(operation=op).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire_sweep() == 1
    return op, Approval.objects.get(operation=op)


def test_mark_succeeded_asks_for_the_evidence_before_the_question(page: Page, server):
    op = factories.unresolved_operation()
    login(page, server.url, factories.console_user("support").actor.name)
    page.goto(f"{server.url}/unresolved/")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Mark succeeded").click()
    evidence = page.locator("form.resolve textarea[name=evidence]")
    expect(evidence).to_be_focused()
    assert "Write the evidence first" in evidence.evaluate("e => e.validationMessage")
    page.evaluate("1")
    assert asked == [] and posts == []
    evidence.fill("provider log shows delivery")
    page.get_by_role("button", name="Mark succeeded").click()
    page.evaluate("1")
    assert len(asked) == 1 and "as succeeded?" in asked[0], asked
    assert Operation.objects.get(pk=op.pk).status == "unresolved"


def test_waits_say_utc_once_and_cancel_a_step_with_a_typed_reason(page: Page, server):
    op, approval = _expired_charge()
    login(page, server.url, factories.console_user("admin").actor.name)
    page.goto(f"{server.url}/waits/")
    card = page.locator(f'section.wait[data-operation="{op.pk}"]')
    expect(card.locator("time")).to_contain_text(" UTC")
    assert "UTC UTC" not in page.locator("main").inner_text()
    expect(card.get_by_role("button", name="Transform")).to_have_count(0)
    card.get_by_label(f"Why you cancel {op.pk}").fill("the supplier was paid by bank transfer")
    page.once("dialog", lambda d: d.accept())
    card.get_by_role("button", name="Deny and cancel this step").click()
    expect(page.locator("ul.messages")).to_contain_text(f"Operation {op.pk} is cancelled")
    denied = Approval.objects.get(pk=approval.pk)
    assert Operation.objects.get(pk=op.pk).status == "cancelled"
    assert "the supplier was paid by bank transfer" in (
        (denied.reason or "") + Operation.objects.get(pk=op.pk).status_reason
    )
    for path in ("/approvals/", "/schedules/"):
        page.goto(f"{server.url}{path}")
        assert "UTC UTC" not in page.locator("main").inner_text(), path


def test_get_logout_shows_a_page_with_the_button(page: Page, server):
    login(page, server.url, factories.console_user("operator").actor.name)
    response = page.goto(f"{server.url}/logout/")
    assert response is not None and response.status == 200
    page.locator("#logout-form").get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{server.url}/login/")
    response = page.goto(f"{server.url}/approvals/")
    assert "/login/" in page.url


def test_the_dashboard_counts_agree_and_the_search_finds_a_parameter_value(page: Page, server):
    unresolved = factories.unresolved_operation()
    owner = factories.agent()
    task = factories.task(owner, "refund a customer")
    factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": "acct-1042", "amount_cents": 30000},
    )
    login(page, server.url, factories.console_user("operator").actor.name)
    page.goto(f"{server.url}/")
    expect(page.locator('[data-need="unresolved"] .count')).to_have_text("1")
    expect(page.locator("#open-unresolved")).to_contain_text(
        "1 open task waits for support on 1 unresolved operation"
    )
    expect(page.locator('[data-count="open-unresolved"]')).to_have_text("1")
    assert unresolved.status == "unresolved"

    page.goto(f"{server.url}/tasks/")
    page.get_by_label("Search").fill("acct-1042")
    page.get_by_label("Search").press("Enter")
    page.wait_for_url("**/tasks/?q=acct-1042*")
    rows: Any = page.locator("table tbody tr")
    expect(rows.filter(has_text="refund a customer")).to_have_count(1)
    expect(rows.filter(has_text="tell the customer")).to_have_count(0)
