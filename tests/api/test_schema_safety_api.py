"""A json_schema check's schema cannot stall the web process or end in an exception (issue 33),
over the API: the catastrophic pattern ``^(a+)+$`` is answered (failed) at once on RE2, a
pattern RE2 cannot run and a reference that never ends are refused at creation (400 naming the
field), and such a schema stored before the rule is ``unavailable``, in the inline checker and
in the check tool the workers run. Runs on SQLite too, but for the real-server test."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from runtime.models import CheckResult, RequiredCheck, Task
from tests import factories
from tests.api.support import assert_error, post_json
from tests.api.test_outcomes_api import upload, version
from tests.runtime.test_schema_regex_safety import no_re  # noqa: F401 (a fixture)

CATASTROPHIC = {"type": "string", "pattern": "^(a+)+$"}
TREE = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "children": {"items": {"$ref": "#"}}},
}
CYCLES: list[dict[str, Any]] = [
    {"$ref": "#"},
    {"allOf": [{"$ref": "#"}]},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
]


def checks_with(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": "present", "checker": "artifact_present", "config": {"artifact": "r"}},
        {"name": "shape", "checker": "json_schema", "config": {"artifact": "r", "schema": schema}},
    ]


def accept(client: Any, task_id: str, data: bytes) -> None:
    made = upload(client, task_id, data, name="r")
    assert made.status_code == 201, made.content
    accepted = post_json(
        client,
        f"/api/v1/artifacts/{made.json()['id']}/accept",
        {"expected_state_version": version(client, task_id)},
    )
    assert accepted.status_code == 200, accepted.content


def shape_of(refused: dict[str, Any]) -> str:
    return str(next(c for c in refused["checks"] if c["name"] == "shape")["reason"])


@pytest.mark.django_db(transaction=True)
def test_the_catastrophic_pattern_fails_at_once_over_the_api(fs_artifacts, no_re):  # noqa: F811
    """(a) ``re`` would hold the web process until the check timed out (and after); RE2 finds
    no match, the check is failed, and a matching artifact then lets the task complete."""
    alice = factories.agent()
    client = alice.client()
    created = post_json(
        client, "/api/v1/tasks", {"name": "t", "required_checks": checks_with(CATASTROPHIC)}
    )
    assert created.status_code == 201, created.content
    task = created.json()["id"]
    accept(client, task, json.dumps("a" * 40 + "!").encode())
    refused = assert_error(post_json(client, f"/api/v1/tasks/{task}/complete", {}), 409)
    assert shape_of(refused).startswith("failed: (root): 'aaaa"), refused
    assert "does not match '^(a+)+$'" in shape_of(refused)
    row = CheckResult.objects.filter(task_id=task, name="shape").order_by("-at").first()
    assert row is not None and row.result == "failed"
    accept(client, task, json.dumps("a" * 40).encode())
    done = post_json(client, f"/api/v1/tasks/{task}/complete", {})
    assert done.status_code == 200, done.content
    assert Task.objects.get(pk=task).outcome == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_patterns_re2_cannot_run_and_endless_references_are_refused_at_creation():
    """(b), (c) 400 invalid_input naming the field, nothing created; a recursive tree schema
    (its reference under items) is accepted."""
    client = factories.agent().client()
    field = "required_checks[1].config.schema"
    patterns: list[tuple[dict[str, Any], str]] = [
        ({"properties": {"x": {"pattern": "(a)\\1"}}}, "pattern at /properties/x/pattern"),
        ({"type": "string", "pattern": "^(?=a)a+$"}, "pattern at /pattern"),
        (
            {"patternProperties": {"(?<=k)v": {}}},
            "patternProperties name '(?<=k)v' at /patternProperties",
        ),
    ]
    for schema, says in patterns:
        error = assert_error(
            post_json(
                client, "/api/v1/tasks", {"name": "t", "required_checks": checks_with(schema)}
            ),
            400,
            "invalid_input",
        )
        assert error["field"] == field, error
        assert error["message"].startswith(f"{field}: {says} uses a construct"), error
        assert "linear-time engine cannot run" in error["message"]
    for schema in CYCLES:
        error = assert_error(
            post_json(
                client, "/api/v1/tasks", {"name": "t", "required_checks": checks_with(schema)}
            ),
            400,
            "invalid_input",
        )
        assert error["field"] == field, error
        assert error["message"].startswith(f"{field}: the reference at /"), error
        assert "never end" in error["message"]
    # The operation checker's check tool takes a schema too: the same rules, its own field.
    operation_check = {
        "name": "on a worker",
        "checker": "operation",
        "config": {
            "artifact": "r",
            "tool": "check.json_schema",
            "params": {"schema": {"allOf": [{"$ref": "#"}], "pattern": "(a)\\1"}},
        },
    }
    error = assert_error(
        post_json(client, "/api/v1/tasks", {"name": "t", "required_checks": [operation_check]}),
        400,
        "invalid_input",
    )
    assert error["field"] == "required_checks[0].config.params.schema", error
    assert "pattern at /pattern" in error["message"]
    assert Task.objects.count() == 0 and RequiredCheck.objects.count() == 0
    made = post_json(client, "/api/v1/tasks", {"name": "t", "required_checks": checks_with(TREE)})
    assert made.status_code == 201, made.content


def stored_before(owner: Any, schema: dict[str, Any], data: bytes) -> Task:
    """A task whose json_schema check was stored before the rules (written straight to the
    database, as old rows are), with its artifact accepted."""
    task = factories.task(owner)
    RequiredCheck.objects.create(
        task=task, name="shape", checker="json_schema", config={"artifact": "r", "schema": schema}
    )
    accept(owner.client(), task.pk, data)
    return task


@pytest.mark.django_db(transaction=True)
def test_a_stored_schema_that_never_ends_or_cannot_run_is_unavailable(fs_artifacts, no_re):  # noqa: F811
    """(d) Not an exception (it was "the checker failed: RecursionError"): unavailable, in
    plain words; the task does not complete."""
    alice = factories.agent()
    client = alice.client()
    stored: list[tuple[dict[str, Any], str]] = [
        *[(schema, "unavailable: the schema refers to itself without end") for schema in CYCLES],
        ({"pattern": "(a)\\1"}, "unavailable: the schema is refused: pattern at /pattern"),
    ]
    for schema, says in stored:
        task = stored_before(alice, schema, b'{"name": "x"}')
        refused = assert_error(post_json(client, f"/api/v1/tasks/{task.pk}/complete", {}), 409)
        assert shape_of(refused).startswith(says), (schema, refused)
        rows = CheckResult.objects.filter(task=task).values_list("result", flat=True)
        assert list(rows) == ["unavailable"]
        assert Task.objects.get(pk=task.pk).outcome is None


@pytest.mark.django_db(transaction=True)
def test_the_check_tool_fails_permanently_on_a_stored_endless_schema(fs_artifacts):
    """The ``operation`` checker's tool, as a worker runs it: a permanent failure saying why
    (the check is then unavailable), where a RecursionError left the operation unresolved."""
    from runtime.tools import InvocationContext, ToolFailure, adapter_for

    alice = factories.agent()
    task = factories.task(alice)
    made = upload(alice.client(), task.pk, b'{"name": "x"}', name="r").json()
    for schema in CYCLES:
        ctx = InvocationContext(
            operation_id="op_x",
            task_id=task.pk,
            step="s",
            idempotency_key="k",
            params={"schema": schema, "artifact": {"id": made["id"], "digest": made["digest"]}},
            fencing_token=1,
            invocation_number=1,
            deadline=None,
        )
        with pytest.raises(ToolFailure) as failure:
            adapter_for("check.json_schema").invoke(ctx)
        assert failure.value.kind == ToolFailure.PERMANENT
        assert failure.value.message.startswith("the schema refers to itself without end")


@pytest.mark.postgres
def test_the_real_server_answers_the_catastrophic_pattern_and_healthz_meanwhile(
    transactional_db, tmp_path, fs_artifacts
):
    """Over real sockets: the catastrophic pattern is answered (failed, so well within the
    check's time limit) while another client's /healthz, asked all along, stays under the
    issue's 1 s each time (it takes some 50 ms on a loaded machine). On ``re`` the web process
    stalled: /healthz waited as long as the regex ran. The completion itself is not held to
    1 s: on two busy cores it took a third of that, too little margin for a bound."""
    import httpx

    from tests.conftest import server_start

    server = server_start(tmp_path, ARTIFACT_ROOT=str(fs_artifacts))
    try:
        alice = factories.agent()
        with httpx.Client(base_url=server.url, headers=alice.headers, timeout=30) as http:
            task = http.post(
                "/api/v1/tasks", json={"name": "t", "required_checks": checks_with(CATASTROPHIC)}
            ).json()["id"]
            made = http.post(
                f"/api/v1/tasks/{task}/artifacts",
                files={"file": ("r", json.dumps("a" * 40 + "!").encode(), "application/json")},
                data={"name": "r", "media_type": "application/json"},
            ).json()
            state = http.get(f"/api/v1/tasks/{task}").json()["state_version"]
            accepted = http.post(
                f"/api/v1/artifacts/{made['id']}/accept", json={"expected_state_version": state}
            )
            assert accepted.status_code == 200, accepted.text
            health: list[tuple[int, float]] = []
            done = threading.Event()

            def ask_health() -> None:
                with httpx.Client(base_url=server.url, timeout=30) as other:
                    while not done.is_set() or not health:
                        began = time.monotonic()
                        status = other.get("/healthz").status_code
                        health.append((status, time.monotonic() - began))

            asker = threading.Thread(target=ask_health)
            asker.start()
            try:
                refused = http.post(f"/api/v1/tasks/{task}/complete", json={})
            finally:
                done.set()
                asker.join(timeout=60)
        assert refused.status_code == 409, refused.text
        assert shape_of(refused.json()["error"]).startswith("failed: (root): 'aaaa")
        assert health and all(s == 200 and took < 1.0 for s, took in health), health
    finally:
        server.stop()
