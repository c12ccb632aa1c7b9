"""Releasing money is guarded, and a decision half made survives a lost session (issue 39 points 2
and 3), in a real browser: Approve and "Approve selected" on a tool with effects ask first, naming
the amount and what will run, and dismissing the question approves nothing; a reason typed before
the session ended is still in its field after the new login, and the inbox opens at the request
it was typed for."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from runtime.models import Approval, Operation, Task
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _charge(owner: Any, task: Task, amount: int, account: str = "acct-42") -> Approval:
    op = factories.operation(
        owner,
        task,
        step=f"pay-{amount}",
        tool="demo.payments.charge",
        params={"account": account, "amount_cents": amount},
    )
    return Approval.objects.get(operation=op)


def test_approve_and_approve_selected_name_the_amount_and_dismissing_approves_nothing(
    page: Page, server
):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    small = _charge(owner, task, 12000)
    large = _charge(owner, task, 30000, account="acct-1042")
    login(page, server.url, factories.console_user("operator").actor.name)
    page.goto(f"{server.url}/approvals/")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    asked: list[str] = []

    # One request: the amount, the tool and its key parameters; dismissed, nothing is sent.
    card = page.locator(f'section.approval[data-approval="{small.pk}"]')
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    card.get_by_role("button", name="Approve", exact=True).click()
    page.evaluate("1")  # a round trip through the page: a submit would have started by now
    assert len(asked) == 1, asked
    assert f"Approve request {small.pk} and release $120.00 (12000 cents)?" in asked[0]
    assert "What will run: demo.payments.charge with account acct-42." in asked[0]
    assert "cannot be undone" in asked[0]
    assert posts == []

    # Several: each one's line and the sum; dismissed, nothing is sent either.
    page.locator(f'input[name=selected][value^="{small.pk}|"]').check()
    page.locator(f'input[name=selected][value^="{large.pk}|"]').check()
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Approve selected").click()
    page.evaluate("1")
    assert len(asked) == 2, asked
    question = asked[1]
    assert question.startswith("Approve the 2 selected request(s)? What will run:")
    assert f"{small.pk}: demo.payments.charge with account acct-42, $120.00 (12000 cents)" in (
        question
    )
    assert f"{large.pk}: demo.payments.charge with account acct-1042, $300.00 (30000 cents)" in (
        question
    )
    assert "In all: 420.00 USD (42000 cents)" in question
    assert posts == []
    assert {a.status for a in Approval.objects.filter(pk__in=[small.pk, large.pk])} == {"pending"}
    assert Operation.objects.filter(status="waiting_approval").count() == 2

    # Accepted, the one asked about is approved.
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("ul.messages")).to_contain_text(f"Request {small.pk} is approved")
    assert Approval.objects.get(pk=small.pk).status != "pending"
    assert Approval.objects.get(pk=large.pk).status == "pending"
    assert page.page_errors == []  # type: ignore[attr-defined]


def _log_in_again(page: Page, name: str) -> None:
    page.wait_for_url("**/login/**")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Log in").click()


def test_a_reason_typed_before_the_session_ended_survives_the_login_and_the_inbox_opens_at_it(
    page: Page, server
):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    # Thirty requests: the ones the person works on are far down the inbox.
    requests = [_charge(owner, task, 20000 + 100 * i) for i in range(30)]
    edited, denied = requests[-2], requests[-1]
    person = factories.console_user("operator")
    login(page, server.url, person.actor.name)
    page.goto(f"{server.url}/approvals/")

    # Typed, then the session ends before anything is sent: a reload goes through the login
    # and back to the same request, the words still there.
    card = page.locator(f"#request-{edited.pk}")
    card.locator("summary", has_text="Edit").click()
    card.locator("input[name=reason]").last.fill("cap it at the contract's limit")
    page.context.clear_cookies(name="sessionid")
    page.reload()
    _log_in_again(page, person.actor.name)
    page.wait_for_url(f"{server.url}/approvals/#request-{edited.pk}")
    expect(card.locator("input[name=reason]").last).to_have_value("cap it at the contract's limit")
    expect(card).to_have_class("card approval is-current")
    expect(card).to_be_in_viewport()

    # Typed and sent after the session ended: not taken, and after the login the inbox opens at
    # that request with the reason in its field, ready to send again.
    card = page.locator(f"#request-{denied.pk}")
    card.get_by_placeholder("reason (required)").fill("duplicate of last week's invoice")
    page.context.clear_cookies(name="sessionid")
    page.once("dialog", lambda d: d.accept())
    card.get_by_role("button", name="Deny", exact=True).click()
    _log_in_again(page, person.actor.name)
    page.wait_for_url(f"{server.url}/approvals/#request-{denied.pk}")
    expect(page.locator("ul.messages li.warning")).to_contain_text(
        f"your decision on request {denied.pk} was NOT taken"
    )
    reason = card.get_by_placeholder("reason (required)")
    expect(reason).to_have_value("duplicate of last week's invoice")
    expect(card).to_be_in_viewport()
    assert Approval.objects.get(pk=denied.pk).status == "pending"

    page.once("dialog", lambda d: d.accept())
    card.get_by_role("button", name="Deny", exact=True).click()
    expect(page.locator("ul.messages li.success")).to_contain_text(f"Request {denied.pk} is denied")
    decided = Approval.objects.get(pk=denied.pk)
    assert (decided.status, decided.reason) == ("denied", "duplicate of last week's invoice")
    # Done: the words are not kept any longer.
    kept = page.evaluate("Object.keys(sessionStorage).filter(k => k.includes('deny-'))")
    assert kept == [], kept
    assert page.page_errors == []  # type: ignore[attr-defined]
