"""`make run` installs only what running needs: the requirements its install lines name (read
from `make -n`, so the check follows the Makefile) resolve, with pip's own resolver against the
package index, to a set without the test, lint, typing and browser tools that `make test`
installs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.system

DEV_TOOLS = {
    "pytest",
    "pytest-django",
    "playwright",
    "ruff",
    "mypy",
    "schemathesis",
    "hypothesis",
    "moto",
    "openapi-python-client",
}

# pip's words for an index it cannot reach (or that lacks what it is asked for offline).
UNREACHABLE = (
    "NewConnectionError",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Connection refused",
    "Max retries exceeded",
    "No matching distribution found",
    "Could not find a version that satisfies",
)


def _install_lines(target: str, venv: Path) -> list[list[str]]:
    """The `pip install` command lines `make TARGET` runs on a fresh checkout (nothing run)."""
    dry = subprocess.run(
        ["make", "-n", "-B", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = [shlex.split(line) for line in dry.splitlines() if " pip install " in f" {line} "]
    return [words for words in lines if "--upgrade" not in words]


def _requirements(lines: list[list[str]]) -> list[str]:
    """What the lines install: requirements, and ``-r FILE`` for a requirements file."""
    found = []
    for words in lines:
        args = words[words.index("install") + 1 :]
        for i, word in enumerate(args):
            if word == "-r":
                found.append(f"-r {args[i + 1]}")
            elif not word.startswith("-") and (i == 0 or args[i - 1] != "-r"):
                found.append(word)
    return found


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_make_run_installs_the_project_alone(tmp_path: Path):
    # The project's locked dependencies (requirements/lock.txt, tests/system/test_lock_file.py),
    # then the project itself without resolving again.
    requirements = _requirements(_install_lines("run", tmp_path / "venv"))
    assert requirements == ["-r requirements/lock.txt", "."], (
        f"`make run` installs {requirements}: only the lock file and `.` belong there"
    )
    # `make test` still installs the tools (so the check above is not vacuous).
    assert ".[dev]" in _requirements(_install_lines("test", tmp_path / "venv"))


def test_make_runs_install_set_excludes_the_test_tools(tmp_path: Path):
    lines = _install_lines("run", tmp_path / "venv")
    # The line that brings dependencies (the project's own is --no-deps), as make runs it.
    (locked,) = [words for words in lines if "-r" in words]
    report = tmp_path / "report.json"
    try:
        resolved = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"),
                *("--quiet", "--disable-pip-version-check", "--report", str(report)),
                *locked[locked.index("install") + 1 :],
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("pip could not resolve `make run`'s install set within 300 s (index slow?)")
    if resolved.returncode != 0:
        if any(word in resolved.stderr for word in UNREACHABLE):
            pytest.skip(f"the package index is unreachable: {resolved.stderr.strip()[-300:]}")
        pytest.fail(f"pip could not resolve {locked}: {resolved.stderr[-2000:]}")
    names = {
        _normalise(item["metadata"]["name"]) for item in json.loads(report.read_text())["install"]
    }
    assert "django" in names and "celery" in names, sorted(names)
    assert all("--no-deps" in words for words in lines if "-r" not in words)
    assert not names & DEV_TOOLS, f"`make run` would install {sorted(names & DEV_TOOLS)}"
