"""The task page's budget meters in a real browser: they move live (no reload) as work is
admitted and settled by a real worker; the deadline shows its time left; attempts and children
are listed; the dashboard lists tasks near a limit."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from runtime.attempts import attempt_create
from tests import factories
from tests.browser.conftest import operator, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_meters_move_live_as_work_runs(page: Page, server, workers):
    owner = factories.agent()
    task = factories.task(owner, "metered", budget={"cost_cents": 100}, deadline_seconds=3600)
    child = factories.task(owner, "helper", parent=task.pk, budget={"cost_cents": 10})
    operator(page, server.url)
    page.goto(f"{server.url}/tasks/{task.pk}/")
    wait_live(page)
    page.evaluate("window.__marker = 1")
    row = page.locator('#meters tr[data-meter="cost_cents"]')
    # The child's allocation is held in the parent's ledger.
    expect(row.locator("[data-field=reserved]")).to_have_text("10")
    expect(row.locator("[data-field=available]")).to_have_text("80")
    expect(page.locator("#task-deadline [data-field=time-left]")).to_contain_text("left")
    expect(page.locator(f'#children li[data-child="{child.pk}"]')).to_be_visible()

    # No worker yet: admission alone moves the meter.
    factories.operation(
        owner, task, estimate={"cost_cents": 30}, params={"_usage": {"cost_cents": 12}}
    )
    expect(row.locator("[data-field=reserved]")).to_have_text("40")
    expect(row.locator("[data-field=available]")).to_have_text("50")

    workers.start(count=1, concurrency=1)
    expect(row.locator("[data-field=posted]")).to_have_text("12", timeout=60_000)
    expect(row.locator("[data-field=reserved]")).to_have_text("10")
    expect(row.locator("[data-field=available]")).to_have_text("68")

    attempt_create(owner.actor, task.pk, reason="plan B")
    expect(page.locator('#attempts li[data-attempt="2"]')).to_contain_text("plan B")
    assert page.evaluate("window.__marker") == 1  # never reloaded


def test_the_dashboard_lists_tasks_near_a_limit(page: Page, server):
    owner = factories.agent()
    near = factories.task(owner, "almost spent", budget={"cost_cents": 100})
    far = factories.task(owner, "plenty left", budget={"cost_cents": 100})
    factories.operation(owner, near, estimate={"cost_cents": 85})
    factories.operation(owner, far, estimate={"cost_cents": 5})
    operator(page, server.url)
    page.goto(f"{server.url}/")
    table = page.locator("#near-limit")
    expect(table.locator(f'tr[data-task="{near.pk}"]')).to_contain_text("85%")
    expect(table.locator(f'tr[data-task="{far.pk}"]')).to_have_count(0)
