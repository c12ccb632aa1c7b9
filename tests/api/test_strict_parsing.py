"""Bodies mean one thing: duplicate JSON keys are refused (Python keeps the last, other
parsers the first), a body that is not JSON is a 415 rather than read as something else or
dropped, and lengths are checked on exactly what was sent."""

from __future__ import annotations

import pytest

from runtime.models import Event, IdempotentRequest, Operation, Task
from tests import factories
from tests.api.support import assert_error, post_json, post_raw

# No postgres mark: these run on SQLite too (make pytest-embedded).


@pytest.mark.parametrize(
    "raw",
    [
        '{"name": "a", "name": "b"}',
        '{"name": "a", "input": {"k": 1, "k": 2}}',
        '{"name": "a", "input": {"list": [{"x": 1, "x": 1}]}}',
    ],
    ids=["top-level", "nested", "in-a-list"],
)
def test_duplicate_keys_are_400_and_create_nothing(db, raw):
    client = factories.agent().client()
    error = assert_error(post_raw(client, "/api/v1/tasks", raw), 400, "malformed_request")
    assert "duplicate key" in error["message"]
    assert_error(post_raw(client, "/api/v1/tasks", raw, HTTP_IDEMPOTENCY_KEY="d"), 400)
    assert not Task.objects.exists() and not IdempotentRequest.objects.exists()


def test_duplicate_keys_in_operation_params_are_refused(db):
    owner = factories.agent()
    task = factories.task(owner)
    raw = '{"tool": "demo.echo", "step": "s", "params": {"amount": 1, "amount": 1000}}'
    assert_error(post_raw(owner.client(), f"/api/v1/tasks/{task.pk}/operations", raw), 400)
    assert not Operation.objects.exists()


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", "tool=demo.echo&step=s&params=%7B%22a%22%3A1%7D"),
        (
            "multipart/form-data; boundary=b",
            '--b\r\nContent-Disposition: form-data; name="step"\r\n\r\ns\r\n--b--\r\n',
        ),
        ("text/plain", '{"tool": "demo.echo", "step": "s"}'),
        ("application/xml", "<op/>"),
    ],
    ids=["form", "multipart", "text", "xml"],
)
def test_a_body_that_is_not_json_is_415_and_proposes_nothing(db, content_type, body):
    owner = factories.agent()
    task = factories.task(owner)
    events = Event.objects.count()
    response = owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations", data=body, content_type=content_type
    )
    assert_error(response, 415, "unsupported_media_type")
    assert not Operation.objects.exists() and Event.objects.count() == events


def test_a_body_without_a_content_type_is_415_not_dropped(db):
    admin = factories.console_user("admin")
    task = factories.task(factories.agent())
    response = admin.client().generic(
        "POST", f"/api/v1/tasks/{task.pk}/cancel", b'{"reason": "why"}', content_type=""
    )
    assert_error(response, 415, "unsupported_media_type")
    task.refresh_from_db()
    assert task.cancellation == "none"


def test_a_post_without_a_body_still_works(db):
    admin = factories.console_user("admin")
    task = factories.task(factories.agent())
    response = admin.client().generic("POST", f"/api/v1/tasks/{task.pk}/cancel", b"")
    assert response.status_code == 202, response.content


def test_json_with_a_charset_is_json(db):
    response = (
        factories.agent()
        .client()
        .post(
            "/api/v1/tasks", data=b'{"name": "x"}', content_type="application/json; charset=utf-8"
        )
    )
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("n" * 300, 201),
        (" " + "n" * 300, 400),
        ("n" * 300 + "  ", 400),
        ("n" * 301, 400),
        ("   ", 400),
        ("", 400),
    ],
    ids=["max", "leading-space-over", "trailing-space-over", "over", "blank", "empty"],
)
def test_the_length_checked_is_the_length_sent(db, name, status):
    response = post_json(factories.agent().client(), "/api/v1/tasks", {"name": name})
    assert response.status_code == status, response.content
    if status == 201:
        assert Task.objects.get().name == name
    else:
        assert not Task.objects.exists()


def test_surrounding_space_is_trimmed_by_the_service_within_the_limit(db):
    response = post_json(factories.agent().client(), "/api/v1/tasks", {"name": "  pay rent  "})
    assert response.status_code == 201
    assert response.json()["name"] == "pay rent"
