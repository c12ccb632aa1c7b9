"""What a person reads is what will run: a bidi override in a tool parameter (accepted: the tool
may need it) or in an old task name (stored before names refused it) is shown on /approvals/ and
on the task page as a visible, marked <U+202E>, never acting on the text around it."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from runtime.models import Task
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

RLO = "\u202e"


def test_an_override_in_params_is_shown_escaped_on_the_approval_card(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "pay the supplier")
    # A name stored before the rule (the API now refuses it): written as old rows are.
    Task.objects.filter(pk=task.pk).update(name=f"pay acct_1{RLO}9876")
    op = factories.operation(
        owner,
        task,
        step="pay",
        tool="demo.payments.charge",
        params={"account": f"acct_1{RLO}9876", "amount_cents": 25000},
    )
    approval = op.approvals.get()
    person = factories.console_user("operator")
    login(page, server.url, person.actor.name)
    page.goto(f"{server.url}/approvals/")
    card = page.locator(f'section.approval[data-approval="{approval.pk}"]')
    expect(card).to_be_visible()

    mark = card.locator("pre.params .hidden-char")
    expect(mark).to_have_count(1)
    expect(mark).to_have_text("<U+202E>")
    expect(mark).to_have_attribute("title", "U+202E RIGHT-TO-LEFT OVERRIDE")
    expect(card.locator("pre.params")).to_contain_text('"account": "acct_1<U+202E>9876"')
    expect(card.locator("dd a").first).to_contain_text("pay acct_1<U+202E>9876")
    # The edit form keeps the exact value as a JSON escape, visible and parsed back the same.
    assert '"acct_1\\u202e9876"' in card.locator("textarea[name=params]").input_value()
    assert RLO not in page.locator("body").inner_text()
    assert RLO not in page.content()

    page.goto(f"{server.url}/tasks/{task.pk}/")
    expect(page.locator("#task-title .hidden-char")).to_have_text("<U+202E>")
    assert RLO not in page.locator("body").inner_text()
    assert RLO not in page.title() and "<U+202E>" in page.title()
    assert page.page_errors == []  # type: ignore[attr-defined]
