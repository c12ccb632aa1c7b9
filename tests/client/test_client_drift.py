"""The client's generated part (client/agent_console_client/_generated) is what client/generate.py
makes of docs/openapi.yaml: regenerated into a temporary directory, it must equal the committed
files byte for byte (`make client` after `make schema` fixes a failure). A schema change is
caught; each sync file (the generated routes, the hand-written client) is unasync's output of
its async one; every route is a verb of both
clients, every POST takes the caller's key, and every list route with a cursor an iterator."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from agent_console_client import AsyncClient, Client

from tests.conftest import ROOT

SCHEMA = ROOT / "docs" / "openapi.yaml"
CLIENT = ROOT / "client" / "agent_console_client"
COMMITTED = CLIENT / "_generated"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "client_generate", ROOT / "client" / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _differences(schema: Path, out: Path) -> list[str]:
    _generator().generate(schema, out)
    made, committed = _files(out), _files(COMMITTED)
    return sorted(
        name for name in set(made) | set(committed) if made.get(name) != committed.get(name)
    )


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA.read_text())


def test_the_committed_client_is_what_the_schema_generates(tmp_path):
    differing = _differences(SCHEMA, tmp_path / "_generated")
    assert not differing, f"run `make client`: {differing} differ from docs/openapi.yaml's"


def test_a_schema_change_is_caught(tmp_path, document):
    changed = yaml.safe_load(SCHEMA.read_text())
    # A field added to a model, a route added, an enum's value added.
    changed["components"]["schemas"]["Task"]["properties"]["colour"] = {"type": "string"}
    changed["paths"]["/api/v1/tasks/{task_id}/colour"] = {
        "get": {
            **document["paths"]["/api/v1/tasks/{task_id}"]["get"],
            "operationId": "v1_tasks_colour_retrieve",
        }
    }
    changed["components"]["schemas"]["TaskCondition"]["enum"].append("dreaming")
    schema = tmp_path / "openapi.yaml"
    schema.write_text(yaml.safe_dump(changed, sort_keys=False))

    differing = _differences(schema, tmp_path / "_generated")

    assert differing == ["_async/routes.py", "_sync/routes.py", "models.py"]
    made = (tmp_path / "_generated" / "models.py").read_text()
    assert "colour: str | None = None" in made and 'dreaming = "dreaming"' in made
    assert "def tasks_colour_retrieve(" in (tmp_path / "_generated/_sync/routes.py").read_text()


@pytest.mark.parametrize(
    "async_file, sync_file",
    [("_generated/_async/routes.py", "_generated/_sync/routes.py"), ("_async.py", "_sync.py")],
)
def test_each_sync_file_is_unasync_of_its_async_one(async_file, sync_file):
    made = _generator().sync_source(CLIENT / async_file)
    assert made == (CLIENT / sync_file).read_text(), f"run `make client`: {sync_file} differs"


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]


@pytest.mark.parametrize("client", [AsyncClient, Client])
def test_every_route_is_a_verb_of_the_client(client, document):
    operations = _operations(document)
    assert len(operations) >= 49
    for method, path, op in operations:
        name = op["operationId"].removeprefix("v1_")
        verb = getattr(client, name, None)
        assert verb is not None, f"{method.upper()} {path}: no {client.__name__}.{name}"
        assert inspect.iscoroutinefunction(verb) == (client is AsyncClient), name
        assert f"{method.upper()} {path}." in (verb.__doc__ or "")
        parameters = inspect.signature(verb).parameters
        assert ("idempotency_key" in parameters) == (method == "post"), name
        query = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        assert query <= set(parameters), (name, query - set(parameters))
        if "cursor" in query or "after" in query:
            assert hasattr(client, f"iter_{name}"), name
    assert inspect.isasyncgenfunction(AsyncClient.iter_tasks_list)
    assert inspect.isgeneratorfunction(Client.iter_tasks_list)
