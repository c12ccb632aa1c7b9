"""/api/schema/ describes the server exactly enough for conformance checks and generated
clients: a named component for every body, the Error for every refusal, JSON-only request
bodies marked required, enums and ranges on filters, minLength on required strings, and
components that hold exactly the keys the server renders."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from console.api import serializers as s
from console.api.declared_tools import NAME_PATTERN
from runtime.rules.statuses import OperationStatus, TaskCondition, TaskOutcome
from runtime.selectors.operations import invocations_of
from tests import factories

# No postgres mark: these run on SQLite too (make pytest-embedded).

METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def schema(db) -> dict:
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return dict(response.json())


def _operations(schema: dict):
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def _ref(content: dict) -> str:
    return str(content["application/json"]["schema"]["$ref"])


def test_every_success_body_is_a_named_component(schema):
    for path, method, op in _operations(schema):
        successes = {k: v for k, v in op["responses"].items() if k.startswith("2")}
        assert successes, (path, method)
        for status, response in successes.items():
            if path == "/api/v1/artifacts/{artifact_id}/content":
                # The one response that is the artifact's own bytes, served with the media type
                # it was stored with: any, as far as the schema can say.
                assert list(response["content"]) == ["*/*"], path
                continue
            assert list(response["content"]) == ["application/json"], (path, method, status)
            ref = _ref(response["content"])
            assert ref.startswith("#/components/schemas/"), (path, method, status)


def test_every_refusal_is_documented_with_the_error_component(schema):
    assert schema["components"]["schemas"]["Error"]["required"] == ["error"]
    for path, method, op in _operations(schema):
        expected = {"400", "401", "403", "404"}
        if method == "post":
            expected |= {"409", "413", "415", "422"}
        assert expected <= set(op["responses"]), (path, method, sorted(op["responses"]))
        for status, response in op["responses"].items():
            if status.startswith("4"):
                assert _ref(response["content"]) == "#/components/schemas/Error", (path, status)


def test_request_bodies_are_json_only_and_required_when_they_have_required_fields(schema):
    components = schema["components"]["schemas"]
    for path, method, op in _operations(schema):
        body = op.get("requestBody")
        if body is None:
            continue
        if path == "/api/v1/tasks/{task_id}/artifacts":
            # The one body that carries a file (API.md: multipart file, name, media_type).
            assert list(body["content"]) == ["multipart/form-data"], (path, method)
            continue
        assert list(body["content"]) == ["application/json"], (path, method)
        name = _ref(body["content"]).rsplit("/", 1)[1]
        if components[name].get("required"):
            assert body.get("required") is True, (path, method)


def test_required_request_strings_have_min_length(schema):
    components = schema["components"]["schemas"]
    for name in (
        "TaskIn",
        "ToolOperationIn",
        "WaitSignalOperationIn",
        "TimerOperationIn",
        "ResolveIn",
        "CheckIn",
        "ApproveIn",
        "DenyIn",
    ):
        component = components[name]
        for field in component.get("required", []):
            prop = component["properties"][field]
            if prop.get("type") == "string":
                assert prop.get("minLength", 0) >= 1, (name, field)
                assert prop.get("maxLength"), (name, field)


def test_filters_have_enums_and_ranges(schema):
    components = schema["components"]["schemas"]

    def params(path: str) -> dict:
        return {p["name"]: p["schema"] for p in schema["paths"][path]["get"]["parameters"]}

    def enum_of(param: dict) -> list:
        return (
            param["enum"] if "enum" in param else components[param["$ref"].split("/")[-1]]["enum"]
        )

    tasks = params("/api/v1/tasks")
    assert sorted(enum_of(tasks["condition"])) == sorted(TaskCondition.ALL)
    assert sorted(enum_of(tasks["outcome"])) == sorted(TaskOutcome.ALL)
    assert (tasks["limit"]["minimum"], tasks["limit"]["maximum"]) == (1, 200)
    ops = params("/api/v1/operations")
    assert sorted(enum_of(ops["status"])) == sorted(OperationStatus.ALL)
    events = params("/api/v1/tasks/{task_id}/events")
    assert (events["limit"]["minimum"], events["limit"]["maximum"]) == (1, 1000)
    assert "pattern" in events["after"]


def test_path_ids_carry_the_id_pattern(schema):
    for path, item in schema["paths"].items():
        for _, _, op in _operations({"paths": {path: item}}):
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    if param["name"] == "queue":  # a people's queue, by name: an enum
                        assert param["schema"]["enum"] == ["approvals", "unresolved"], path
                        continue
                    # Ids, but for a declared tool's name (/tools/declared/{name}): its own rule.
                    pattern = NAME_PATTERN if param["name"] == "name" else "^[A-Za-z0-9_-]{1,64}$"
                    assert param["schema"]["pattern"] == pattern, path


def _keys(component: dict) -> set[str]:
    return set(component["properties"])


def test_components_hold_exactly_the_keys_the_server_renders(schema):
    components = schema["components"]["schemas"]
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task)
    task_body = s.task_out(task, [])
    op_body = s.operation_out(op, invocations_of(op))
    assert set(task_body) == _keys(components["Task"])
    assert set(components["Task"]["required"]) == set(task_body)
    assert set(op_body) == _keys(components["Operation"])
    assert set(components["Operation"]["required"]) == set(op_body)
    from runtime.models import Event

    event = Event.objects.filter(task_id=task.pk).first()
    assert event is not None
    assert set(s.event_out(event)) == _keys(components["Event"])


def test_every_api_route_is_in_the_schema(schema):
    from console.api.urls import urlpatterns

    documented = {p.replace("{", "<").replace("}", ">") for p in schema["paths"]}
    for pattern in urlpatterns:
        if str(pattern.name).startswith("api-planned-"):
            continue  # planned routes (501) stay out of the schema until built
        route = "/api/v1/" + str(pattern.pattern).replace("<id:", "<").replace("<str:", "<")
        assert route in documented, route


def test_human_side_components_hold_exactly_the_keys_the_server_renders(schema):
    from runtime import control, signals

    components = schema["components"]["schemas"]
    owner = factories.agent()
    task = factories.task(owner)
    gated = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 25000}
    )
    approval = gated.approvals.get()
    approval_body = s.approval_out(approval)
    assert set(approval_body) == _keys(components["Approval"])
    assert set(components["Approval"]["required"]) == set(approval_body)
    op_body = s.operation_out(gated, [], approval_body)
    assert op_body["approval"] == approval_body
    assert set(op_body) == _keys(components["Operation"])

    answer = signals.signal_send(owner.actor, task.pk, event_id="e1", name="go", payload={})
    assert set(s.signal_out(answer.signal)) == _keys(components["Signal"])
    assert {"disposition", "signal"} == set(components["SignalAnswer"]["required"])

    steered, command = control.task_steer(owner.actor, task.pk, direction="left")
    assert set(s.command_out(command)) == _keys(components["Command"])
    task_body = s.task_out(steered, [])
    assert task_body["direction"] == {"text": "left", "version": 1}
    assert set(task_body) | {"command"} == _keys(components["TaskCommand"])
    assert set(task_body) == _keys(components["Task"])


def test_conditionally_required_fields_are_shapes_of_one_of(schema):
    """What a service refuses with 400 unless another field says otherwise is in the schema: an
    operation is one of three shapes, a decision one of two, each requiring its own fields."""
    components = schema["components"]["schemas"]

    def shapes(name: str) -> dict[str, list[str]]:
        refs = [r["$ref"].rsplit("/", 1)[1] for r in components[name]["oneOf"]]
        return {ref: sorted(components[ref]["required"]) for ref in refs}

    assert shapes("OperationIn") == {
        "ToolOperationIn": ["step", "tool"],
        "WaitSignalOperationIn": ["kind", "signal", "step"],
        "TimerOperationIn": ["kind", "step", "timeout_seconds"],
    }
    assert components["ToolOperationIn"]["properties"]["tool"]["minLength"] == 1
    assert "tool" not in components["TimerOperationIn"]["properties"]
    assert shapes("DecisionIn") == {
        "ApproveIn": ["decision", "params_hash"],
        "DenyIn": ["decision", "reason"],
    }
    assert components["DenyIn"]["properties"]["reason"]["pattern"] == "\\S"
    for path, name in [
        ("/api/v1/tasks/{task_id}/operations", "OperationIn"),
        ("/api/v1/approvals/{approval_id}/decision", "DecisionIn"),
    ]:
        body = schema["paths"][path]["post"]["requestBody"]
        assert body["required"] is True, path
        assert _ref(body["content"]) == f"#/components/schemas/{name}"


def test_the_upload_body_carries_the_file(schema):
    body = schema["paths"]["/api/v1/tasks/{task_id}/artifacts"]["post"]["requestBody"]
    assert body["required"] is True
    ref = body["content"]["multipart/form-data"]["schema"]["$ref"]
    form = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert form["required"] == ["file"]
    assert form["properties"]["file"] == {
        "type": "string",
        "format": "binary",
        "description": form["properties"]["file"]["description"],
    }
    assert {"name", "media_type", "operation", "inputs", "input_digests"} <= set(form["properties"])
