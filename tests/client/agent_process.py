"""An example agent (``python -m agent_console_client.examples.<name>``) as a real process, for
the kill-and-restart tests: its output collected line by line, killed with SIGKILL (nothing of
it runs after: no ``finally``, no lease given back), started again with the same arguments."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

from tests.conftest import ROOT, service_env, wait_for


class AgentProcess:
    def __init__(self, example: str, args: list[str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"agent_console_client.examples.{example}", *args],
            cwd=ROOT,
            env=service_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        found: re.Match[str] = wait_for(
            lambda: re.search(pattern, self.text),
            timeout=timeout,
            what=f"{pattern!r} in the agent's output:\n{self.text}",
        )
        return found

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)

    def finish(self, timeout: float = 90) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(10)
        return code
