"""A client generated from /api/schema/ by openapi-python-client works as a new user would use
it: it imports, creates a task, proposes an operation and reads back a typed Operation from the
real server, and refusals come back as the typed Error."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from runtime.models import Operation, Task
from tests import factories

pytestmark = pytest.mark.postgres

PACKAGE = "console_api_client"


def _generate(server_url: str, where: Path) -> Path:
    schema = where / "schema.json"
    schema.write_bytes(httpx.get(f"{server_url}/api/schema/?format=json", timeout=30).content)
    config = where / "config.yaml"
    config.write_text("post_hooks: []\n")  # no formatter run: the client must import as made
    out = where / PACKAGE
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("openapi-python-client")),
            *("generate", "--path", str(schema), "--output-path", str(out)),
            *("--meta", "none", "--config", str(config)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Every schema construct was understood: nothing skipped, no warning.
    assert "Warning" not in result.stdout and "Skipping" not in result.stdout, result.stdout
    return out


def test_a_generated_client_creates_a_task_proposes_and_reads_a_typed_operation(
    server, tmp_path, monkeypatch
):
    _generate(server.url, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    client_module = importlib.import_module(PACKAGE)
    v1 = importlib.import_module(f"{PACKAGE}.api.v1")
    models = importlib.import_module(f"{PACKAGE}.models")
    tasks_create = importlib.import_module(f"{PACKAGE}.api.v1.v1_tasks_create")
    ops_create = importlib.import_module(f"{PACKAGE}.api.v1.v1_tasks_operations_create")
    ops_retrieve = importlib.import_module(f"{PACKAGE}.api.v1.v1_operations_retrieve")
    tasks_retrieve = importlib.import_module(f"{PACKAGE}.api.v1.v1_tasks_retrieve")
    assert v1 is not None

    agent = factories.agent()
    client = client_module.AuthenticatedClient(base_url=server.url, token=agent.token)

    task = tasks_create.sync(client=client, body=models.TaskIn(name="from a generated client"))
    assert isinstance(task, models.Task), task
    assert task.name == "from a generated client"
    assert task.condition == models.TaskCondition.RUNNABLE

    params = models.OperationInParams.from_dict({"text": "hello", "n": 2})
    proposed = ops_create.sync_detailed(
        task_id=task.id,
        client=client,
        body=models.OperationIn(tool="demo.echo", step="greet", params=params),
    )
    assert proposed.status_code == 201, proposed.content
    operation = proposed.parsed
    assert isinstance(operation, models.Operation)

    read = ops_retrieve.sync(operation_id=operation.id, client=client)
    assert isinstance(read, models.Operation)
    assert read.id == operation.id and read.task == task.id
    assert read.params.to_dict() == {"text": "hello", "n": 2}
    assert read.kind == models.OperationKind.TOOL
    assert isinstance(read.status, models.OperationStatus)
    assert isinstance(read.invocations, list)

    stored = Operation.objects.get(pk=read.id)
    assert stored.task_id == task.id and stored.params == {"text": "hello", "n": 2}
    assert Task.objects.filter(pk=task.id).exists()

    # A refusal is the typed Error, with the contract's code.
    missing = tasks_retrieve.sync(task_id="tsk_missing", client=client)
    assert isinstance(missing, models.Error)
    assert missing.error.code == "not_found"
