"""Markup in every field the console renders, put there through the real API as an agent
would (task name and input, operation step, tool parameters, idempotency key, an agent's
result and error message, a status reason, journal actor and reason): in Chromium, on every
page that shows it, it stays text and nothing executes, with no CSP violation needed to stop
it. Part of the hostile input set (tests/api/test_hostile_input.py)."""

from __future__ import annotations

import httpx
import pytest
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.events import event_append_txn
from runtime.models import Operation
from tests import factories
from tests.browser.conftest import login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

MARKUP = (
    '<img src=x onerror="window.__xss=1"><script>window.__xss=1</script>'
    '"\'><svg onload="window.__xss=1"></svg>'
    '" onmouseover="window.__xss=1" x="'
    "javascript:window.__xss=1"
)

RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective);
});
"""


def _api(server_url: str, token: str):
    return httpx.Client(
        base_url=f"{server_url}/api/v1",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def _seed(server_url: str) -> dict[str, str]:
    agent = factories.agent()
    with _api(server_url, agent.token) as api:
        task = api.post("/tasks", json={"name": MARKUP, "input": {MARKUP: MARKUP}})
        assert task.status_code == 201, task.text
        task_id = task.json()["id"]

        def propose(step: str, **extra) -> dict:
            body = {"tool": "demo.echo", "step": step, "params": {MARKUP: [MARKUP]}, **extra}
            response = api.post(f"/tasks/{task_id}/operations", json=body)
            assert response.status_code == 201, response.text
            return dict(response.json())

        propose(MARKUP, idempotency_key=MARKUP)
        succeeded = propose("agent-succeeds", executor="agent")
        failed = propose("agent-fails", executor="agent")
        unresolved = propose("left-unresolved")
        for op, report in (
            (succeeded, {"outcome": "succeeded", "result": {MARKUP: MARKUP}}),
            (failed, {"outcome": "failed", "error": {"kind": "permanent", "message": MARKUP}}),
        ):
            lease = api.post(f"/operations/{op['id']}/claim")
            assert lease.status_code == 200, lease.text
            granted = lease.json()
            body = {
                "lease_generation": granted["lease_generation"],
                "lease_token": granted["lease_token"],
                **report,
            }
            done = api.post(f"/operations/{op['id']}/complete", json=body)
            assert done.status_code == 200, done.text
    Operation.objects.filter(pk=unresolved["id"]).update(status="unresolved", status_reason=MARKUP)
    with transaction.atomic():
        event_append_txn(
            task_id=task_id,
            type="task.note",
            state_version=1,
            now=timezone.now(),
            actor=MARKUP,
            data={"reason": MARKUP, "to": MARKUP},
        )
    return {"task": task_id}


def _assert_inert(page: Page, where: str) -> None:
    assert page.evaluate("typeof window.__xss") == "undefined", where
    assert page.locator("img[src=x]").count() == 0, where
    assert page.locator("svg[onload]").count() == 0, where
    assert page.locator("[onmouseover]").count() == 0, where
    assert page.evaluate("window.__violations") == [], where


def test_markup_in_every_rendered_field_stays_text(page: Page, server):
    seeded = _seed(server.url)
    page.add_init_script(RECORD_VIOLATIONS)
    login(page, server.url, factories.console_user("admin").actor.name)
    for path in ("/", "/tasks/", f"/tasks/{seeded['task']}/", "/unresolved/"):
        page.goto(f"{server.url}{path}")
        wait_live(page)
        expect(page.get_by_text(MARKUP).first).to_be_visible()
        # An attribute that broke out of its quotes would be an element with a handler.
        _assert_inert(page, path)
    # The fragments re-fetched live render the same text.
    page.goto(f"{server.url}/tasks/{seeded['task']}/")
    wait_live(page)
    page.evaluate("Console.refresh(['task-live'])")
    expect(page.locator("#task-live").get_by_text(MARKUP).first).to_be_visible()
    _assert_inert(page, "fragment")
    assert page.page_errors == []  # type: ignore[attr-defined]
