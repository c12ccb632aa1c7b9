"""People at work in a real browser (issue 24 points 1-3 and 8): a decision sent after the session
or the CSRF cookie was lost is not taken and the person lands back on the inbox, told so; what
cannot be undone asks first and dismissing the question changes nothing; amounts carry their
currency, an expired request stays in sight; the live badge shows only on live pages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import ApiToken, Approval, Operation, Task
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _charge(owner: Any, task: Task, amount: int = 25000) -> Operation:
    return factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": "acct-42", "amount_cents": amount},
    )


@pytest.mark.parametrize("lost", ["sessionid", "csrftoken"])
def test_a_decision_sent_without_its_cookie_is_not_taken_and_the_person_is_back_on_the_inbox(
    page: Page, server, lost: str
):
    owner = factories.agent()
    op = _charge(owner, factories.task(owner, "pay the supplier"))
    approval = Approval.objects.get(operation=op)
    person = factories.console_user("operator")
    login(page, server.url, person.actor.name)
    inbox = f"{server.url}/approvals/?tool=demo.payments.charge"  # its filter is kept too
    page.goto(inbox)
    card = page.locator(f'section.approval[data-approval="{approval.pk}"]')

    page.context.clear_cookies(name=lost)
    page.once("dialog", lambda d: d.accept())  # the amount, named (test_guarded_release.py)
    card.get_by_role("button", name="Approve", exact=True).click()
    if lost == "sessionid":
        page.wait_for_url(f"{server.url}/login/**")
        page.get_by_label("Username").fill(person.actor.name)
        page.get_by_label("Password").fill(factories.PASSWORD)
        page.get_by_role("button", name="Log in").click()
        said = "You were signed out before it arrived"
    else:
        said = "The page's form had expired"
    page.wait_for_url(f"{inbox}#request-{approval.pk}")  # at the request it was about
    message = page.locator("ul.messages li.warning")
    expect(message).to_contain_text(said)
    expect(message).to_contain_text(f"your decision on request {approval.pk} was NOT taken")
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert Operation.objects.get(pk=op.pk).status == "waiting_approval"

    # Still there, and taken this time.
    page.once("dialog", lambda d: d.accept())
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("ul.messages")).to_contain_text(
        f"Request {approval.pk} is approved: its action runs now."
    )
    assert Approval.objects.get(pk=approval.pk).status == "approved"


@dataclass
class Irreversible:
    role: str
    # Makes the world; returns (the page's path, what is read to see whether anything changed).
    setup: Callable[[], tuple[str, Callable[[], Any]]]
    act: Callable[[Page], None]  # up to the click that asks
    asks: str  # part of the question
    said: str  # part of the message once it is done


def _revoke_setup() -> tuple[str, Callable[[], Any]]:
    factories.agent("ci-bot")
    token = ApiToken.objects.get(agent__name="ci-bot")
    return "/tokens/", lambda: ApiToken.objects.get(pk=token.pk).revoked_at is not None


def _cancel_setup() -> tuple[str, Callable[[], Any]]:
    owner = factories.agent()
    task = factories.task(owner, "nightly export")
    factories.operation(owner, task)
    return f"/tasks/{task.pk}/", lambda: Task.objects.get(pk=task.pk).cancellation


def _end_setup() -> tuple[str, Callable[[], Any]]:
    owner = factories.agent()
    task = factories.task(owner, "wait for a decision")
    op = _charge(owner, task)
    Approval.objects.filter(operation=op).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire_sweep() == 1
    return "/waits/", lambda: (
        Task.objects.get(pk=task.pk).condition,
        Operation.objects.get(pk=op.pk).status,
    )


def _deny_setup() -> tuple[str, Callable[[], Any]]:
    owner = factories.agent()
    op = _charge(owner, factories.task(owner, "pay the supplier"), amount=12000)
    return "/approvals/", lambda: Approval.objects.get(operation=op).status


def _resolve_setup() -> tuple[str, Callable[[], Any]]:
    op = factories.unresolved_operation()
    return "/unresolved/", lambda: Operation.objects.get(pk=op.pk).status


def _deny(page: Page) -> None:
    card = page.locator("section.approval").first
    card.get_by_placeholder("reason (required)").fill("not this month")
    card.get_by_role("button", name="Deny", exact=True).click()


def _bulk_deny(page: Page) -> None:
    page.locator("section.approval input[name=selected]").first.check()
    page.locator("#bulk-form input[name=reason]").fill("not this month")
    page.get_by_role("button", name="Deny selected").click()


def _resolve(page: Page) -> None:
    page.locator("form.resolve textarea[name=evidence]").fill("provider log shows delivery")
    page.get_by_role("button", name="Mark succeeded").click()


IRREVERSIBLE = {
    "revoke-token": Irreversible(
        "admin",
        _revoke_setup,
        lambda page: (
            page.locator("tr", has_text="agent:ci-bot").get_by_role("button", name="Revoke").click()
        ),
        "acting as agent:ci-bot? Whatever uses it stops at once.",
        "is revoked",
    ),
    "cancel-task": Irreversible(
        "admin",
        _cancel_setup,
        lambda page: page.get_by_role("button", name="Cancel task").click(),
        "Cancel the task 'nightly export'?",
        "The task is cancelled",
    ),
    "end-task": Irreversible(
        "admin",
        _end_setup,
        lambda page: page.get_by_role("button", name="End task").click(),
        "End the task 'wait for a decision'?",
        "has ended",
    ),
    "deny": Irreversible(
        "operator",
        _deny_setup,
        _deny,
        ", $120.00 (12000 cents))?",
        "is denied: its action will not run",
    ),
    "bulk-deny": Irreversible(
        "operator", _deny_setup, _bulk_deny, "Deny the 1 selected request(s)?", "is denied"
    ),
    "resolve": Irreversible(
        "support", _resolve_setup, _resolve, "as succeeded?", "Resolved operation"
    ),
}


@pytest.mark.parametrize("case", list(IRREVERSIBLE), ids=list(IRREVERSIBLE))
def test_what_cannot_be_undone_asks_first_and_dismissing_changes_nothing(
    page: Page, server, case: str
):
    spec = IRREVERSIBLE[case]
    path, state = spec.setup()
    before = state()
    login(page, server.url, factories.console_user(spec.role).actor.name)
    page.goto(f"{server.url}{path}")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    spec.act(page)
    assert len(asked) == 1 and spec.asks in asked[0], asked
    assert "cannot be undone" in asked[0]
    page.evaluate("1")  # a round trip through the page: a submit would have started by now
    assert posts == [] and state() == before

    page.once("dialog", lambda d: d.accept())
    spec.act(page)
    expect(page.locator("ul.messages")).to_contain_text(spec.said)
    assert state() != before


def test_the_inbox_shows_money_keeps_expired_requests_and_the_badge_only_where_live(
    page: Page, server
):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    pending = Approval.objects.get(operation=_charge(owner, task, amount=12000))
    expired_op = _charge(owner, task, amount=30000)
    Approval.objects.filter(operation=expired_op).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert approval_expire_sweep() == 1
    expired = Approval.objects.get(operation=expired_op)

    login(page, server.url, factories.console_user("operator").actor.name)
    page.goto(f"{server.url}/approvals/")
    card = page.locator(f'section.approval[data-approval="{pending.pk}"]')
    expect(card.locator(".amount")).to_have_text("$120.00 (12000 cents)")
    digest = card.locator("details.hash span")
    expect(digest).to_be_hidden()  # tucked away until asked for
    card.locator("details.hash summary").click()
    expect(digest).to_have_text(pending.params_hash)

    section = page.locator("#approvals-expired")
    expect(section).to_contain_text("Expired — an admin can renew it on Waits")
    row = section.locator(f'tr[data-expired-approval="{expired.pk}"]')
    expect(row).to_contain_text("$300.00 (30000 cents)")
    expect(row.locator('a[data-link="waits"]')).to_have_attribute("href", "/waits/")

    # Plain words: the bulk form sent with nothing ticked.
    page.get_by_role("button", name="Approve selected").click()
    expect(page.locator("ul.messages")).to_have_text(
        "Tick at least one request first: nothing was decided."
    )

    # The live badge on a live page; none on a page that follows nothing.
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(page.locator("#live-status")).to_be_visible()
    page.goto(f"{server.url}/tasks/tsk_none/")
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.locator("#live-status")).to_be_hidden()

    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert icon is not None
    response = page.request.get(f"{server.url}{icon}")
    assert response.ok and response.headers["content-type"].startswith("image/svg+xml")
    assert page.page_errors == []  # type: ignore[attr-defined]
