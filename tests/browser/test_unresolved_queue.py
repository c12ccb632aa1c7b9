"""A support user works the unresolved queue in a real browser: the operation arrives live, its
evidence is on the page, and resolving it is recorded with the person's name."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from runtime.models import Operation, Resolution
from tests import factories
from tests.browser.conftest import login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_support_finds_reads_and_resolves_an_unresolved_operation(page: Page, server, workers):
    workers.start(count=1, concurrency=1)
    support = factories.console_user("support")
    login(page, server.url, support.actor.name)
    page.goto(f"{server.url}/unresolved/")
    wait_live(page)
    page.evaluate("window.__marker = 1")
    expect(page.locator("#queue-empty")).to_be_visible()

    owner = factories.agent()
    task = factories.task(owner, "tell the customer")
    # The receiver commits, then the response is lost; notify has no contract to recover with.
    op = factories.operation(
        owner, task, tool="demo.notify", params={"to": "c@example.com", "_fault": "unknown"}
    )
    card = page.locator(f'section.unresolved[data-operation="{op.pk}"]')
    expect(card).to_be_visible(timeout=60_000)
    assert page.evaluate("window.__marker") == 1  # arrived without a reload

    # The evidence a person needs is on the page.
    expect(card).to_contain_text(op.idempotency_key)
    expect(card).to_contain_text("none")  # the receiver contract
    expect(card.locator("table.invocations")).to_contain_text("unknown")
    expect(card).to_contain_text("injected lost response")
    # Actions the contract does not allow are not offered.
    expect(card.get_by_role("button", name="Retry with the same key")).to_have_count(0)

    card.get_by_label("Evidence").fill("provider log shows delivery at 10:02")
    page.once("dialog", lambda dialog: dialog.accept())  # a resolution asks first
    card.get_by_role("button", name="Mark succeeded").click()
    expect(page.locator("ul.messages")).to_contain_text("now succeeded")
    expect(page.locator("#queue-empty")).to_be_visible()

    assert Operation.objects.get(pk=op.pk).status == "succeeded"
    audit = Resolution.objects.get(operation_id=op.pk)
    assert audit.actor == support.actor.label
    assert audit.evidence == "provider log shows delivery at 10:02"


def test_an_operator_sees_the_queue_but_cannot_resolve(page: Page, server):
    # An operation in the queue: claimed, and its call's outcome lost; notify has no contract
    # to recover with, so it waits for a person.
    op = factories.unresolved_operation()
    assert op.status == "unresolved"

    operator = factories.console_user("operator")
    login(page, server.url, operator.actor.name)
    page.goto(f"{server.url}/unresolved/")
    expect(page.locator("h1")).to_have_text("Unresolved operations")
    # The operator sees the operation and its evidence...
    card = page.locator(f'section.unresolved[data-operation="{op.pk}"]')
    expect(card).to_be_visible()
    expect(card).to_contain_text(op.idempotency_key)
    # ...but is offered no way to resolve it.
    expect(card).to_contain_text("Only support staff can resolve.")
    expect(page.locator("form.resolve")).to_have_count(0)
    expect(card.get_by_role("button")).to_have_count(0)
