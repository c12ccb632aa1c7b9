"""Presence on the people's queues (issue 39): two people with the inbox open each see the
other's name ("Also here"), and the card the other is on ("… is looking"), without reloading;
when one leaves (navigates away, closes the tab) the other's page stops naming them. One who
does not work the queue is neither shown the list nor named in it. Polled with Playwright's
expect, never slept."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _context(browser: Browser) -> BrowserContext:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    return ctx


def test_two_people_on_the_inbox_see_each_other_until_one_leaves(
    page: Page, browser: Browser, server
):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a-7", "amount_cents": 25000}
    )
    factories.console_user("operator", "alice")
    factories.console_user("operator", "bob")
    factories.console_user("support", "sam")

    bobs, sams = _context(browser), _context(browser)
    try:
        bob_page, sam_page = bobs.new_page(), sams.new_page()
        login(page, server.url, "alice")
        login(bob_page, server.url, "bob")
        login(sam_page, server.url, "sam")
        # Sam (support) may read the inbox but does not work it: no list, and no name of his.
        sam_page.goto(f"{server.url}/approvals/")
        wait_live(sam_page)
        expect(sam_page.locator("#presence")).to_have_count(0)

        page.goto(f"{server.url}/approvals/")
        bob_page.goto(f"{server.url}/approvals/")
        alice_sees, bob_sees = page.locator("#presence"), bob_page.locator("#presence")
        expect(alice_sees).to_have_text("Also here: bob")
        expect(bob_sees).to_have_text("Also here: alice")

        # Alice moves to the request (j): Bob's card says she is on it.
        card = f'section.approval .work[data-work="{op.pk}"]'
        page.keyboard.press("j")
        expect(bob_page.locator(card).locator(".looking")).to_have_text("alice is looking")

        # Bob navigates away: Alice's page stops naming him.
        bob_page.goto(f"{server.url}/tasks/")
        expect(alice_sees).to_be_hidden()
        expect(alice_sees).not_to_contain_text("bob")

        # Back in a new tab, then the tab closed.
        tab = bobs.new_page()
        tab.goto(f"{server.url}/approvals/")
        expect(alice_sees).to_have_text("Also here: bob")
        expect(tab.locator(card).locator(".looking")).to_have_text("alice is looking")
        tab.close()
        expect(alice_sees).to_be_hidden()
        assert page.page_errors == []  # type: ignore[attr-defined]
    finally:
        bobs.close()
        sams.close()
