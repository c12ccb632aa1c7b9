"""/schedules/ in a real browser: an admin sees a schedule's next runs and last runs, pauses,
resumes, triggers it now (the run links its task) and edits it (a new version); an operator
reads the same page without the buttons; on a 390 px screen nothing scrolls sideways."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, expect

from runtime.models import Schedule, ScheduleEvent, ScheduleRun, Task
from runtime.schedules.services import schedule_create
from runtime.schedules.specs import ScheduleSpec
from runtime.tasks import TaskSpec
from tests import factories
from tests.browser.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _schedule() -> Schedule:
    owner = factories.agent("nightly-bot")
    return schedule_create(
        owner.actor,
        ScheduleSpec(
            task=TaskSpec(name="nightly reconciliation", input={"ledger": "eu"}),
            cron="0 3 * * *",
            timezone="Europe/Paris",
            overlap="skip",
        ),
    )


def test_an_admin_pauses_resumes_triggers_and_edits_a_schedule(page: Page, server):
    schedule = _schedule()
    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    page.locator("nav a", has_text="Schedules").click()
    page.wait_for_url(f"{server.url}/schedules/")
    card = page.locator(f'section[data-schedule="{schedule.pk}"]')
    expect(card).to_contain_text("nightly reconciliation")
    expect(card).to_contain_text("0 3 * * *")
    expect(card).to_contain_text("agent:nightly-bot")
    expect(card.locator("ul.next-runs li")).to_have_count(3)
    expect(card.locator("ul.next-runs li").first).to_contain_text("03:00 CE")  # Paris time
    expect(card).to_contain_text("No run yet.")

    card.get_by_role("button", name="Pause").click()
    expect(page.locator("ul.messages")).to_contain_text("is paused")
    expect(card.locator("[data-state]")).to_have_text("paused")
    assert Schedule.objects.get(pk=schedule.pk).paused

    card.get_by_role("button", name="Resume").click()
    expect(page.locator("ul.messages")).to_contain_text("is running again")
    expect(card.locator("[data-state]")).to_have_text("active")

    page.once("dialog", lambda dialog: dialog.accept())  # triggering asks first
    card.get_by_role("button", name="Trigger now").click()
    expect(page.locator("ul.messages")).to_contain_text("started task")
    task = Task.objects.get(schedule=schedule)
    row = card.locator("table.runs tr[data-status=started]")
    expect(row).to_contain_text("manual")
    expect(row).to_contain_text(admin.actor.label)
    row.get_by_role("link", name=task.pk).click()
    page.wait_for_url(f"{server.url}/tasks/{task.pk}/")
    expect(page.locator("h1")).to_contain_text("nightly reconciliation")

    page.goto(f"{server.url}/schedules/")
    card.locator("summary", has_text="Edit").click()
    card.get_by_label("Cron (five fields, or @daily…)").fill("")
    card.get_by_label("or every (seconds)").fill("7200")
    card.get_by_label("Input (JSON)").fill('{"ledger": "us"}')
    card.get_by_role("button", name="Save as version 2").click()
    expect(page.locator("ul.messages")).to_contain_text("now version 2")
    expect(card).to_contain_text("every 7200 s")
    edited = Schedule.objects.get(pk=schedule.pk)
    assert (edited.version, edited.cron, edited.interval_seconds) == (2, "", 7200)
    assert edited.template["input"] == {"ledger": "us"}
    assert Task.objects.get(pk=task.pk).input == {"ledger": "eu"}  # started, kept its own
    journal = ScheduleEvent.objects.filter(schedule=schedule).order_by("id")
    assert [(e.type, e.actor) for e in journal][1:] == [
        ("schedule.paused", admin.actor.label),
        ("schedule.resumed", admin.actor.label),
        ("schedule.triggered", admin.actor.label),
        ("schedule.edited", admin.actor.label),
    ]
    # A bad edit changes nothing and says why.
    card.locator("summary", has_text="Edit").click()
    card.get_by_label("Time zone").fill("Mars/Olympus")
    card.get_by_role("button", name="Save as version 3").click()
    expect(page.locator("ul.messages")).to_contain_text("was not changed")
    assert Schedule.objects.get(pk=schedule.pk).version == 2
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_an_operator_reads_the_page_without_its_buttons(page: Page, server):
    schedule = _schedule()
    operator = factories.console_user("operator")
    login(page, server.url, operator.actor.name)
    page.goto(f"{server.url}/schedules/")
    card = page.locator(f'section[data-schedule="{schedule.pk}"]')
    expect(card).to_contain_text("nightly reconciliation")
    expect(card.get_by_role("button")).to_have_count(0)
    expect(card).to_contain_text("Only admins")
    assert not ScheduleRun.objects.exists()


def test_the_page_fits_a_390_px_screen(browser: Browser, server):
    schedule = _schedule()
    admin = factories.console_user("admin")
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        phone = ctx.new_page()
        login(phone, server.url, admin.actor.name)
        phone.goto(f"{server.url}/schedules/")
        card = phone.locator(f'section[data-schedule="{schedule.pk}"]')
        phone.once("dialog", lambda dialog: dialog.accept())
        card.get_by_role("button", name="Trigger now").click()
        expect(phone.locator("ul.messages")).to_contain_text("started task")
        card.locator("summary", has_text="Edit").click()
        expect(card.get_by_role("button", name="Save as version 2")).to_be_visible()
        assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
    finally:
        ctx.close()
