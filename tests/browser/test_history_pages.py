"""The queues' histories (issue 24 point 4) in a real browser: /approvals/?status=decided lists
decided requests with who decided, when and why; /unresolved/?status=resolved lists people's
resolutions with the evidence; both filter by tool, task, person and time, and a filter they
cannot read is a clear message, never a 500."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Resolution, Task
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _charge(owner: Any, task: Task, amount: int, step: str) -> Approval:
    op = factories.operation(
        owner,
        task,
        step=step,
        tool="demo.payments.charge",
        params={"account": "acct-42", "amount_cents": amount},
    )
    return Approval.objects.get(operation=op)


def _decide(person: Any, approval: Approval, decision: str, reason: str) -> None:
    response = person.client().post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {"decision": decision, "reason": reason, "params_hash": approval.params_hash},
        format="json",
    )
    assert response.status_code == 200, response.content


def _shown(page: Page) -> set[str]:
    return set(
        page.locator("tr[data-decided-approval]").evaluate_all(
            "rows => rows.map(r => r.dataset.decidedApproval)"
        )
    )


def _filter(page: Page, **fields: str) -> None:
    form = page.locator("#history-filters")
    for label, value in fields.items():
        form.get_by_label(label.replace("_", " ").capitalize(), exact=True).fill(value)
    with page.expect_navigation():
        form.get_by_role("button", name="Filter").click()


def test_decided_requests_show_who_when_and_why_and_filter_by_tool_task_person_and_time(
    page: Page, server
):
    owner = factories.agent()
    suppliers = factories.task(owner, "pay the suppliers")
    refunds = factories.task(owner, "refund the customer")
    alice = factories.console_user("operator", "alice-approver")
    bob = factories.console_user("operator", "bob-approver")
    approved = _charge(owner, suppliers, 25000, "pay-acme")
    denied = _charge(owner, refunds, 90000, "refund-big")
    expired = _charge(owner, refunds, 30000, "refund-late")
    waiting = _charge(owner, suppliers, 12000, "pay-later")
    _decide(alice, approved, "approve", "known customer")
    _decide(bob, denied, "deny", "too big for a refund")
    Approval.objects.filter(pk=expired.pk).update(expires_at=timezone.now())
    assert approval_expire_sweep() == 1

    # Support sees the live queue (without deciding), so it sees its history too.
    login(page, server.url, factories.console_user("support").actor.name)
    page.goto(f"{server.url}/approvals/")
    page.get_by_role("link", name="Decided", exact=True).click()
    page.wait_for_url(f"{server.url}/approvals/?status=decided")
    assert _shown(page) == {approved.pk, denied.pk, expired.pk}  # not the one still waiting
    assert waiting.pk not in page.content()

    row = page.locator(f'tr[data-decided-approval="{denied.pk}"]')
    expect(row.locator('[data-field="by"]')).to_have_text(bob.actor.label)
    expect(row.locator('[data-field="reason"]')).to_have_text("too big for a refund")
    expect(row).to_contain_text("denied")
    expect(row).to_contain_text("$900.00 (90000 cents)")
    expect(row.get_by_role("link", name="refund the customer")).to_have_attribute(
        "href", f"/tasks/{refunds.pk}/"
    )
    decided_at = Approval.objects.get(pk=denied.pk).decided_at
    assert decided_at is not None
    expect(row.locator("time")).to_have_text(decided_at.strftime("%Y-%m-%d %H:%M:%S UTC"))
    row = page.locator(f'tr[data-decided-approval="{approved.pk}"]')
    expect(row.locator('[data-field="by"]')).to_have_text(alice.actor.label)
    expect(row.locator('[data-field="reason"]')).to_have_text("known customer")
    row = page.locator(f'tr[data-decided-approval="{expired.pk}"]')
    expect(row).to_contain_text("expired undecided")
    expect(row.locator('[data-field="by"]')).to_have_text("nobody, in time")

    # By person (a part of the name), task, tool and time; each filter is in the URL.
    _filter(page, Decided_by="bob")
    assert _shown(page) == {denied.pk}
    assert "person=bob" in page.url
    _filter(page, Decided_by="", Task=refunds.pk)
    assert _shown(page) == {denied.pk, expired.pk}
    _filter(page, Task="", Tool="demo.echo")
    assert _shown(page) == set()
    expect(page.locator("#history-empty")).to_have_text("No decided request matches these filters.")
    today = timezone.now().date()
    _filter(page, Tool="demo.payments.charge", Since=str(today), Until=str(today))
    assert _shown(page) == {approved.pk, denied.pk, expired.pk}
    _filter(page, Since=str(today + timedelta(days=1)), Until="")
    assert _shown(page) == set()
    _filter(page, Since="", Until=str(today - timedelta(days=1)))
    assert _shown(page) == set()

    # What cannot be read is said, on the page, with nothing listed: never a 500.
    _filter(page, Since="yesterday", Until="")
    expect(page.locator("#filter-problems")).to_contain_text(
        "“since” is not a date or a time: write it as 2026-12-04 or 2026-12-04T14:05 (UTC)."
    )
    expect(page.get_by_label("Since", exact=True)).to_have_value("yesterday")
    assert _shown(page) == set()
    response = page.goto(
        f"{server.url}/approvals/?status=decided&since=2026-12-05&until=2026-12-01"
    )
    assert response is not None and response.status == 400
    expect(page.locator("#filter-problems")).to_contain_text("“since” is not before “until”")
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_resolutions_keep_their_evidence_in_a_history_filtered_by_tool_task_person_and_time(
    page: Page, server
):
    owner = factories.agent()
    task = factories.task(owner, "tell the customer")
    other_task = factories.task(owner, "tell the supplier")
    op = factories.unresolved_operation(owner, task, "notify-customer")
    other = factories.unresolved_operation(owner, other_task, "notify-supplier")
    carol = factories.console_user("support", "carol-support")
    login(page, server.url, carol.actor.name)
    page.goto(f"{server.url}/unresolved/")
    card = page.locator(f'section.unresolved[data-operation="{op.pk}"]')
    card.locator("textarea[name=evidence]").fill("provider log #4711 shows delivery\nat 14:02")
    page.once("dialog", lambda d: d.accept())
    card.get_by_role("button", name="Mark succeeded").click()
    expect(page.locator("ul.messages")).to_contain_text(f"Resolved operation {op.pk}")

    page.get_by_role("link", name="Resolved", exact=True).click()
    page.wait_for_url(f"{server.url}/unresolved/?status=resolved")
    rows = page.locator("tr[data-resolved-operation]")
    expect(rows).to_have_count(1)  # the other one still waits for a person
    row = rows.first
    expect(row).to_have_attribute("data-resolved-operation", op.pk)
    expect(row.locator('[data-field="resolution"]')).to_contain_text("marked succeeded")
    expect(row.locator('[data-field="resolution"]')).to_contain_text("unresolved → succeeded")
    expect(row.locator('[data-field="by"]')).to_have_text(carol.actor.label)
    expect(row.locator('[data-field="evidence"]')).to_have_text(
        "provider log #4711 shows delivery\nat 14:02"
    )
    expect(row.locator("time")).to_contain_text("UTC")
    expect(row.get_by_role("link", name=op.pk)).to_have_attribute("href", f"/operations/{op.pk}/")

    _filter(page, Resolved_by="someone-else")
    expect(rows).to_have_count(0)
    _filter(page, Resolved_by="carol", Tool="demo.notify", Task=task.pk)
    expect(rows).to_have_count(1)
    _filter(page, Task=other_task.pk)
    expect(rows).to_have_count(0)
    resolved_at = Resolution.objects.get(operation=op).at
    _filter(page, Task="", Since=f"{resolved_at:%Y-%m-%dT%H:%M}")
    expect(rows).to_have_count(1)
    _filter(page, Since="", Until="2020-01-01")
    expect(rows).to_have_count(0)
    _filter(page, Until="2026-13-40")
    expect(page.locator("#filter-problems")).to_contain_text("“until” is not a date or a time")
    assert other.pk not in page.locator("#resolved-rows").inner_text()
    assert page.page_errors == []  # type: ignore[attr-defined]
