"""The README's picture of the console is this test's screenshot of the approvals inbox, so it
shows the console as it is: the test checks the page shows what the README's caption says (a
payment waiting for an operator, with its task, amount and parameters), and ``make screenshot``
(``UPDATE_SCREENSHOT=1``) writes the picture to docs/img/console.png."""

from __future__ import annotations

import os

import pytest
from playwright.sync_api import Page, expect

from runtime.models import Approval
from tests import factories
from tests.browser.conftest import login
from tests.conftest import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

PICTURE = ROOT / "docs" / "img" / "console.png"
CAPTION = (
    "The approvals inbox: a payment waiting for an operator, with its task, amount and parameters"
)


def test_the_readme_picture_shows_what_its_caption_says(page: Page, server, tmp_path):
    assert f"![{CAPTION}](docs/img/console.png)" in (ROOT / "README.md").read_text()
    owner = factories.agent("demo-agent")
    task = factories.task(owner, "refund order 1042")
    op = factories.operation(
        owner,
        task,
        step="charge-1042",
        tool="demo.payments.charge",
        params={"account": "acct-1042", "amount_cents": 25000},
    )
    approval = Approval.objects.get(operation=op)
    login(page, server.url, factories.console_user("operator", "operator").actor.name)
    page.set_viewport_size({"width": 1100, "height": 900})
    page.goto(f"{server.url}/approvals/")
    card = page.locator(f'section.approval[data-approval="{approval.pk}"]')
    expect(card).to_contain_text("demo.payments.charge")
    expect(card).to_contain_text("refund order 1042")
    expect(card).to_contain_text("$250.00 (25000 cents)")
    expect(card).to_contain_text("acct-1042")
    expect(card.get_by_role("button", name="Approve", exact=True)).to_be_visible()
    target = PICTURE if os.environ.get("UPDATE_SCREENSHOT") == "1" else tmp_path / "console.png"
    page.screenshot(path=str(target))
    assert target.stat().st_size > 10_000
