"""A schedule whose owner can no longer act, over HTTP (issue 33 point 6): an admin revoking the
agent's only token on /tokens/ pauses the agent's schedule (journaled by the scheduler, with the
reason and the admin who revoked); resume and trigger answer 409 ``schedule_owner_inactive``
with the reason, to an admin too, and change nothing; /schedules/ says why it is paused and
that its owner cannot act; once the agent has a new token an admin resumes it. Both
databases."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime.models import ApiToken, Schedule, ScheduleEvent, ScheduleRun, Task
from runtime.schedule_owners import AGENT_WITHOUT_TOKEN
from runtime.tokens import token_issue_for_agent
from tests import factories
from tests.api.support import assert_error
from tests.api.test_schedules_api import VALID

pytestmark = pytest.mark.django_db


def test_a_revoked_agents_schedule_is_paused_refuses_resume_and_trigger_and_says_why():
    owner, admin = factories.agent(), factories.console_user("admin")
    created = owner.client().post("/api/v1/schedules", VALID, format="json")
    assert created.status_code == 201, created.content
    sid = created.json()["id"]
    browser = Client()
    browser.force_login(admin.actor_user())
    token = ApiToken.objects.get(prefix=owner.token.split("_")[1])

    revoked = browser.post(f"/tokens/{token.pk}/revoke")
    assert revoked.status_code == 302

    schedule = admin.client().get(f"/api/v1/schedules/{sid}").json()
    assert schedule["paused"] is True
    pause = ScheduleEvent.objects.get(schedule_id=sid, type="schedule.paused")
    assert (pause.actor, pause.data["reason"]) == ("system:scheduler", AGENT_WITHOUT_TOKEN)
    assert pause.data["revoked_by"] == admin.actor.label
    assert_error(owner.client().post(f"/api/v1/schedules/{sid}/resume", {}), 401)

    base = f"/api/v1/schedules/{sid}"
    for action in ("resume", "trigger"):
        refused = admin.client().post(f"{base}/{action}", {}, format="json")
        error = assert_error(refused, 409, "schedule_owner_inactive")
        assert error["reason"] == AGENT_WITHOUT_TOKEN and "new token" in error["message"]
    assert Schedule.objects.get(pk=sid).paused
    assert not ScheduleRun.objects.exists() and not Task.objects.exists()
    assert ScheduleEvent.objects.filter(schedule_id=sid).count() == 2  # created, paused

    page = browser.get("/schedules/").content.decode()
    assert "by system:scheduler" in page and AGENT_WITHOUT_TOKEN in page
    assert "data-owner-inactive" in page
    said = browser.post(f"/schedules/{sid}/act", {"action": "resume"}, follow=True)
    assert "Nothing was done" in said.content.decode() and Schedule.objects.get(pk=sid).paused

    replacement = token_issue_for_agent(owner.actor.name, "replacement")
    assert replacement.token.agent_id == owner.actor.agent_id
    resumed = admin.client().post(f"{base}/resume", {"reason": "new token"}, format="json")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    page = browser.get("/schedules/").content.decode()
    assert "data-owner-inactive" not in page and "data-pause-reason" not in page
