"""``make run`` on a port another process holds (issue 39 point 4): it stops at once, non-zero,
with "address already in use" naming the port and how to pick another, before it prints an
address or creates and prints the demo accounts' passwords. The port comes from PORT, as the
Makefile passes it (``make run PORT=8001``)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.system.test_embedded_run import _embedded_env

pytestmark = pytest.mark.system


def test_make_run_on_a_taken_port_stops_non_zero_with_the_sentence_before_any_password(
    tmp_path: Path,
):
    data_dir = tmp_path / "data"
    env = _embedded_env(data_dir)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env["PORT"] = str(port)
        run = subprocess.run(
            [sys.executable, "manage.py", "runstack"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert f"address already in use: port {port} on 127.0.0.1" in run.stderr, said
    assert "make run PORT=" in run.stderr, said
    # Nothing that says the console is up, and no account made or printed.
    assert "Agent console (" not in said and "password" not in said, said
    assert not (data_dir / "demo-accounts.txt").exists()
