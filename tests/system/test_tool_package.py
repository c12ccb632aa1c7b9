"""A team's tool package (examples/tools-package) installed with pip into a fresh virtual
environment is found through its entry point (group ``agent_console.tools``) by every process
the console starts from that environment: ``manage.py tools`` lists its tools, and the whole
stack (``manage.py runstack``: web, worker, beat) offers them at ``GET /api/v1/tools`` and runs
them. The package's own tests pass there too.

The fresh environment reuses this one's installed packages through a ``.pth`` file (installing
the console's dependencies again would take minutes and the network); only the package under
test is installed into it, by pip, with build isolation as a newcomer's ``pip install`` does
(its build backend comes from the package index or pip's cache)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port, wait_for
from tests.system.test_embedded_run import _embedded_env, _get, _session_members
from tests.system.test_install_sets import UNREACHABLE

pytestmark = pytest.mark.system

PACKAGE = ROOT / "examples" / "tools-package"
ORIGIN = "entry point 'acme' (acme_tools:register_tools) of agent-console-example-tools 0.1.0"
TOOLS = {"acme.crm.create_contact", "acme.billing.send_invoice", "acme.billing.void_invoice"}


def _fresh_venv(where: Path) -> Path:
    """A new virtual environment seeing this one's packages (pip included), and the example
    package installed into it alone. Returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120
    )
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    # addsitedir, not a bare path: it also runs this environment's own .pth files (the
    # console's editable install).
    Path(site, "console-env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    # Built from a copy: a build writes its metadata next to the sources.
    source = shutil.copytree(
        PACKAGE, where.parent / "tools-package", ignore=shutil.ignore_patterns("*.egg-info")
    )
    try:
        installed = subprocess.run(
            [
                *(str(python), "-m", "pip", "install", "--no-deps", "--quiet"),
                *("--disable-pip-version-check", str(source)),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("pip could not build the example package within 300 s (index slow?)")
    if installed.returncode != 0:
        if any(word in installed.stderr for word in UNREACHABLE):
            pytest.skip(f"the package index is unreachable: {installed.stderr.strip()[-300:]}")
        pytest.fail(f"pip could not install {source}: {installed.stderr[-3000:]}")
    return python


def _env(data_dir: Path, receivers: Path) -> dict[str, str]:
    env = _embedded_env(data_dir)
    env.pop("PYTHONPATH", None)  # the entry point, not a path, must bring the tools
    env.pop("TOOL_MODULES", None)
    env["ACME_RECEIVERS_DB"] = str(receivers)
    return env


def test_a_tool_package_installed_in_a_fresh_venv_is_loaded_through_its_entry_point(
    tmp_path: Path,
):
    # This environment does not have the package: whatever finds it below, the venv brought.
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("agent-console-example-tools")
    python = _fresh_venv(tmp_path / "venv")
    data_dir, receivers = tmp_path / "data", tmp_path / "receivers.db"
    env = _env(data_dir, receivers)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    listed = manage("tools", "--json")
    assert listed.returncode == 0, listed.stderr
    origins = {t["name"]: t["origin"] for t in json.loads(listed.stdout)["tools"]}
    assert {name: origins.get(name) for name in TOOLS} == dict.fromkeys(TOOLS, ORIGIN)
    assert origins["demo.echo"] == "built in"

    # The package's own tests, in the environment it was installed into.
    own = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PACKAGE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-2000:]
    assert re.search(r"\d+ passed", own.stdout), own.stdout

    migrated = manage("migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    port = free_port()
    log = tmp_path / "runstack.log"
    with log.open("wb") as out:
        stack = subprocess.Popen(
            [str(python), "manage.py", "runstack", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output() -> str:
        return log.read_text(errors="replace")[-6000:]

    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            wait_for(
                lambda: (r := _get(client, "/healthz")) is not None and r.status_code == 200,
                timeout=90,
                what=f"the stack to serve /healthz:\n{output()}",
            )
            accounts = wait_for(
                lambda: re.search(
                    r"agent token \(demo-agent\): (\S+)",
                    (data_dir / "demo-accounts.txt").read_text()
                    if (data_dir / "demo-accounts.txt").exists()
                    else "",
                ),
                timeout=30,
                what="the demo accounts",
            )
            headers = {"Authorization": f"Bearer {accounts.group(1)}"}
            catalogue = client.get("/api/v1/tools", headers=headers)
            assert catalogue.status_code == 200, catalogue.text
            offered = {t["name"]: t for t in catalogue.json()["results"]}
            assert set(offered) >= TOOLS, sorted(offered)
            assert offered["acme.crm.create_contact"]["contract"] == "lookup"
            assert offered["acme.billing.send_invoice"]["approval"]["when"] == (
                "amount_cents above 50000"
            )

            task = client.post("/api/v1/tasks", json={"name": "acme"}, headers=headers)
            assert task.status_code == 201, task.text
            calls = {
                "acme.crm.create_contact": {"email": "ada@example.com", "name": "Ada"},
                "acme.billing.send_invoice": {
                    "customer": "cus_1",
                    "amount_cents": 1200,
                    "currency": "EUR",
                },
            }
            ids = {}
            for tool, params in calls.items():
                proposed = client.post(
                    f"/api/v1/tasks/{task.json()['id']}/operations",
                    json={"tool": tool, "step": tool, "params": params},
                    headers=headers,
                )
                assert proposed.status_code == 201, proposed.text
                ids[tool] = proposed.json()["id"]

            def settled(op_id: str) -> dict[str, Any] | None:
                body: dict[str, Any] = client.get(
                    f"/api/v1/operations/{op_id}", headers=headers, timeout=5
                ).json()
                return body if body["status"] in ("succeeded", "failed", "unresolved") else None

            done = {
                tool: wait_for(
                    lambda op_id=op_id: settled(op_id),
                    timeout=60,
                    interval=0.2,
                    what=f"{tool}:\n{output()}",
                )
                for tool, op_id in ids.items()
            }
        assert {tool: op["status"] for tool, op in done.items()} == dict.fromkeys(
            calls, "succeeded"
        ), done
        # The worker the stack started from the venv ran them against the receivers.
        with contextlib.closing(sqlite3.connect(receivers)) as db:
            invoices = db.execute("select id, amount_cents from invoices").fetchall()
            contacts = db.execute("select id, external_ref from contacts").fetchall()
        invoice = done["acme.billing.send_invoice"]["result"]
        assert invoices == [(invoice["id"], 1200)]
        contact = done["acme.crm.create_contact"]
        assert contacts == [(contact["result"]["id"], contact["idempotency_key"])]
        stack.send_signal(signal.SIGINT)
        assert stack.wait(timeout=60) == 0, output()
    finally:
        for pid, _ in _session_members(stack.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if stack.poll() is None:
            stack.wait(timeout=10)
