"""Input never makes the system fetch, read or show what it names: a JSON Schema of a required
check refers only inside itself (no http:// or file:// retrieval, at creation or at a check run,
even for a schema stored before the rule), storage keys are content addresses only, and names
refuse the characters that make a text read differently from what it is (runtime/text.py)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import artifact_store as store
from runtime import completion
from runtime.errors import CompletionRefused
from runtime.models import CheckResult, Operation, RequiredCheck, Task
from tests import factories
from tests.api.support import assert_error, post_json
from tests.api.test_outcomes_api import upload, version

SECRET = "s3cr3t-from-the-inside"


class Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = json.dumps({"type": "string", "description": SECRET}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on a free local port that serves a schema and counts every request."""
    hits: list[str] = []
    handler = type("Handler", (Counting,), {"hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "secret.json"
    path.write_text(json.dumps({"type": "string", "description": SECRET}))
    return path.as_uri()


def _remote_schemas(base: str, file_uri: str) -> list[dict[str, Any]]:
    return [
        {"$ref": f"{base}/x.json"},
        {"type": "object", "properties": {"a": {"$ref": f"{base}/a.json#/x"}}},
        {"$dynamicRef": f"{base}/d.json"},
        # $id tricks: a relative reference resolved against a remote base.
        {"$id": f"{base}/root.json", "$ref": "other.json"},
        {"$defs": {"x": {"$id": f"{base}/nested/", "allOf": [{"$ref": "y.json"}]}}},
        {"$schema": f"{base}/meta.json"},
        {"$ref": file_uri},
        {"allOf": [{"$ref": "/etc/passwd"}]},
    ]


def _create(client: Any, schema: dict[str, Any]) -> Any:
    shape = {"artifact": "r", "schema": schema}
    return post_json(
        client,
        "/api/v1/tasks",
        {
            "name": "t",
            "required_checks": [
                {"name": "present", "checker": "artifact_present", "config": {"artifact": "r"}},
                {"name": "shape", "checker": "json_schema", "config": shape},
            ],
        },
    )


@pytest.mark.django_db(transaction=True)
def test_a_schema_that_refers_outside_itself_is_refused_at_creation(schema_server, secret_file):
    base, hits = schema_server
    alice = factories.agent()
    client = alice.client()
    for schema in _remote_schemas(base, secret_file):
        error = assert_error(_create(client, schema), 400, "invalid_input")
        assert error["field"] == "required_checks[1].config.schema", (schema, error)
        assert "required_checks[1].config.schema" in error["message"]
        assert SECRET not in error["message"]
    # The operation checker's check tool takes a schema too: same rule, its own field.
    error = assert_error(
        post_json(
            client,
            "/api/v1/tasks",
            {
                "name": "t",
                "required_checks": [
                    {
                        "name": "on a worker",
                        "checker": "operation",
                        "config": {
                            "artifact": "r",
                            "tool": "check.json_schema",
                            "params": {"schema": {"$ref": f"{base}/w.json"}},
                        },
                    }
                ],
            },
        ),
        400,
        "invalid_input",
    )
    assert error["field"] == "required_checks[0].config.params.schema"
    assert Task.objects.count() == 0 and RequiredCheck.objects.count() == 0
    assert hits == []


@pytest.mark.django_db(transaction=True)
def test_local_references_and_shipped_metaschemas_still_work(fs_artifacts):
    alice = factories.agent()
    client = alice.client()
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/report.schema.json",
        "$defs": {"text": {"type": "string"}},
        "type": "object",
        "properties": {"summary": {"$ref": "#/$defs/text"}},
        "required": ["summary"],
        "examples": [{"$ref": "not a reference: data"}],
    }
    response = _create(client, schema)
    assert response.status_code == 201, response.content
    task = response.json()
    made = upload(client, task["id"], b'{"summary": 5}', name="r").json()
    post_json(
        client,
        f"/api/v1/artifacts/{made['id']}/accept",
        {"expected_state_version": version(client, task["id"])},
    )
    refused = assert_error(post_json(client, f"/api/v1/tasks/{task['id']}/complete", {}), 409)
    shape = next(c for c in refused["checks"] if c["name"] == "shape")
    assert "summary" in shape["reason"] and "not of type 'string'" in shape["reason"], shape
    old = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
    assert _create(client, old).status_code == 201


def _stored_before(owner: Any, schema: dict[str, Any]) -> Task:
    """A task whose json_schema check was stored before the rule (written straight to the
    database, as old rows are), with its artifact accepted."""
    task = factories.task(owner)
    RequiredCheck.objects.create(
        task=task, name="shape", checker="json_schema", config={"artifact": "r", "schema": schema}
    )
    client = owner.client()
    made = upload(client, task.pk, b'{"summary": "ok"}', name="r").json()
    accepted = post_json(
        client,
        f"/api/v1/artifacts/{made['id']}/accept",
        {"expected_state_version": version(client, task.pk)},
    )
    assert accepted.status_code == 200, accepted.content
    return task


@pytest.mark.django_db(transaction=True)
def test_a_stored_remote_schema_fetches_nothing_when_checked(
    fs_artifacts, schema_server, secret_file
):
    base, hits = schema_server
    alice = factories.agent()
    for schema in _remote_schemas(base, secret_file):
        task = _stored_before(alice, schema)
        # Over the API (the web process runs the inline checker) and through the service.
        refused = assert_error(
            post_json(alice.client(), f"/api/v1/tasks/{task.pk}/complete", {}),
            409,
            "completion_refused",
        )
        with pytest.raises(CompletionRefused):
            completion.task_complete(alice.actor, task.pk)
        assert [c["name"] for c in refused["checks"]] == ["shape"]
        results = list(CheckResult.objects.filter(task=task).values_list("result", "reason"))
        assert len(results) == 2, results
        for result, reason in results:
            assert result in ("failed", "unavailable"), (schema, result, reason)
            assert SECRET not in reason and "string" not in reason, reason
        assert SECRET not in json.dumps(refused)
        assert Task.objects.get(pk=task.pk).outcome is None
    assert hits == []


@pytest.mark.django_db(transaction=True)
def test_the_check_tool_reads_only_its_own_tasks_artifact(fs_artifacts):
    """An agent may propose ``check.json_schema`` itself: params.artifact names an artifact of
    the task, never a storage key or a path, and another task's bytes are out of reach."""
    from runtime.tools import InvocationContext, ToolFailure, adapter_for

    alice, bob = factories.agent(), factories.agent()
    theirs = factories.task(bob)
    made = upload(bob.client(), theirs.pk, b'"their secret"', name="r").json()
    mine = factories.task(alice)
    tool = adapter_for("check.json_schema")
    schema = {"type": "object"}
    for subject in (
        {"id": made["id"], "digest": made["digest"], "key": store.content_key(made["digest"][7:])},
        {"id": "x", "digest": made["digest"], "key": "sha256/../../../../etc/passwd"},
        {"key": "../../etc/passwd"},
    ):
        ctx = InvocationContext(
            operation_id="op_x",
            task_id=mine.pk,
            step="s",
            idempotency_key="k",
            params={"schema": schema, "artifact": subject},
            fencing_token=1,
            invocation_number=1,
            deadline=None,
        )
        with pytest.raises(ToolFailure) as failure:
            tool.invoke(ctx)
        assert "their secret" not in failure.value.args[-1]
    for key in ("sha256/../../etc/passwd", "/etc/passwd", "sha256/ab/" + "a" * 64 + "\n"):
        with pytest.raises(store.BadKey):
            list(store.content_chunks(key))
    assert Operation.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("hidden", ["\u202e", "\u200b", "\u2066", "\ufeff", "\u061c", "\u2028"])
def test_names_refuse_hidden_characters(hidden):
    alice = factories.agent()
    client = alice.client()
    error = assert_error(
        post_json(client, "/api/v1/tasks", {"name": f"pay acct_1{hidden}9876"}),
        400,
        "invalid_input",
    )
    assert error["field"] == "name" and "name" in error["message"]
    error = assert_error(
        post_json(
            client,
            "/api/v1/tasks",
            {
                "name": "t",
                "required_checks": [
                    {
                        "name": f"c{hidden}d",
                        "checker": "artifact_present",
                        "config": {"artifact": "r"},
                    }
                ],
            },
        ),
        400,
        "invalid_input",
    )
    assert error["field"] == "required_checks[0].name"
    assert Task.objects.count() == 0
    task = post_json(client, "/api/v1/tasks", {"name": "t"}).json()
    for kind in ("tool", "wait_signal"):
        body = {"kind": kind, "step": f"charge{hidden}", "signal": "go"}
        if kind == "tool":
            body = {"tool": "demo.echo", "step": f"charge{hidden}", "params": {}}
        error = assert_error(
            post_json(client, f"/api/v1/tasks/{task['id']}/operations", body), 400, "invalid_input"
        )
        assert error["field"] == "step"
    assert Operation.objects.count() == 0
    # Tool parameters keep them: the tool may need them, and the console shows them escaped.
    kept = post_json(
        client,
        f"/api/v1/tasks/{task['id']}/operations",
        {"tool": "demo.echo", "step": "echo", "params": {"account": f"acct_1{hidden}9876"}},
    )
    assert kept.status_code == 201, kept.content
    assert kept.json()["params"]["account"] == f"acct_1{hidden}9876"


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_a_stored_remote_schema_fetches_nothing_on_a_worker(workers, fs_artifacts, schema_server):
    """The ``operation`` checker's tool runs on a real worker: a schema stored before the rule
    makes no request there either, and the check is unavailable without the server's words."""
    from tests.conftest import wait_for

    base, hits = schema_server
    workers.start(1, ARTIFACT_ROOT=str(fs_artifacts))
    alice = factories.agent()
    task = factories.task(alice)
    RequiredCheck.objects.create(
        task=task,
        name="on a worker",
        checker="operation",
        config={
            "artifact": "r",
            "tool": "check.json_schema",
            "params": {"schema": {"$ref": f"{base}/w.json"}},
        },
    )
    # The proposal stores the params as they were (validated before the rule existed).
    import runtime.tools.checks as tool_module

    original = tool_module.JsonSchemaCheck.validate
    tool_module.JsonSchemaCheck.validate = lambda self, params: None  # type: ignore[method-assign]
    try:
        made = upload(alice.client(), task.pk, b'{"summary": "ok"}', name="r").json()
        post_json(
            alice.client(),
            f"/api/v1/artifacts/{made['id']}/accept",
            {"expected_state_version": version(alice.client(), task.pk)},
        )
        with pytest.raises(CompletionRefused):
            completion.task_complete(alice.actor, task.pk)
    finally:
        tool_module.JsonSchemaCheck.validate = original  # type: ignore[method-assign]
    op = Operation.objects.get(task=task, tool="check.json_schema")
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status in ("failed", "succeeded"),
        timeout=60,
        what=f"the check operation to end:\n{workers.workers[0].tail()}",
    )
    op.refresh_from_db()
    assert op.status == "failed" and SECRET not in json.dumps(op.error), op.error
    with pytest.raises(CompletionRefused) as refused:
        completion.task_complete(alice.actor, task.pk)
    [check] = refused.value.details["checks"]
    assert check["reason"].startswith("unavailable") and SECRET not in check["reason"], check
    assert hits == []
