"""The schedules API (docs/schedules.md): create with the task in POST /tasks' shape and rules,
refusals naming the field and changing nothing, who may do what, pause, resume and trigger,
PATCH as a new version, and the tasks a schedule started listed by ``?schedule=``."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from console.api.schedules import ScheduleRunSerializer, run_out, schedule_detail_out
from runtime.models import Schedule, ScheduleEvent, ScheduleRun, Task
from tests import factories
from tests.api.support import assert_error

# No postgres mark: these run on SQLite too (make pytest-embedded).
pytestmark = pytest.mark.django_db

VALID: dict[str, Any] = {
    "cron": "0 6 * * 1-5",
    "timezone": "Europe/Paris",
    "task": {
        "name": "morning digest",
        "input": {"team": "ops"},
        "budget": {"cost_cents": 200},
        "deadline_seconds": 900,
        "required_checks": [{"name": "has report", "checker": "artifact_present",
                             "config": {"artifact": "report"}}],
    },
    "overlap": "buffer_one",
    "catch_up_seconds": 300,
}  # fmt: skip


def _create(client: APIClient, body: dict[str, Any] | None = None, **headers: Any) -> Any:
    return client.post("/api/v1/schedules", body or VALID, format="json", **headers)


def _nothing_created() -> None:
    assert not Schedule.objects.exists() and not ScheduleEvent.objects.exists()


def test_an_agent_creates_a_schedule_it_owns():
    owner = factories.agent()
    response = _create(owner.client())
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"].startswith("sch_")
    assert (body["cron"], body["interval_seconds"], body["timezone"]) == (
        "0 6 * * 1-5",
        None,
        "Europe/Paris",
    )
    assert body["owner"] == owner.actor.label and body["created_by"] == owner.actor.label
    assert body["task"]["name"] == "morning digest"
    assert body["task"]["required_checks"][0]["checker"] == "artifact_present"
    assert (body["overlap"], body["catch_up_seconds"], body["paused"], body["version"]) == (
        "buffer_one",
        300,
        False,
        1,
    )
    # Weekday mornings at 06:00 in Paris: 04:00 or 05:00 UTC.
    assert len(body["next_runs"]) == 5 and body["next_runs"][0] == body["next_run_at"]
    assert all(t[11:16] in ("04:00", "05:00") for t in body["next_runs"])
    assert body["runs"] == []
    event = ScheduleEvent.objects.get(schedule_id=body["id"])
    assert (event.type, event.actor, event.version) == ("schedule.created", owner.actor.label, 1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "0 6 * *"}, "cron"),
        ({"cron": "every morning"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "", "interval_seconds": None}, "cron"),
        ({"interval_seconds": 3600}, "cron"),  # and a cron: exactly one of the two
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"timezone": "UTC+2"}, "timezone"),
        ({"overlap": "queue_all"}, "overlap"),
        ({"catch_up_seconds": 1}, "catch_up_seconds"),
        ({"cron": "", "interval_seconds": 5}, "interval_seconds"),
        ({"task": {"name": "  "}}, "task.name"),
        ({"task": {"name": "a\u202eb"}}, "task.name"),
        ({"task": {"name": "x", "deadline_seconds": 0}}, "task.deadline_seconds"),
        ({"task": {"name": "x", "budget": {"not a meter": 1}}}, "task.budget"),
        ({"task": {"name": "x", "required_checks": [{"name": "c", "checker": "nope"}]}},
         "task.required_checks[0].checker"),
    ],
)  # fmt: skip
def test_a_bad_schedule_is_a_400_naming_the_field_and_creates_nothing(change, field):
    body = {**VALID, **change}
    response = _create(factories.agent().client(), body)
    error = assert_error(response, 400)
    named = error.get("field") or ".".join(_first_path(error.get("fields", {})))
    assert named == field, error
    _nothing_created()


def _first_path(fields: Any) -> list[str]:
    """The path of the first message in DRF's nested per-field messages."""
    if isinstance(fields, dict):
        key = next(iter(fields))
        return [str(key), *_first_path(fields[key])]
    return []


def test_a_scheduled_task_has_no_parent():
    # The template is POST /tasks' body without ``parent`` (a child draws on a parent's
    # allowance; a schedule has none): the key is not read, the template never holds one.
    response = _create(factories.agent().client(), {**VALID, "task": {"name": "x", "parent": "t"}})
    assert response.status_code == 201, response.content
    assert "parent" not in response.json()["task"]


@pytest.mark.parametrize(("role", "status"), [("operator", 403), ("support", 403), ("admin", 201)])
def test_people_create_schedules_as_admins_only(role, status):
    person = factories.console_user(role)
    response = _create(person.client())
    assert response.status_code == status, response.content
    if status == 201:
        assert response.json()["owner"] == person.actor.label
    else:
        _nothing_created()


def test_who_sees_and_who_manages_a_schedule():
    owner, other = factories.agent(), factories.agent()
    people = {r: factories.console_user(r) for r in ("operator", "support", "admin")}
    sid = _create(owner.client()).json()["id"]
    base = f"/api/v1/schedules/{sid}"

    # Seeing: the owner and every console role; another agent gets a 404 (never a 403).
    assert other.client().get(base).status_code == 404
    assert other.client().get("/api/v1/schedules").json()["results"] == []
    for who in (owner, *people.values()):
        assert who.client().get(base).status_code == 200
        assert [s["id"] for s in who.client().get("/api/v1/schedules").json()["results"]] == [sid]

    # Managing: the owner and admins; operators and support read only, and change nothing.
    for who in (people["operator"], people["support"]):
        for action in ("pause", "resume", "trigger"):
            assert_error(who.client().post(f"{base}/{action}", {}, format="json"), 403)
        assert_error(who.client().patch(base, {"overlap": "skip"}, format="json"), 403)
    assert_error(other.client().post(f"{base}/trigger", {}, format="json"), 404)
    assert not ScheduleRun.objects.exists() and not Task.objects.exists()
    assert Schedule.objects.get(pk=sid).version == 1
    for who in (owner, people["admin"]):
        assert who.client().post(f"{base}/pause", {}, format="json").status_code == 200
        assert who.client().post(f"{base}/resume", {}, format="json").status_code == 200
    actors = list(
        ScheduleEvent.objects.filter(schedule_id=sid).order_by("id").values_list("type", "actor")
    )
    assert actors == [
        ("schedule.created", owner.actor.label),
        ("schedule.paused", owner.actor.label),
        ("schedule.resumed", owner.actor.label),
        ("schedule.paused", people["admin"].actor.label),
        ("schedule.resumed", people["admin"].actor.label),
    ]


def test_pause_resume_and_trigger():
    owner = factories.agent()
    client = owner.client()
    sid = _create(client, {**VALID, "overlap": "skip"}).json()["id"]
    base = f"/api/v1/schedules/{sid}"

    paused = client.post(f"{base}/pause", {"reason": "holiday"}, format="json")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    again = client.post(f"{base}/pause", {}, format="json")  # harmless, no second entry
    assert again.status_code == 200
    assert ScheduleEvent.objects.filter(schedule_id=sid, type="schedule.paused").count() == 1

    # Trigger: a task now, even paused, carrying the schedule; replayed by its key.
    triggered = client.post(f"{base}/trigger", {}, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    assert triggered.status_code == 201, triggered.content
    body = triggered.json()
    task = body["task"]
    assert task["schedule"] == sid and task["name"] == "morning digest"
    assert task["budget"] == {"cost_cents": 200} and task["deadline"] is not None
    assert (body["run"]["kind"], body["run"]["status"], body["run"]["task"]) == (
        "manual",
        "started",
        task["id"],
    )
    replay = client.post(f"{base}/trigger", {}, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    assert replay.json() == body
    assert Task.objects.filter(schedule_id=sid).count() == 1
    assert client.get(f"/api/v1/tasks/{task['id']}").json()["schedule"] == sid

    resumed = client.post(f"{base}/resume", {}, format="json")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    detail = client.get(base).json()
    assert [r["task"] for r in detail["runs"]] == [task["id"]]


def test_tasks_are_listed_by_the_schedule_that_started_them():
    owner = factories.agent()
    client = owner.client()
    first = _create(client).json()["id"]
    second = _create(client).json()["id"]
    started = [
        client.post(f"/api/v1/schedules/{sid}/trigger", {}, format="json").json()["task"]["id"]
        for sid in (first, first, second)
    ]
    factories.task(owner, "by hand")
    listed = client.get("/api/v1/tasks", {"schedule": first}).json()["results"]
    assert sorted(t["id"] for t in listed) == sorted(started[:2])
    assert all(t["schedule"] == first for t in listed)
    assert client.get("/api/v1/tasks", {"schedule": "sch_none"}).json()["results"] == []
    # Another agent's filter finds nothing of the owner's.
    assert factories.agent().client().get("/api/v1/tasks", {"schedule": first}).json() == {
        "results": [],
        "next": None,
    }
    assert_error(client.get("/api/v1/tasks", {"schedule": "x" * 65}), 400)


def test_patch_makes_a_new_version_and_refuses_what_it_cannot_change():
    owner = factories.agent()
    client = owner.client()
    sid = _create(client).json()["id"]
    base = f"/api/v1/schedules/{sid}"

    edited = client.patch(
        base,
        {"interval_seconds": 3600, "cron": "", "task": {"input": {"team": "sre"}}, "version": 1},
        format="json",
    )
    assert edited.status_code == 200, edited.content
    body = edited.json()
    assert (body["version"], body["cron"], body["interval_seconds"]) == (2, None, 3600)
    assert body["task"]["input"] == {"team": "sre"} and body["task"]["name"] == "morning digest"
    assert body["next_run_at"].endswith(":00:00Z")

    assert_error(client.patch(base, {"overlap": "skip", "version": 1}, format="json"), 409,
                 "state_version_mismatch")  # fmt: skip
    refused = assert_error(client.patch(base, {"paused": True}, format="json"), 400)
    assert refused["field"] == "paused"
    refused = assert_error(client.patch(base, {"timezone": "Nowhere/Land"}, format="json"), 400)
    assert refused["field"] == "timezone"
    refused = assert_error(
        client.patch(base, {"task": {"required_checks": [{"checker": "artifact_present"}]}},
                     format="json"), 400)  # fmt: skip
    assert refused["field"] == "task.required_checks[0].name"
    assert Schedule.objects.get(pk=sid).version == 2
    assert ScheduleEvent.objects.filter(schedule_id=sid, type="schedule.edited").count() == 1


def test_the_schema_components_hold_exactly_the_keys_rendered():
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    owner = factories.agent()
    sid = _create(owner.client()).json()["id"]
    owner.client().post(f"/api/v1/schedules/{sid}/trigger", {}, format="json")
    schedule = Schedule.objects.select_related("agent", "user").get(pk=sid)
    detail = schedule_detail_out(schedule)
    assert set(detail) == set(components["ScheduleDetail"]["properties"])
    assert set(components["ScheduleDetail"]["required"]) == set(detail)
    run = run_out(ScheduleRun.objects.get(schedule=schedule))
    assert set(run) == set(ScheduleRunSerializer().fields)
    assert set(run) == set(components["ScheduleRun"]["properties"])
    assert "schedule" in components["Task"]["required"]
    assert {p["name"] for p in schema["paths"]["/api/v1/tasks"]["get"]["parameters"]} >= {
        "schedule"
    }
