"""The console's pages in a real browser: who may see them, that hostile text stays text, the
dashboard's counts and the task list's filters and keyset pages."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import BrowserContext, Page, expect

from runtime.events import event_append_txn
from runtime.models import Execution, Task
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories
from tests.browser.conftest import login, operator, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _execution(label: str) -> str:
    # Not execution_current(): it caches this process's id, which the previous test's flush
    # removed from the database.
    return Execution.objects.create(kind="worker", host="browser-tests", label=label).pk


HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=1</script>'


def test_anonymous_visitor_is_sent_to_login(page: Page, server):
    page.goto(f"{server.url}/tasks/")
    assert page.url == f"{server.url}/login/?next=/tasks/"
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    # The form carries Django's CSRF token, and logging in returns to the page asked for.
    token = page.locator('form input[name="csrfmiddlewaretoken"]')
    assert len(token.get_attribute("value") or "") >= 32
    user = factories.console_user("support")
    page.get_by_label("Username").fill(user.actor.name)
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server.url}/tasks/")
    expect(page.get_by_role("heading", name="Tasks")).to_be_visible()


def test_wrong_password_is_refused_without_revealing_anything(page: Page, server):
    user = factories.console_user("operator")
    login_url = f"{server.url}/login/"
    page.goto(login_url)
    page.get_by_label("Username").fill(user.actor.name)
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_have_text("That username and password do not match.")
    page.goto(f"{server.url}/tasks/")
    assert page.url.startswith(login_url)


def test_login_post_without_csrf_token_is_refused(context: BrowserContext, server):
    user = factories.console_user("operator")
    context.request.get(f"{server.url}/login/")  # sets the CSRF cookie, but no token is sent
    response = context.request.post(
        f"{server.url}/login/",
        form={"username": user.actor.name, "password": factories.PASSWORD},
        max_redirects=0,
    )
    # Refused: back to the login form (told it had expired), and nobody is logged in.
    assert response.status == 303
    assert response.headers["location"].startswith("/login/")
    assert "sessionid" not in {c["name"] for c in context.cookies()}


def test_user_without_a_role_gets_403_everywhere(page: Page, server):
    get_user_model().objects.create_user("nobody", password=factories.PASSWORD)
    task = factories.task(factories.agent(), "secret plans")
    login(page, server.url, "nobody")
    for path in ("/", "/tasks/", f"/tasks/{task.pk}/", f"/tasks/{task.pk}/live"):
        response = page.goto(f"{server.url}{path}")
        assert response is not None and response.status == 403, path
        expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
        expect(page.locator("body")).not_to_contain_text("secret plans")


def test_logout_is_a_post_and_ends_the_session(page: Page, server):
    operator(page, server.url)
    # A GET (a link, an <img>, a prefetch) must not log anyone out: it is a page with the
    # button (test_smaller_fixes.py), and the session is still there.
    response = page.request.get(f"{server.url}/logout/", max_redirects=0)
    assert response.status == 200 and "logout-form" in response.text()
    page.goto(f"{server.url}/tasks/")
    expect(page.get_by_role("heading", name="Tasks")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{server.url}/login/")
    page.goto(f"{server.url}/tasks/")
    assert page.url.startswith(f"{server.url}/login/")


def test_hostile_task_name_renders_as_text_everywhere(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, HOSTILE)
    operator(page, server.url)
    for path in ("/", "/tasks/", f"/tasks/{task.pk}/"):
        page.goto(f"{server.url}{path}")
        expect(page.get_by_text(HOSTILE, exact=True).first).to_be_visible()
        assert page.locator("img[src=x]").count() == 0
        assert page.locator("script:not([src])", has_text="__xss").count() == 0
        assert page.evaluate("typeof window.__xss") == "undefined", path

    # What arrives live over the websocket is inserted as text too.
    wait_live(page)
    with transaction.atomic():
        event_append_txn(
            task_id=task.pk,
            type="task.note",
            state_version=1,
            now=timezone.now(),
            actor=HOSTILE,
            data={"reason": HOSTILE, "to": HOSTILE},
        )
    item = page.locator("#timeline li", has_text="task.note")
    expect(item).to_have_count(1)
    expect(item.get_by_text(HOSTILE, exact=True).first).to_be_visible()
    assert page.locator("img[src=x]").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.page_errors == []  # type: ignore[attr-defined]


def _put(task: Task, condition: str, outcome: str | None = None) -> None:
    # Waiting and ending belong to other parts of the runtime; these pages only read the stored
    # condition and outcome, so the rows are put into those states directly.
    Task.objects.filter(pk=task.pk).update(condition=condition, outcome=outcome)


def test_dashboard_counts_by_condition_and_outcome_and_follows_new_tasks(page: Page, server):
    owner = factories.agent()
    for _ in range(2):
        factories.task(owner, "idle")
    running = factories.task(owner, "busy")
    op = factories.operation(owner, running)
    assert isinstance(operation_claim(op.pk, execution_id=_execution("browser-test")), Lease)
    _put(factories.task(owner, "waiting for a signal"), "waiting")
    for outcome in ("succeeded", "succeeded", "failed"):
        _put(factories.task(owner, f"done {outcome}"), "terminal", outcome)

    operator(page, server.url)

    def count(kind: str, name: str):
        return page.locator(f'[data-count="{kind}-{name}"]')

    expect(count("condition", "runnable")).to_have_text("2")
    expect(count("condition", "running")).to_have_text("1")
    expect(count("condition", "waiting")).to_have_text("1")
    expect(count("condition", "terminal")).to_have_text("3")
    expect(count("outcome", "succeeded")).to_have_text("2")
    expect(count("outcome", "failed")).to_have_text("1")
    expect(count("outcome", "cancelled")).to_have_text("0")
    expect(page.locator("#dashboard-body")).to_contain_text("waiting for a signal")

    # A task created elsewhere shows up without a reload.
    wait_live(page)
    page.evaluate("window.__marker = 1")
    factories.task(owner, "arrived while watching")
    expect(count("condition", "runnable")).to_have_text("3")
    expect(page.locator("#dashboard-body")).to_contain_text("arrived while watching")
    assert page.evaluate("window.__marker") == 1


def _listed(page: Page) -> list[str]:
    return page.locator("#task-rows tr[data-task]").evaluate_all(
        "rows => rows.map(r => r.dataset.task)"
    )


def test_task_list_filters_searches_and_pages_by_keyset(page: Page, server):
    owner = factories.agent()
    made = [factories.task(owner, f"batch job {i:02d}") for i in range(30)]
    needle = factories.task(owner, "Needle in the haystack")
    blocked = factories.task(owner, "blocked on approval signal")
    _put(blocked, "waiting")
    operator(page, server.url)

    # Newest first, 25 a page; "Older »" continues exactly where the page ended.
    page.goto(f"{server.url}/tasks/")
    first = _listed(page)
    assert len(first) == 25
    assert first[:2] == [blocked.pk, needle.pk]
    page.get_by_role("link", name="Older »").click()
    page.wait_for_url("**/tasks/?*before=*")
    second = _listed(page)
    assert first + second == [blocked.pk, needle.pk] + [t.pk for t in reversed(made)]
    expect(page.get_by_role("link", name="Older »")).to_have_count(0)
    page.get_by_role("link", name="« Newest").click()
    page.wait_for_url(lambda url: "before=" not in url)  # read the new page, not the one leaving
    assert _listed(page) == first

    # Search by name (case-insensitive), through the form.
    page.get_by_label("Search").fill("needle")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/tasks/?q=needle*")
    assert _listed(page) == [needle.pk]

    # Filter by condition, through the form.
    page.get_by_label("Search").fill("")
    page.get_by_label("Condition").select_option("waiting")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**condition=waiting*")
    assert _listed(page) == [blocked.pk]
    expect(page.get_by_label("Condition")).to_have_value("waiting")

    page.get_by_label("Condition").select_option("terminal")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**condition=terminal*")
    assert _listed(page) == []
    expect(page.locator("#task-rows")).to_contain_text("No tasks")


def test_bad_list_parameters_are_a_4xx_page(page: Page, server):
    operator(page, server.url)
    for query in ("condition=exploded", "before=%%%not-a-cursor", "outcome=maybe"):
        response = page.goto(f"{server.url}/tasks/?{query}")
        assert response is not None and response.status == 400, query
