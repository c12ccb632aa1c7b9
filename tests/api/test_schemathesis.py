"""Schemathesis against /api/schema/, as a standing part of the suite: every operation of the
schema gets generated requests (a bounded number each, authenticated as an agent, with real
ids substituted into paths half the time so that bodies reach the services), and every answer
must be no 5xx, a documented status, the documented content type and a body that conforms to
the documented schema."""

from __future__ import annotations

import hashlib

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from console.wsgi import application
from runtime.models import Operation
from tests import factories

pytestmark = pytest.mark.postgres

# Each operation of the schema gets this many generated requests: enough to reach every body
# field and refusal (the statuses are pinned by test_openapi_responses), within about half a
# minute on two shared cores.
EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def api_schema(db):
    # In-process through Django's WSGI app: the requests run in the test's transaction, so the
    # rows they create vanish with it, and nothing is published to a broker (no commit). As
    # Django's test client does, requests must not close the test's connection when they end.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def world(db, settings) -> dict[str, str]:
    # Thousands of generated calls with one token, as fast as the process serves them: the
    # per-token rate (runtime.throttle, tested on its own) would answer some of them 429 at a
    # moment that depends on the machine's speed, and hypothesis' replay then disagrees.
    settings.API_RATE_PER_SECOND = 0
    owner = factories.agent()
    task = factories.task(owner, "fuzzed")
    worker_op = factories.operation(owner, task)
    agent_op = factories.operation(owner, task, executor="agent")
    unresolved = factories.operation(owner, task)
    stop_task = factories.task(owner, "to be stopped")
    Operation.objects.filter(pk=unresolved.pk).update(status="unresolved")
    return {
        "token": owner.token,
        "admin": factories.console_user("admin").token,
        "task_id": task.pk,
        "operation_id": agent_op.pk,
        "worker_operation_id": worker_op.pk,
        "unresolved_id": unresolved.pk,
        "stop_task_id": stop_task.pk,
    }


def _digest(text: str) -> int:
    # Not hash(): str hashes are salted per process, so the split would change from run to run.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _aim(case, world: dict[str, str]) -> None:
    """Half the examples (by a stable choice) aim at real objects, the rest at generated ids."""
    params = case.path_parameters or {}
    if not params or _digest(repr(case.body) + repr(case.query)) % 2:
        return
    for name in ("task_id", "operation_id"):
        if name in params:
            params[name] = world[name]
    if case.operation.path.endswith("/resolve"):
        params["operation_id"] = world["unresolved_id"]
    if case.operation.path.endswith(("/cancel", "/fail", "/pause")):
        # Stopping (or pausing) the shared task would turn every later proposal into a 409.
        params["task_id"] = world["stop_task_id"]
    if isinstance(case.body, dict) and "tool" in case.body:
        case.body["tool"] = "demo.echo"
    if "receiver" in params:
        params["receiver"] = "payments"


def _runner(operation, world: dict[str, str]):
    admin_only = operation.path.endswith(("/resolve", "/cancel", "/fail"))
    token = world["admin"] if admin_only else world["token"]

    # A planned route (501 only) needs a few examples to show it answers as documented.
    planned = "501" in operation.definition.raw.get("responses", {})

    @given(case=operation.as_strategy())
    @settings(
        max_examples=3 if planned else EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case) -> None:
        _aim(case, world)
        # The contract's 501 for planned routes is the one 5xx allowed (and documented).
        checks = [c for c in CHECKS if c is not not_a_server_error] if planned else CHECKS
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"}, checks=checks
        )
        assert response.status_code < 500 or (planned and response.status_code == 501)

    return run


def test_the_api_conforms_to_its_schema(api_schema, world):
    # schemathesis' pytest loader (from_fixture) does not run on pytest 9, so each operation's
    # strategy is driven by hypothesis here; every operation runs, and all failures are shown.
    failures: dict[str, str] = {}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:
        try:
            _runner(operation, world)()
        except Exception as exc:
            failures[f"{operation.method.upper()} {operation.path}"] = str(exc)[:3000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
