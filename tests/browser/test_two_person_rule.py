"""The two-person rule in the inbox (issue 39), in a real browser: a charge above 100000 cents needs
two distinct approvers. Operator A approves (the question says the action does not run yet); the
card then shows "Needs 2 approvals · approved by A (1 of 2)", A's Approve is disabled with why,
and A's "Approve selected" of it is refused; operator B, in another browser, approves it and the
release gate lets it run."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from runtime.executions import execution_for_agent
from runtime.models import Approval, ApprovalVote, Operation
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _two_person_charge(owner: Any) -> Approval:
    task = factories.task(owner, "pay the big supplier")
    op = factories.operation(
        owner,
        task,
        step="pay-big",
        tool="demo.payments.charge",
        params={"account": "acct-77", "amount_cents": 250000},
    )
    approval = Approval.objects.get(operation=op)
    assert approval.approvals_required == 2
    return approval


def test_two_operators_approve_a_two_person_request_and_it_is_released(
    page: Page, browser: Browser, server
):
    owner = factories.agent()
    approval = _two_person_charge(owner)
    alice = factories.console_user("operator")
    login(page, server.url, alice.actor.name)
    page.goto(f"{server.url}/approvals/")
    card = page.locator(f'section.approval[data-approval="{approval.pk}"]')
    expect(card.locator("[data-field=approvals]")).to_have_text(
        "Needs 2 approvals · none yet (0 of 2)"
    )
    # "Approve selected" would list it as not running yet.
    tick = page.locator(f'input[name=selected][value^="{approval.pk}|"]')
    assert "(approval 1 of 2: it does not run yet)" in (tick.get_attribute("data-release") or "")

    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("ul.messages")).to_contain_text(
        f"Your approval of {approval.pk} is recorded (1 of 2)"
    )
    assert "Yours is approval 1 of 2: it runs once 2 people approved." in asked[0]
    assert "release" not in asked[0].split("?")[0]  # nothing is released by this click
    card = page.locator(f'section.approval[data-approval="{approval.pk}"]')
    expect(card.locator("[data-field=approvals]")).to_have_text(
        f"Needs 2 approvals · approved by {alice.actor.name} (1 of 2)"
    )
    approve = card.get_by_role("button", name="Approve", exact=True)
    expect(approve).to_be_disabled()
    expect(approve).to_have_accessible_description(
        "You approved it already: it needs another approver."
    )
    # The keyboard's "a" says the same instead of approving.
    page.keyboard.press("j")
    page.keyboard.press("a")
    expect(page.locator("#shortcut-note")).to_have_text(
        "You approved it already: it needs another approver."
    )
    # Bulk follows the same rule per request: A's second approve is refused, not counted.
    page.locator(f'input[name=selected][value^="{approval.pk}|"]').check()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Approve selected").click()
    expect(page.locator("ul.messages")).to_contain_text(
        f"Nothing was decided on {approval.pk}: you approved it already (1 of 2 approvals)"
    )
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert ApprovalVote.objects.filter(approval=approval).count() == 1
    assert Operation.objects.get(pk=approval.operation_id).status == "waiting_approval"

    bob = factories.console_user("operator")
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        second = ctx.new_page()
        login(second, server.url, bob.actor.name)
        second.goto(f"{server.url}/approvals/")
        bobs_card = second.locator(f'section.approval[data-approval="{approval.pk}"]')
        expect(bobs_card.locator("[data-field=approvals]")).to_contain_text("(1 of 2)")
        second.once("dialog", lambda d: d.accept())
        bobs_card.get_by_role("button", name="Approve", exact=True).click()
        expect(second.locator("ul.messages")).to_contain_text(f"Request {approval.pk} is approved")
        expect(bobs_card).to_have_count(0)  # decided: it leaves the waiting list
    finally:
        ctx.close()

    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == bob.actor.label
    # The release gate: both approvers still hold the right, so the worker's claim runs it.
    claimed = operation_claim(approval.operation_id, execution_id=execution_for_agent("w").pk)
    assert isinstance(claimed, Lease), claimed
    assert Approval.objects.get(pk=approval.pk).status == "released"
    assert page.page_errors == []  # type: ignore[attr-defined]
