"""The supervisor behind `make run`: a dead process is restarted; one that keeps dying stops the
stack instead of restarting forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import ROOT, wait_for

SCRIPT = """
import sys
from console.supervisor import Supervisor
commands = {{"child": [sys.executable, "-c", {child!r}]}}
sys.exit(Supervisor(commands, dict(__import__("os").environ), max_restarts=3, period=60,
                    backoff=0.05).run())
"""


def _start(child: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(child=child)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_process_is_restarted():
    sup = _start("import time; time.sleep(120)")
    # Every child's pid, recorded while the supervisor runs: once it has exited, its children
    # would be re-parented and no longer found by their parent.
    pids: list[int] = []
    try:
        (first,) = wait_for(lambda: _children(sup.pid), timeout=20, what="the child")
        pids.append(first)
        os.kill(first, signal.SIGKILL)
        (second,) = wait_for(
            lambda: [p for p in _children(sup.pid) if p != first] or None,
            timeout=20,
            what="the restarted child",
        )
        pids.append(second)
        assert second != first
        assert sup.poll() is None
    finally:
        sup.send_signal(signal.SIGTERM)
        code = sup.wait(timeout=20)
        # The supervisor stops and reaps its children before it exits: none is left running
        # (nor a zombie) once it has gone. Survivors are killed here, after being counted.
        survivors = [pid for pid in pids if _alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
    assert code == 0
    assert len(pids) == 2
    assert survivors == [], f"children outlived the supervisor: {survivors}"


def test_a_process_that_keeps_dying_stops_the_stack():
    sup = _start("import sys; sys.exit(3)")
    code = sup.wait(timeout=60)
    output = sup.stdout.read() if sup.stdout else ""
    assert code == 3
    assert "died 4 times" in output
