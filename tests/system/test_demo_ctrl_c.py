"""``make demo`` stops cleanly on Ctrl-C (issue 39 point 7): the terminal's SIGINT reaches the
demo (the stack it started has a session of its own), which stops its pass and then the stack:
exit 0, a sentence saying so, no connection error, no process of the stack left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.system.test_embedded_run import _embedded_env, _session_members

pytestmark = pytest.mark.system


def test_ctrl_c_stops_the_demo_and_its_stack_cleanly(tmp_path: Path):
    env = _embedded_env(tmp_path / "data")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=180,
        check=True,
    )
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "demo.out"
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--with-stack", "--interval", "2", "--url", url],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own terminal, as `make demo` has
        )
    stack_sessions: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while "Open http" not in out.read_text(errors="replace"):
            assert demo.poll() is None, out.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, out.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        stack_sessions = {
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent(int(p.name)) == demo.pid
        }
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground group
        assert demo.wait(timeout=90) == 0, out.read_text(errors="replace")[-3000:]
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    said = out.read_text(errors="replace")
    assert "The demo stopped (Ctrl-C)" in said, said[-2000:]
    assert "ConnectError" not in said and "Traceback" not in said, said[-3000:]
    deadline = time.monotonic() + 30
    while any(_session_members(sid) for sid in stack_sessions) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [m for sid in stack_sessions for m in _session_members(sid)]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])
