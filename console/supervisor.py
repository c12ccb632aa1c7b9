"""A small process supervisor for `make run` (and anyone running without systemd or Kubernetes):
a child that dies is restarted after a growing pause; a child that keeps dying (more than
``max_restarts`` within ``period`` seconds) stops the whole stack instead of restarting forever.
Any process may die (a worker child is OOM-killed, the broker client hits a bug when Redis goes
away): the database is the record, so a restarted process simply carries on."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    command: list[str]
    proc: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)
    restart_at: float | None = None


class Supervisor:
    def __init__(
        self,
        commands: dict[str, list[str]],
        env: dict[str, str],
        *,
        max_restarts: int = 5,
        period: float = 60.0,
        backoff: float = 0.5,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
        log_dir: Path | None = None,
    ) -> None:
        self.children = [Child(name, cmd) for name, cmd in commands.items()]
        self.env = env
        # With a directory, each child's output is appended to <name>.log there instead of the
        # terminal, which then shows only what a person needs (make run's accounts, restarts).
        self.log_dir = log_dir
        self.max_restarts = max_restarts
        self.period = period
        self.backoff = backoff
        self.log = log
        self.stopping = False

    def log_file(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    def _spawn(self, child: Child) -> None:
        path = self.log_file(child.name)
        if path is None:
            child.proc = subprocess.Popen(child.command, env=self.env)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as out:  # the child keeps its own copy of the descriptor
                child.proc = subprocess.Popen(
                    child.command, env=self.env, stdout=out, stderr=subprocess.STDOUT
                )
        child.restart_at = None

    def run(self) -> int:
        """Run until SIGINT/SIGTERM (exit 0) or until a child exceeds its restart intensity."""

        def stop(*_: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        for child in self.children:
            self._spawn(child)
        code = 0
        while not self.stopping:
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self.log(f"restarting {child.name}")
                        self._spawn(child)
                    continue
                assert child.proc is not None
                if child.proc.poll() is None:
                    continue
                child.deaths.append(now)
                while child.deaths and now - child.deaths[0] > self.period:
                    child.deaths.popleft()
                if len(child.deaths) > self.max_restarts:
                    self.log(
                        f"{child.name} died {len(child.deaths)} times in {self.period:.0f}s; "
                        "stopping everything"
                    )
                    code = child.proc.returncode or 1
                    self.stopping = True
                    break
                pause = min(30.0, self.backoff * 2 ** (len(child.deaths) - 1))
                where = self.log_file(child.name)
                self.log(
                    f"{child.name} exited with {child.proc.returncode}; restart in {pause}s"
                    + (f" (its log: {where})" if where else "")
                )
                child.restart_at = now + pause
            time.sleep(0.2)
        self._stop_all()
        return code

    def _stop_all(self, grace: float = 15.0) -> None:
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
