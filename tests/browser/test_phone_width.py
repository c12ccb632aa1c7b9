"""A phone-sized screen (issue 24 point 7) in a real browser, 390 x 844 px: no console page
scrolls sideways (its document is no wider than the screen), and the navigation folds behind
a Menu button that works from the keyboard."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Resolution
from runtime.resolutions import operation_resolve
from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

WIDTH = 390

# Each page's wide content: long names and ids, JSON parameters, tables of many columns.
LONG = "quarterly-reconciliation-of-supplier-invoices-" * 3


@pytest.fixture
def phone(browser: Browser, transactional_db: None) -> Iterator[Page]:
    # After the database, so closed before its flush (as tests.browser.conftest.context).
    ctx = browser.new_context(viewport={"width": WIDTH, "height": 844})
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        pg.page_errors = errors  # type: ignore[attr-defined]
        yield pg
    finally:
        ctx.close()


def _world() -> dict[str, str]:
    """A task with every kind of row its pages show, and one of each queue's entries."""
    owner = factories.agent(f"agent-with-a-long-name-{LONG[:30]}")
    task = factories.task(owner, f"{LONG}task", budget={"cost_cents": 100000})
    waiting = factories.operation(
        owner,
        task,
        step=f"{LONG}charge",
        tool="demo.payments.charge",
        params={"account": f"acct-{LONG}", "amount_cents": 250000, "memo": LONG * 2},
        estimate={"cost_cents": 300},
    )
    expiring = factories.operation(
        owner,
        task,
        step="charge-later",
        tool="demo.payments.charge",
        params={"account": "acct-9", "amount_cents": 30000},
    )
    Approval.objects.filter(operation=expiring).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert approval_expire_sweep() == 1
    decided = factories.operation(
        owner,
        task,
        step="charge-denied",
        tool="demo.payments.charge",
        params={"account": "acct-7", "amount_cents": 40000},
    )
    approval = Approval.objects.get(operation=decided)
    response = (
        factories.console_user("operator")
        .client()
        .post(
            f"/api/v1/approvals/{approval.pk}/decision",
            {"decision": "deny", "reason": LONG, "params_hash": approval.params_hash},
            format="json",
        )
    )
    assert response.status_code == 200, response.content
    unresolved = [factories.unresolved_operation(owner, task, f"notify-{i}") for i in range(2)]
    operation_resolve(
        factories.console_user("support").actor,
        unresolved[1].pk,
        resolution="succeeded",
        evidence=LONG,
        state_version=unresolved[1].state_version,
    )
    assert Resolution.objects.count() == 1
    for i in range(3):
        factories.agent(f"ci-bot-{i}-{LONG[:40]}")
    return {"task": task.pk, "operation": waiting.pk, "unresolved": unresolved[0].pk}


# What sticks out, for the failure message: elements whose right edge passes the screen.
_WIDE = """() => Array.from(document.querySelectorAll('body *'))
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
  .slice(0, 8)
  .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
       (typeof e.className === 'string' && e.className ? '.' + e.className.replace(/ /g, '.') : '')
       + ' ' + Math.round(e.getBoundingClientRect().right) + 'px')"""


def _sideways(page: Page) -> tuple[int, list[str]]:
    width = page.evaluate("() => document.documentElement.scrollWidth")
    return width, ([] if width <= WIDTH else page.evaluate(_WIDE))


def test_no_console_page_scrolls_sideways_at_390_px(phone: Page, server):
    ids = _world()
    phone.goto(f"{server.url}/login/")
    assert _sideways(phone)[0] <= WIDTH
    login(phone, server.url, factories.console_user("admin").actor.name)
    pages = [
        "/",
        "/tasks/",
        f"/tasks/?q={ids['operation']}",  # find: the search and what it found
        f"/tasks/{ids['task']}/",
        f"/operations/{ids['operation']}/",
        f"/operations/{ids['unresolved']}/",
        "/approvals/",
        "/approvals/?status=decided",
        "/approvals/?status=decided&since=nonsense",
        "/unresolved/",
        "/unresolved/?status=resolved",
        "/waits/",
        "/tokens/",
        "/tools/",
    ]
    wide = {}
    for path in pages:
        phone.goto(f"{server.url}{path}")
        width, sticking_out = _sideways(phone)
        if width > WIDTH:
            wide[path] = (width, sticking_out)
    assert not wide, f"pages wider than {WIDTH} px (scrollWidth, what sticks out): {wide}"
    assert phone.page_errors == []  # type: ignore[attr-defined]


def test_the_navigation_folds_behind_a_menu_button_that_works_from_the_keyboard(
    phone: Page, server
):
    login(phone, server.url, factories.console_user("operator").actor.name)
    phone.goto(f"{server.url}/tasks/")
    menu = phone.get_by_role("button", name="Menu")
    nav = phone.locator("#main-nav")
    expect(menu).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(nav).to_be_hidden()

    # From the keyboard: Tab reaches the button, Enter opens, Tab walks the links, Escape
    # closes and gives the focus back to the button.
    for _ in range(3):
        phone.keyboard.press("Tab")
        if phone.evaluate("() => document.activeElement.id") == "nav-toggle":
            break
    expect(menu).to_be_focused()
    phone.keyboard.press("Enter")
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(nav).to_be_visible()
    expect(nav.get_by_role("link", name="Approvals")).to_be_visible()
    phone.keyboard.press("Tab")
    expect(nav.get_by_role("link", name="Dashboard")).to_be_focused()
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= WIDTH
    phone.keyboard.press("Escape")
    expect(nav).to_be_hidden()
    expect(menu).to_be_focused()
    expect(menu).to_have_attribute("aria-expanded", "false")
    phone.keyboard.press("Space")
    expect(nav).to_be_visible()
    with phone.expect_navigation():
        nav.get_by_role("link", name="Approvals").click()
    assert phone.url == f"{server.url}/approvals/"
    expect(nav).to_be_hidden()  # a new page starts folded

    # On a wide screen the links are simply there.
    phone.set_viewport_size({"width": 1280, "height": 900})
    expect(menu).to_be_hidden()
    expect(nav.get_by_role("link", name="Tasks")).to_be_visible()
