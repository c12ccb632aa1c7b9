"""A team's own tools (issue 36 point 1): the modules TOOL_MODULES names and the entry points of
the group ``agent_console.tools`` are loaded at start by every process (runtime.apps ->
runtime.tools.loading), all or none: a bad module (an import error, a duplicate name, an
invalid schema, no version...) refuses the start with a message naming it, and no tool of any
source joins the catalogue. A worker whose catalogue lacks a tool the web's has refuses the
claim as a version mismatch and never runs anything under that name.

The in-process tests start the runtime app again (``ready()``) with the registry copied, so
each sees the built-in catalogue plus its own modules; the subprocess tests start real
processes (manage.py, a Celery worker) with TOOL_MODULES in their environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from runtime.models import Event, Invocation, Operation
from runtime.tools import adapters, base, loading
from runtime.tools.loading import tool_origin, tools_load
from tests import factories
from tests.conftest import ROOT, wait_for

GOOD = """
from pathlib import Path

from runtime.tools import Contract, ToolAdapter, ToolResult, register


class Stamp(ToolAdapter):
    name = {name!r}
    description = "Appends the call's key to a file (a team's tool, in a test)."
    contract = Contract.REPLAY
    params_schema = {{
        "type": "object",
        "properties": {{"note": {{"type": "string"}}}},
        "required": ["note"],
    }}

    def invoke(self, ctx):
        with Path({effects!r}).open("a") as fh:
            fh.write(ctx.idempotency_key + "\\n")
        return ToolResult({{"note": ctx.params["note"]}})


register(Stamp())
"""

# One bad module each: what it is, its source, and words the refusal must contain.
BAD = {
    "import_error": ("import team_sdk_that_is_not_installed\n", "ModuleNotFoundError"),
    "syntax_error": ("def broken(:\n", "SyntaxError"),
    "duplicate_of_a_built_in": (
        GOOD.format(name="demo.echo", effects="/dev/null"),
        "tool 'demo.echo': a tool of that name is built in",
    ),
    "invalid_schema": (
        GOOD.format(name="team.bad_schema", effects="/dev/null").replace(
            '{"type": "string"}', '{"type": "strnig"}'
        ),
        "tool 'team.bad_schema': invalid params_schema",
    ),
    "schema_not_an_object": (
        GOOD.format(name="team.list_schema", effects="/dev/null").replace(
            '"type": "object",', '"type": "array",'
        ),
        "tool 'team.list_schema': its params_schema must be a JSON Schema",
    ),
    "missing_version": (
        GOOD.format(name="team.unversioned", effects="/dev/null").replace(
            "    contract = Contract.REPLAY", '    version = ""\n    contract = Contract.REPLAY'
        ),
        "tool 'team.unversioned': it has no version",
    ),
    "version_it_does_not_support": (
        GOOD.format(name="team.v2", effects="/dev/null").replace(
            "    contract = Contract.REPLAY", '    version = "2"\n    contract = Contract.REPLAY'
        ),
        "its version '2' is not among its supported_versions ('1',)",
    ),
    "lookup_contract_without_lookup": (
        GOOD.format(name="team.no_lookup", effects="/dev/null").replace(
            "Contract.REPLAY", "Contract.LOOKUP"
        ),
        "its contract is lookup but it does not implement lookup",
    ),
    "no_tool": ("VALUE = 1\n", "registered no tool"),
}


@dataclass
class Modules:
    """Tool modules written for one test, importable under names no other test uses."""

    root: Path
    prefix: str
    effects: Path

    def write(self, stem: str, source: str) -> str:
        name = f"{self.prefix}_{stem}"
        (self.root / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    def good(self, stem: str = "good", tool: str = "team.stamp") -> str:
        return self.write(stem, GOOD.format(name=tool, effects=str(self.effects)))

    def env(self, **overrides: Any) -> dict[str, str]:
        """A process environment where these modules import (PYTHONPATH)."""
        path = os.pathsep.join(p for p in (str(self.root), os.environ.get("PYTHONPATH")) if p)
        return {"PYTHONPATH": path, **{k: str(v) for k, v in overrides.items()}}


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Modules]:
    root = tmp_path / "team"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    found = Modules(root, f"team_{uuid.uuid4().hex[:10]}", tmp_path / "effects.txt")
    yield found
    for name in [m for m in sys.modules if m.startswith(found.prefix)]:
        del sys.modules[name]


@pytest.fixture
def catalogue(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], None]:
    """Start the runtime app again with TOOL_MODULES set to the modules given, on a copy of the
    registry (put back after the test)."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_VISIBLE", {})
    monkeypatch.setattr(loading, "_ORIGINS", {})

    def start(tool_modules: list[str]) -> None:
        monkeypatch.setattr("django.conf.settings.TOOL_MODULES", tool_modules)
        apps.get_app_config("runtime").ready()

    return start


@pytest.mark.django_db
def test_a_tool_modules_tool_is_in_the_catalogue_and_takes_proposals(modules, catalogue):
    name = modules.good()
    catalogue([name])

    owner = factories.agent()
    client = owner.client()
    listed = {t["name"]: t for t in client.get("/api/v1/tools").json()["results"]}
    assert listed["team.stamp"]["contract"] == "replay"
    assert listed["team.stamp"]["params_schema"]["required"] == ["note"]
    assert tool_origin("team.stamp") == f"TOOL_MODULES entry {name!r}"

    task = factories.task(owner)
    worker_run = client.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "team.stamp", "params": {"note": "hi"}, "step": "w"},
        format="json",
    )
    assert worker_run.status_code == 201, worker_run.content
    assert worker_run.json()["status"] == "pending"
    refused = client.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "team.stamp", "params": {"note": 5}, "step": "bad"},
        format="json",
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["field"] == "params.note"

    # An agent-run step under the team's tool name: proposed, claimed, completed by the agent.
    proposed = client.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "team.stamp", "params": {"note": "mine"}, "step": "a", "executor": "agent"},
        format="json",
    )
    assert proposed.status_code == 201, proposed.content
    op_id = proposed.json()["id"]
    lease = client.post(f"/api/v1/operations/{op_id}/claim", format="json")
    assert lease.status_code == 200, lease.content
    done = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": lease.json()["lease_generation"],
            "lease_token": lease.json()["lease_token"],
            "outcome": "succeeded",
            "result": {"note": "mine"},
        },
        format="json",
    )
    assert done.status_code == 200, done.content
    assert Operation.objects.get(pk=op_id).status == "succeeded"


def test_the_tools_command_names_where_each_tool_came_from(modules, catalogue, capsys):
    name = modules.good()
    catalogue([name])
    call_command("tools", "--json")
    tools = {t["name"]: t for t in json.loads(capsys.readouterr().out)["tools"]}
    assert tools["team.stamp"]["origin"] == f"TOOL_MODULES entry {name!r}"
    assert tools["demo.echo"]["origin"] == "built in"


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_tool_module_refuses_the_start_naming_it_and_loads_nothing(modules, catalogue, case):
    source, words = BAD[case]
    good = modules.good()  # loads fine, and is listed first
    bad = modules.write(case, source)
    before = dict(base._REGISTRY)

    with pytest.raises(ImproperlyConfigured) as refused:
        catalogue([good, bad])
    message = str(refused.value)
    assert f"TOOL_MODULES entry {bad!r}" in message, message
    assert words in message, message
    assert good not in message  # the good module is not blamed...
    # ...and not half-loaded either: the catalogue is the built-in one, untouched.
    assert before == base._REGISTRY
    assert "team.stamp" not in adapters()
    assert adapters()["demo.echo"] is before["demo.echo"]


def test_one_name_from_two_modules_is_refused_naming_both(modules, catalogue):
    first = modules.good("first", tool="team.same")
    second = modules.good("second", tool="team.same")
    with pytest.raises(ImproperlyConfigured) as refused:
        catalogue([first, second])
    message = str(refused.value)
    assert (
        f"TOOL_MODULES entry {second!r}: tool 'team.same': registered twice "
        f"(also by TOOL_MODULES entry {first!r})"
    ) in message, message
    assert "team.same" not in adapters()


def test_every_problem_is_named_at_once(modules, catalogue):
    missing = modules.write("missing", BAD["import_error"][0])
    schema = modules.write("schema", BAD["invalid_schema"][0])
    with pytest.raises(ImproperlyConfigured) as refused:
        catalogue([missing, schema, "not a path"])
    message = str(refused.value)
    assert missing in message and schema in message, message
    assert "TOOL_MODULES entry 'not a path' could not be loaded" in message


def _distribution(site: Path, module: str, entry: str) -> None:
    """An installed distribution as importlib.metadata finds one: its dist-info on sys.path."""
    info = site / "team_tools-1.4.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-tools\nVersion: 1.4\n")
    (info / "entry_points.txt").write_text(f"[agent_console.tools]\nteam = {module}:{entry}\n")


def test_an_entry_point_of_the_group_is_loaded(modules, catalogue, monkeypatch, tmp_path):
    module = modules.write(
        "package",
        GOOD.format(name="team.stamp", effects=str(modules.effects)).replace(
            "register(Stamp())", "def register_tools():\n    register(Stamp())"
        ),
    )
    _distribution(tmp_path / "site", module, "register_tools")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    catalogue([])
    assert "team.stamp" in adapters()
    assert tool_origin("team.stamp") == (
        f"entry point 'team' ({module}:register_tools) of team-tools 1.4"
    )


def test_a_broken_entry_point_refuses_the_start_naming_it(
    modules, catalogue, monkeypatch, tmp_path
):
    module = modules.good()
    _distribution(tmp_path / "site", module, "no_such_function")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ImproperlyConfigured) as refused:
        tools_load([])
    message = str(refused.value)
    assert "entry point 'team'" in message and "of team-tools 1.4" in message, message
    assert "AttributeError" in message
    assert "team.stamp" not in adapters()


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> Any:
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "COV_")) and k != "DJANGO_SETTINGS_MODULE"
    }
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**base_env, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_tool_modules_from_the_environment_are_loaded_by_a_process_at_start(modules):
    name = modules.good()
    listed = _run(["manage.py", "tools", "--json"], modules.env(TOOL_MODULES=f" {name} ,"))
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in json.loads(listed.stdout)["tools"]}
    assert tools["team.stamp"]["origin"] == f"TOOL_MODULES entry {name!r}"


@pytest.mark.parametrize(
    "command",
    [
        ["manage.py", "check"],
        # A worker process: it stops before it takes any work.
        ["-m", "celery", "-A", "console", "worker", "--pool", "solo", "--without-mingle"],
    ],
    ids=["manage.py check", "celery worker"],
)
def test_a_process_with_a_bad_tool_module_refuses_to_start_naming_it(modules, command):
    good = modules.good()
    bad = modules.write("invalid_schema", BAD["invalid_schema"][0])
    started = _run(command, modules.env(TOOL_MODULES=f"{good},{bad}"))
    assert started.returncode != 0, started.stdout
    output = started.stdout + started.stderr
    assert "user tools refused, none loaded" in output, output[-3000:]
    assert f"TOOL_MODULES entry {bad!r}: tool 'team.bad_schema': invalid params_schema" in output


@pytest.mark.workers
@pytest.mark.postgres
def test_a_worker_without_the_tool_refuses_the_claim_as_a_version_mismatch(
    modules, catalogue, workers
):
    """The web (this process) has the team's tool, the first worker was started without it:
    the claim goes to a person, nothing runs. A worker started with it runs the next call."""
    name = modules.good()
    catalogue([name])  # this process: the web's catalogue
    owner = factories.agent()
    task = factories.task(owner)
    (lacking,) = workers.start(count=1, concurrency=1, **modules.env(TOOL_MODULES=""))

    missing = factories.operation(owner, task, tool="team.stamp", params={"note": "one"})
    wait_for(
        lambda: Operation.objects.get(pk=missing.pk).status == "manual_intervention",
        timeout=60,
        what=f"the refusal:\n{lacking.tail()}",
    )
    missing.refresh_from_db()
    assert missing.tool_version == "1"
    assert "does not support" in missing.status_reason
    assert "(tool missing)" in missing.status_reason
    assert Event.objects.filter(operation=missing, type="operation.version_refused").exists()
    assert not Invocation.objects.filter(operation=missing).exists()
    assert not modules.effects.exists()  # nothing ran under that name
    # The same worker still runs what it has.
    echo = factories.operation(owner, task, params={"n": 1})
    wait_for(lambda: Operation.objects.get(pk=echo.pk).status == "succeeded", timeout=60)
    lacking.stop()

    (having,) = workers.start(count=1, concurrency=1, **modules.env(TOOL_MODULES=name))
    ran = factories.operation(owner, task, tool="team.stamp", params={"note": "two"})
    wait_for(
        lambda: Operation.objects.get(pk=ran.pk).status == "succeeded",
        timeout=60,
        what=f"the call:\n{having.tail()}",
    )
    assert modules.effects.read_text().split() == [ran.idempotency_key]
    assert Operation.objects.get(pk=missing.pk).status == "manual_intervention"
