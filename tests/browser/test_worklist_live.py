"""Two people on the inbox at once (issue 39): one takes a request and the other sees it taken,
by whom and since when, without reloading (the journal's hint over Channels refreshes the
card), and it leaves the other's "to do"; a comment shows up on the other's page, as text.
Polled with Playwright's expect, never slept."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from runtime.models import Approval, Resolution
from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_one_takes_a_request_and_the_other_sees_it_taken_and_its_comment(
    page: Page, browser: Browser, server
):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a-7", "amount_cents": 25000}
    )
    approval = Approval.objects.get(operation=op)
    alice = factories.console_user("operator")
    bob = factories.console_user("operator")

    other = browser.new_context(viewport={"width": 1280, "height": 900})
    other.set_default_timeout(TIMEOUT_MS)
    try:
        bob_page = other.new_page()
        login(page, server.url, alice.actor.name)
        login(bob_page, server.url, bob.actor.name)
        page.goto(f"{server.url}/approvals/")
        bob_page.goto(f"{server.url}/approvals/?view=all")
        bob_todo = other.new_page()
        bob_todo.goto(f"{server.url}/approvals/")
        for p in (page, bob_page, bob_todo):
            wait_live(p)
        card = f'section.approval[data-approval="{approval.pk}"]'
        bob_card = bob_page.locator(card)
        expect(bob_card.locator(".holder")).to_contain_text("Nobody has taken it")
        expect(bob_todo.locator(card)).to_be_visible()

        # Taken from the keyboard: j picks the request, t takes it (its Take button).
        page.keyboard.press("j")
        page.keyboard.press("t")
        expect(page.locator(card).locator(".holder")).to_contain_text("You have it")

        # Bob's pages move on their own: "All" names the holder and since when; "To do" lets
        # the request go.
        expect(bob_card.locator(".holder")).to_contain_text(f"Taken by {alice.actor.name}")
        expect(bob_card.locator(".holder time")).to_have_attribute(
            "datetime", re.compile(r"^\d{4}-")
        )
        expect(bob_card.get_by_role("button", name="Take")).to_have_count(0)
        expect(bob_todo.locator(card)).to_have_count(0)
        expect(bob_todo.locator("#approvals-empty")).to_contain_text("every waiting request")

        note = "asked finance <b>twice</b>"
        page.locator(card).get_by_text("Comments (0)").click()
        page.locator(card).get_by_label(f"Comment on {op.pk}").fill(note)
        page.locator(card).get_by_role("button", name="Add comment").click()
        comment = bob_card.locator(".comment")
        expect(comment.locator(".comment-text")).to_have_text(note)
        expect(comment.locator(".who")).to_have_text(alice.actor.label)
        expect(bob_card.locator(".comment-text b")).to_have_count(0)
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        other.close()


def test_support_settles_a_group_of_alike_operations_with_one_evidence(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "tell the customers")
    alike = [factories.unresolved_operation(owner, task) for _ in range(3)]
    support = factories.console_user("support")
    login(page, server.url, support.actor.name)
    page.goto(f"{server.url}/unresolved/")
    group = page.locator("section.unresolved-group")
    expect(group.get_by_role("heading")).to_contain_text("3 alike · demo.notify")

    # One of them is left out of this settle.
    group.get_by_role("checkbox", name=alike[2].pk).uncheck()
    group.get_by_label("Evidence (recorded for each)").fill("provider log: nothing was sent")
    asked: list[str] = []

    def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    group.get_by_role("button", name="Mark no effect (all selected)").click()
    expect(page.locator("ul.messages")).to_contain_text(f"Resolved {alike[0].pk}")
    expect(page.locator("ul.messages")).to_contain_text(f"Resolved {alike[1].pk}")
    assert "Your evidence is recorded for each" in asked[0]
    audit = Resolution.objects.filter(operation__in=alike)
    assert sorted(a.operation_id for a in audit) == sorted(op.pk for op in alike[:2])
    assert {a.evidence for a in audit} == {"provider log: nothing was sent"}
    # The one left out waits alone: no group any more, its own card still there.
    expect(page.locator("section.unresolved-group")).to_have_count(0)
    expect(page.locator(f'section.unresolved[data-operation="{alike[2].pk}"]')).to_be_visible()
