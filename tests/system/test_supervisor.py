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


def test_a_killed_process_is_restarted():
    sup = _start("import time; time.sleep(120)")
    try:
        (first,) = wait_for(lambda: _children(sup.pid), timeout=20, what="the child")
        os.kill(first, signal.SIGKILL)
        (second,) = wait_for(
            lambda: [p for p in _children(sup.pid) if p != first] or None,
            timeout=20,
            what="the restarted child",
        )
        assert second != first
        assert sup.poll() is None
    finally:
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
    assert _children(sup.pid) == []


def test_a_process_that_keeps_dying_stops_the_stack():
    sup = _start("import sys; sys.exit(3)")
    code = sup.wait(timeout=60)
    output = sup.stdout.read() if sup.stdout else ""
    assert code == 3
    assert "died 4 times" in output
