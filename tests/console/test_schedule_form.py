"""The /schedules/ edit form hands the service what was typed: a cron and an interval together
are refused with the service's reason (the interval was dropped without a word), and a catch-up
window typed as 0 is checked as 0 (it became the default). Both databases."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runtime.models import Schedule
from tests import factories
from tests.api.test_schedules_api import VALID

pytestmark = pytest.mark.django_db


def _form(schedule: Schedule, **changes: str) -> dict[str, Any]:
    task = schedule.template
    form = {
        "cron": schedule.cron,
        "interval_seconds": "",
        "timezone": schedule.timezone,
        "overlap": schedule.overlap,
        "catch_up_seconds": str(schedule.catch_up_seconds),
        "name": task["name"],
        "input": '{"team": "ops"}',
        "version": str(schedule.version),
    }
    return {**form, **changes}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"interval_seconds": "7200"}, "exactly one of cron and interval_seconds"),
        ({"catch_up_seconds": "0"}, "catch_up_seconds"),
    ],
)
def test_what_the_form_was_given_is_what_the_service_decides_on(changes, said):
    admin = factories.console_user("admin")
    created = admin.client().post("/api/v1/schedules", VALID, format="json")
    assert created.status_code == 201, created.content
    schedule = Schedule.objects.get(pk=created.json()["id"])
    browser = Client()
    browser.force_login(admin.actor_user())
    answer = browser.post(f"/schedules/{schedule.pk}/edit", _form(schedule, **changes), follow=True)
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "was not changed" in text and said in text, text[-3000:]
    after = Schedule.objects.get(pk=schedule.pk)
    assert (after.version, after.cron, after.interval_seconds, after.catch_up_seconds) == (
        1,
        "0 6 * * 1-5",
        None,
        300,
    )
