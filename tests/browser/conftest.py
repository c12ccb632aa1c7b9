"""Playwright (sync API) driving Debian's chromium; never a downloaded browser.

Playwright's sync API keeps its asyncio loop marked as running in this thread for as long as it
is started. Two consequences:

- Django refuses ORM calls while a loop runs ("SynchronousOnlyOperation"). The tests use
  factories between Playwright calls on purpose (no request is in flight), so
  DJANGO_ALLOW_ASYNC_UNSAFE is set, but only while the browser is up.
- ``asyncio.run`` and ``async_to_sync`` fail in this thread while the loop runs, so the browser
  is shared by the browser tests only (package scope) and stopped before any other package's
  tests run in the same session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests import factories
from tests.conftest import wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Generous: two cores run the web server, workers, PostgreSQL and chromium at once.
TIMEOUT_MS = 20_000


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        # Never skipped: a missing browser must not pass as a green run without browser tests.
        pytest.fail(f"{CHROMIUM} is not installed: apt-get install chromium (.ci/run does)")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                yield b
            finally:
                b.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def context(browser: Browser, transactional_db: None) -> Iterator[BrowserContext]:
    # Set up after the test's database, so closed before its flush: none of this test's pages
    # reaches the web server (kept for the module, tests.conftest.KeptProcesses) afterwards.
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.page_errors = errors  # type: ignore[attr-defined]
    yield pg


def login(page: Page, base_url: str, username: str, password: str = factories.PASSWORD) -> None:
    """Log in through the real form (CSRF token included) and land on the dashboard."""
    page.goto(f"{base_url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")


def operator(page: Page, base_url: str) -> Any:
    """A console operator, logged in on ``page``; returns the factories Principal."""
    principal = factories.console_user("operator")
    login(page, base_url, principal.actor.name)
    return principal


def wait_live(page: Page) -> None:
    """The page's websocket is open (the indicator turns to "live" on the socket's open)."""
    page.wait_for_selector("#live-status[data-state=live]")


def poll(page: Page, predicate: Any, timeout: float = 30.0, what: str = "") -> Any:
    """``wait_for`` for conditions that Playwright callbacks (routes, events) make true: waits
    between checks inside Playwright, whose loop only dispatches them while it runs."""
    return wait_for(predicate, timeout, 0.05, what, pause=lambda s: page.wait_for_timeout(s * 1000))
