"""Admins meet no wall (issue 39 point 6), in a real browser: a second token for an existing agent
(rotation) is minted on /tokens/, the old one working until it is revoked, and asking for it
through the new agent's form says where to go instead of a dead-end refusal; a schedule is
created on /schedules/ (name, cron, the task's template), a mistake named in plain words."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Page, expect

from runtime.models import ApiToken, AuditRecord, Schedule
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _status(url: str, secret: str) -> int:
    return httpx.get(
        f"{url}/api/v1/tasks", headers={"Authorization": f"Bearer {secret}"}, timeout=20
    ).status_code


def test_an_admin_rotates_an_agents_token_and_the_old_one_works_until_revoked(page: Page, server):
    bot = factories.agent("ci-bot")
    old = ApiToken.objects.get(agent__name="ci-bot")
    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/tokens/")

    # Through the new agent's form: told where to go, on the page itself.
    page.get_by_label("Agent name or username").fill("ci-bot")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("ul.messages li.error")).to_contain_text(
        "Nothing was created: an agent named 'ci-bot' exists. To give it a second token, use "
        "“New token” on its row below"
    )
    assert ApiToken.objects.filter(agent__name="ci-bot").count() == 1

    row = page.locator(f'tr[data-token="{old.pk}"]')
    row.get_by_role("button", name="New token for agent:ci-bot").click()
    issued = page.locator("#issued-token")
    expect(issued).to_contain_text("Acts as agent:ci-bot")
    secret = page.locator("#issued-secret").inner_text().strip()
    new = ApiToken.objects.filter(agent__name="ci-bot").exclude(pk=old.pk).get()
    assert new.minted_by == admin.actor.key and new.created_by == admin.actor.label
    # Both work while the agent switches over.
    assert _status(server.url, bot.token) == 200
    assert _status(server.url, secret) == 200

    page.goto(f"{server.url}/tokens/")
    page.once("dialog", lambda d: d.accept())
    page.locator(f'tr[data-token="{old.pk}"]').get_by_role("button", name="Revoke").click()
    expect(page.locator("ul.messages")).to_contain_text("is revoked")
    assert _status(server.url, bot.token) == 401
    assert _status(server.url, secret) == 200
    audit = AuditRecord.objects.filter(subject=f"token:{new.pk}", action="token.issued").get()
    assert audit.actor == admin.actor.label
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_an_admin_creates_a_schedule_in_the_console(page: Page, server):
    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/schedules/")
    page.locator("#new-schedule summary").click()
    form = page.locator("#schedule-form")

    # A cron it cannot read: said, and nothing created.
    form.get_by_label("Task name").fill("nightly export")
    form.get_by_label("Cron (five fields, or @daily…)").fill("61 * * * *")
    form.get_by_role("button", name="Create schedule").click()
    expect(page.locator("ul.messages li.error")).to_contain_text("No schedule was created:")
    assert not Schedule.objects.exists()

    page.locator("#new-schedule summary").click()
    form.get_by_label("Task name").fill("nightly export")
    form.get_by_label("Cron (five fields, or @daily…)").fill("0 2 * * *")
    form.get_by_label("Input (JSON)").fill('{"region": "eu"}')
    form.get_by_role("button", name="Create schedule").click()
    expect(page.locator("ul.messages li.success")).to_contain_text("is created: its first run is")
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.template["name"], schedule.template["input"]) == (
        "0 2 * * *",
        "nightly export",
        {"region": "eu"},
    )
    assert schedule.created_by == admin.actor.label and schedule.user_id == admin.actor.user_id
    card = page.locator(f'section.schedule[data-schedule="{schedule.pk}"]')
    expect(card).to_contain_text("nightly export")
    expect(card).to_contain_text("0 2 * * *")
    assert page.page_errors == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("role", ["operator", "support"])
def test_only_admins_see_the_schedule_form(page: Page, server, role: str):
    login(page, server.url, factories.console_user(role).actor.name)
    page.goto(f"{server.url}/schedules/")
    expect(page.locator("h1")).to_have_text("Schedules")
    expect(page.locator("#new-schedule")).to_have_count(0)
