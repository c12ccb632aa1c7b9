"""``make run`` with no services: SQLite, the SQLAlchemy broker, the in-memory channel layer. The
whole stack (web + celery worker + beat) starts from one command, runs an operation end to end
over HTTP, and stops on Ctrl-C without leaving a process behind. The terminal stays quiet: the
processes log to files under the data directory, and the demo accounts and the URL are the last
lines printed, however many requests and sweeps follow."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port, wait_for

pytestmark = pytest.mark.system


def _embedded_env(data_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "CONSOLE_", "CELERY_"))
        and k not in ("DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME", "DEMO_TOOLS")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        CONSOLE_DATA_DIR=str(data_dir),
        PYTHONUNBUFFERED="1",
        WORKERS="1",
    )
    return env


def _session_members(sid: int) -> list[tuple[int, str]]:
    """Live (non-zombie) processes of session ``sid``: (pid, command)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append((int(entry.name), cmdline.strip()))
    return found


def _get(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        return client.get(url, timeout=2)
    except httpx.TransportError:
        return None


def test_runstack_runs_an_operation_end_to_end_and_stops_cleanly_on_sigint(tmp_path: Path):
    data_dir = tmp_path / "data"
    env = _embedded_env(data_dir)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    assert (data_dir / "console.sqlite3").exists()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "runstack.log"
    with log.open("wb") as out:
        # Its own session, so that every process it starts can be found (and cleaned up).
        stack = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output() -> str:
        return log.read_text(errors="replace")[-6000:]

    try:
        with httpx.Client(base_url=base) as client:
            healthy = wait_for(
                lambda: (r := _get(client, "/healthz")) is not None and r.status_code == 200 and r,
                timeout=90,
                what=f"the stack to serve /healthz:\n{output()}",
            )
            assert healthy.json()["database"] == "ok"
            assert healthy.json()["broker"] == "ok"

            accounts = data_dir / "demo-accounts.txt"
            assert accounts.stat().st_mode & 0o077 == 0  # readable by its owner only
            found = re.search(r"agent token \(demo-agent\): (\S+)", accounts.read_text())
            assert found, accounts.read_text()
            token = found.group(1)

            # The accounts and the URL come last, once the server answers, and nothing follows.
            announced = wait_for(
                lambda: (text := output()).rstrip().endswith("Ctrl-C stops.") and text,
                timeout=30,
                what=f"the URL line last:\n{output()}",
            )
            last = announced.rstrip().splitlines()[-6:]
            assert last[0] == "Demo accounts (created on first start):", last
            assert [line.split()[:3] for line in last[1:4]] == [
                ["console", "user", "operator"],
                ["console", "user", "support"],
                ["console", "user", "admin"],
            ], last
            # Printed once, on the first start (announced by a thread once /healthz answers).
            assert last[4] == f"  agent token (demo-agent): {token}", last
            assert last[5].startswith("Agent console (embedded") and f"{base}/ " in last[5], last
            headers = {"Authorization": f"Bearer {token}"}

            created = client.post(
                "/api/v1/tasks", json={"name": "embedded smoke", "input": {}}, headers=headers
            )
            assert created.status_code == 201, created.text
            task_id = created.json()["id"]
            params: dict[str, Any] = {"greeting": "hello", "n": [1, 2, 3]}
            proposed = client.post(
                f"/api/v1/tasks/{task_id}/operations",
                json={"tool": "demo.echo", "step": "echo", "params": params},
                headers=headers,
            )
            assert proposed.status_code == 201, proposed.text
            op_id = proposed.json()["id"]

            def settled() -> dict[str, Any] | None:
                r = client.get(f"/api/v1/operations/{op_id}", headers=headers, timeout=5)
                assert r.status_code == 200, r.text
                body: dict[str, Any] = r.json()
                return body if body["status"] in ("succeeded", "failed", "unresolved") else None

            op = wait_for(settled, timeout=60, interval=0.2, what=f"the echo:\n{output()}")
            assert op["status"] == "succeeded", op
            assert op["result"] == params
            assert op["lease_generation"] == 1
            assert [i["outcome"] for i in op["invocations"]] == ["succeeded"]

            events = client.get(f"/api/v1/tasks/{task_id}/events", headers=headers).json()
            types = [e["type"] for e in events["events"]]
            assert types[0] == "task.created"
            assert "operation.succeeded" in types

            # Outcomes in embedded mode: rows in SQLite, bytes on the filesystem in the data dir.
            report = b'{"greeting": "hello"}'
            made = client.post(
                f"/api/v1/tasks/{task_id}/artifacts",
                files={"file": ("r.json", report, "application/json")},
                data={"name": "report.json", "media_type": "application/json", "operation": op_id},
                headers=headers,
            )
            assert made.status_code == 201, made.text
            version = client.get(f"/api/v1/tasks/{task_id}", headers=headers).json()
            accepted = client.post(
                f"/api/v1/artifacts/{made.json()['id']}/accept",
                json={"expected_state_version": version["state_version"]},
                headers=headers,
            )
            assert accepted.status_code == 200, accepted.text
            done = client.post(f"/api/v1/tasks/{task_id}/complete", json={}, headers=headers)
            assert done.status_code == 200, done.text
            assert done.json()["outcome"] == "succeeded"
            content = client.get(f"/api/v1/artifacts/{made.json()['id']}/content", headers=headers)
            assert content.content == report
            stored = list((data_dir / "media" / "artifacts" / "sha256").rglob("*"))
            assert [p.read_bytes() for p in stored if p.is_file()] == [report]

        # Requests, the operation and sweeps went to the processes' log files, not the terminal.
        wait_for(
            lambda: "beat: sweeping" in (data_dir / "logs" / "beat.log").read_text(),
            timeout=30,
            what="beat's log",
        )
        assert '"POST /api/v1/tasks HTTP/1.1" 201' in (data_dir / "logs" / "web.log").read_text()
        assert output() == announced, output()[len(announced) :]

        started = _session_members(stack.pid)
        commands = " ".join(f"{cmd} " for _, cmd in started)
        assert "console.server" in commands and " worker " in commands, started
        assert "manage.py beat " in commands, started

        # Ctrl-C as a supervisor delivers it: to the main process only, which stops the rest.
        stack.send_signal(signal.SIGINT)
        assert stack.wait(timeout=60) == 0, output()
        wait_for(
            lambda: not _session_members(stack.pid),
            timeout=30,
            what=f"every process of the stack to end: {_session_members(stack.pid)}",
        )
    finally:
        for pid, _ in _session_members(stack.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if stack.poll() is None:
            stack.wait(timeout=10)
