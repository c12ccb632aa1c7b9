"""Operators and admins in a real browser: a request appears live on /approvals/, is approved and
the charge happens once at the receiver; an edit is approved by a second operator; an admin
renews an expired wait. The real ASGI server (uvicorn), real workers, real Chromium."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Event, Operation
from runtime.sandbox import receivers
from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login, wait_live
from tests.conftest import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _charge(owner, task, amount=25000, step="pay"):
    return factories.operation(
        owner,
        task,
        step=step,
        tool="demo.payments.charge",
        params={"account": "acct-42", "amount_cents": amount},
    )


def test_an_operator_sees_a_request_arrive_live_approves_it_and_it_is_charged_once(
    page: Page, server, workers
):
    workers.start(count=1, concurrency=1)
    person = factories.console_user("operator")
    login(page, server.url, person.actor.name)
    page.goto(f"{server.url}/approvals/")
    wait_live(page)
    page.evaluate("window.__marker = 1")
    expect(page.locator("#approvals-empty")).to_be_visible()

    owner = factories.agent()
    task = factories.task(owner, "pay the supplier")
    op = _charge(owner, task)
    card = page.locator(f'section.approval[data-approval="{op.approvals.get().pk}"]')
    expect(card).to_be_visible()
    assert page.evaluate("window.__marker") == 1  # arrived without a reload
    expect(card).to_contain_text("demo.payments.charge")
    expect(card).to_contain_text("250.00")
    expect(card).to_contain_text(owner.actor.label)
    expect(card.locator("pre.params")).to_contain_text('"account": "acct-42"')

    # Another request, decided elsewhere (over the API), disappears without a reload.
    other = _charge(owner, task, amount=12000, step="pay-later")
    other_approval = other.approvals.get()
    other_card = page.locator(f'section.approval[data-approval="{other_approval.pk}"]')
    expect(other_card).to_be_visible()
    decided = (
        factories.console_user("operator")
        .client()
        .post(
            f"/api/v1/approvals/{other_approval.pk}/decision",
            {"decision": "deny", "reason": "not now", "params_hash": other_approval.params_hash},
            format="json",
        )
    )
    assert decided.status_code == 200
    expect(other_card).to_have_count(0)
    assert page.evaluate("window.__marker") == 1

    page.once("dialog", lambda d: d.accept())  # it names the amount (test_guarded_release.py)
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("ul.messages")).to_contain_text("approved")
    expect(page.locator("#approvals-empty")).to_be_visible()

    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the approved charge to run",
    )
    effects = receivers.effects_under("payments", op.idempotency_key)
    assert [e["amount_cents"] for e in effects] == [25000]
    approval = Approval.objects.get(operation=op)
    assert approval.status == "released" and approval.decided_by == person.actor.label
    assert page.page_errors == []  # type: ignore[attr-defined]


def _second_page(browser: Browser) -> Page:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    return ctx.new_page()


def test_an_operator_edits_a_proposal_and_a_second_operator_approves_the_new_version(
    page: Page, browser: Browser, server, workers
):
    workers.start(count=1, concurrency=1)
    owner = factories.agent()
    task = factories.task(owner, "pay with a cap")
    op = _charge(owner, task, amount=30000)
    first_approval = Approval.objects.get(operation=op)

    editor = factories.console_user("operator")
    login(page, server.url, editor.actor.name)
    page.goto(f"{server.url}/approvals/")
    card = page.locator(f'section.approval[data-approval="{first_approval.pk}"]')
    card.locator("summary", has_text="Edit").click()
    card.locator("textarea[name=params]").fill('{"account": "acct-42", "amount_cents": 15000}')
    card.locator("input[name=reason]").last.fill("cap at 150")
    card.get_by_role("button", name="Save as a new proposal").click()
    expect(page.locator("ul.messages")).to_contain_text("Proposal version 2")
    new = Approval.objects.get(operation=op, status="pending")
    new_card = page.locator(f'section.approval[data-approval="{new.pk}"]')
    expect(new_card).to_contain_text(f"edited by {editor.actor.label}")
    expect(new_card.locator('tr[data-diff="amount_cents"] td.before')).to_have_text("30000")
    expect(new_card.locator('tr[data-diff="amount_cents"] td.after')).to_have_text("15000")
    # The editor cannot release their own edit: the page offers no decision (policy), and a
    # forged one is a 403 (tests/console/test_human_pages.py).
    expect(new_card).to_contain_text("You may not decide it: the editor of a proposal")
    expect(new_card.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    assert Operation.objects.get(pk=op.pk).status == "waiting_approval"

    other = factories.console_user("operator")
    second = _second_page(browser)
    try:
        login(second, server.url, other.actor.name)
        second.goto(f"{server.url}/approvals/")
        other_card = second.locator(f'section.approval[data-approval="{new.pk}"]')
        expect(other_card).to_contain_text("proposal v2")
        second.once("dialog", lambda d: d.accept())
        other_card.get_by_role("button", name="Approve", exact=True).click()
        expect(second.locator("ul.messages")).to_contain_text(f"Request {new.pk} is approved")
    finally:
        second.context.close()

    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the edited charge to run",
    )
    effects = receivers.effects_under("payments", op.idempotency_key)
    assert [e["amount_cents"] for e in effects] == [15000]


def test_an_admin_renews_an_expired_wait(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "wait for a decision")
    op = _charge(owner, task)
    approval = Approval.objects.get(operation=op)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire_sweep() == 1

    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/")
    expect(page.locator('[data-need="waits"] .count')).to_have_text("1")
    page.locator('[data-need="waits"]').click()
    page.wait_for_url(f"{server.url}/waits/")
    wait_live(page)
    card = page.locator(f'section.wait[data-operation="{op.pk}"]')
    expect(card).to_contain_text("approval of demo.payments.charge")
    card.get_by_label(f"New validity in seconds for {op.pk}").fill("900")
    card.get_by_label(f"Reason to renew {op.pk}").fill("the approver is back")
    card.get_by_role("button", name="Renew").click()
    expect(page.locator("ul.messages")).to_contain_text(
        f"Renewed {op.pk}: it waits for an operator's decision again"
    )
    expect(page.locator("#waits-empty")).to_be_visible()

    approval.refresh_from_db()
    assert approval.status == "pending"
    assert approval.expires_at > timezone.now() + timedelta(seconds=800)
    renewed = Event.objects.get(task=task, type="approval.renewed")
    assert renewed.actor == admin.actor.label and renewed.data["reason"] == "the approver is back"
    # Back in the operators' queue.
    page.goto(f"{server.url}/approvals/")
    expect(page.locator(f'section.approval[data-approval="{approval.pk}"]')).to_be_visible()
