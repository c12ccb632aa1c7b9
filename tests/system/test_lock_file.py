"""Reproducible builds (issue 40 point 5): requirements/lock.txt (``make lock``) pins every
runtime dependency of pyproject.toml (with the s3 and otel extras the image carries), each with
its hashes; the image and ``make install`` install from it and then the project itself without
resolving again, and the image installs nothing editable; an installed (not editable) project
finds its templates and static files through CONSOLE_HOME."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

pytestmark = pytest.mark.system

LOCK = ROOT / "requirements" / "lock.txt"
EXTRAS = ("s3", "otel")
# The platform the image and CI run: Python 3.11 on Linux.
TARGET = {**default_environment(), "python_version": "3.11", "sys_platform": "linux"}


def _locked() -> dict[str, tuple[str, int]]:
    """Each locked package: its version and how many hashes it has."""
    found: dict[str, tuple[str, int]] = {}
    name = None
    for line in LOCK.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line):
            name = canonicalize_name(match.group(1))
            found[name] = (match.group(2), 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            version, hashes = found[name]
            found[name] = (version, hashes + 1)
    return found


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in EXTRAS:
        listed += project["optional-dependencies"][extra]
    return [Requirement(r) for r in listed]


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**TARGET, "extra": e}) for e in extras | {""})


def test_the_lock_pins_every_runtime_dependency_with_hashes():
    locked = _locked()
    assert locked, "requirements/lock.txt pins nothing"
    for requirement in _runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement} is not in the lock file: run `make lock`"
        version, hashes = locked[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{requirement} but the lock has {version}: run `make lock`"
        )
        assert hashes, f"{name} is locked without a hash"
    assert all(hashes for _, hashes in locked.values())


def test_the_lock_is_closed_under_what_its_packages_require():
    # Every requirement of a locked package (and of the extras pyproject asks for), read from
    # the metadata installed here where it is the locked version, is locked too: the image
    # installs with --no-deps, so a missing one would be missing at run time.
    locked = _locked()
    asked = {canonicalize_name(r.name): set(r.extras) for r in _runtime_requirements()}
    checked = 0
    for name, (version, _) in locked.items():
        try:
            installed = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if installed.version != version:
            continue
        checked += 1
        for line in installed.requires or []:
            requirement = Requirement(line)
            if _applies(requirement, asked.get(name, set())):
                assert canonicalize_name(requirement.name) in locked, (
                    f"{name} {version} needs {requirement}, which the lock file lacks"
                )
    assert checked > len(locked) / 2, "too few locked versions installed here to check"


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _pip_installs(command: str) -> list[list[str]]:
    """The arguments of each ``pip install`` in a RUN's shell command (``then pip install``
    included)."""
    found = []
    for part in re.split(r"&&|;", command):
        words = shlex.split(part)
        for i in range(len(words) - 1):
            if words[i : i + 2] == ["pip", "install"]:
                found.append(words[i + 2 :])
    return found


def test_the_image_installs_the_lock_then_the_project_without_editable_installs():
    instructions = _instructions()
    copied = {}
    installs = []
    env: dict[str, str] = {}
    workdir = None
    for keyword, rest in instructions:
        if keyword == "COPY":
            *sources, target = shlex.split(rest)
            for source in sources:
                copied[source] = target
        elif keyword == "RUN":
            installs += [(args, rest) for args in _pip_installs(rest)]
        elif keyword == "ENV":
            env.update(dict(re.findall(r"([A-Z_]+)=(\S+)", rest)))
        elif keyword == "WORKDIR":
            workdir = rest
    lock_target = copied["requirements/lock.txt"]
    for args, _ in installs:
        assert "-e" not in args and "--editable" not in args, args
    (from_lock,) = [a for a, _ in installs if "-r" in a]
    assert from_lock[from_lock.index("-r") + 1] == lock_target
    assert "--require-hashes" in from_lock and "--no-deps" in from_lock
    ((project_args, project_run),) = [
        (a, run) for a, run in installs if "--no-deps" in a and "-r" not in a
    ]
    source = project_args[-1].rstrip("/")
    assert copied["pyproject.toml"].rstrip("/") == source
    assert installs[0][0] == from_lock  # the lock first, then the project
    # The project's source is not kept beside its installed copy (a package in the working
    # directory would shadow it); its templates and static files are, where the settings look.
    for package in ("console", "runtime"):
        assert Path(copied[package]).parent == Path(source), (package, copied[package])
    assert f"rm -rf {source}" in project_run
    # A team's tool packages cannot move a locked version (the lock constrains them).
    (tools,) = [a for a, _ in installs if "$TOOL_PACKAGES" in a]
    assert tools[tools.index("-c") + 1] == lock_target
    assert env["CONSOLE_HOME"] == workdir
    for tree in ("templates", "static"):
        assert copied[tree] in (f"./{tree}", f"{workdir}/{tree}"), (tree, copied[tree])
    (collect,) = [rest for keyword, rest in instructions if "collectstatic" in rest]
    assert collect.index("collectstatic") > collect.index("pip install --no-deps")


def test_make_installs_what_running_needs_from_the_lock(tmp_path):
    dry = subprocess.run(
        ["make", "-n", "-B", "install-run", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    installs = [shlex.split(line) for line in dry.splitlines() if " pip install " in line]
    args = [words[words.index("install") + 1 :] for words in installs]
    (from_lock,) = [a for a in args if "-r" in a]
    assert from_lock[from_lock.index("-r") + 1] == "requirements/lock.txt"
    assert "--require-hashes" in from_lock and "--no-deps" in from_lock
    assert ["-q", "--no-deps", "-e", "."] in args


_PATHS = """
import json
from django.conf import settings
print(json.dumps({"templates": [str(d) for d in settings.TEMPLATES[0]["DIRS"]],
                  "static": [str(d) for d in settings.STATICFILES_DIRS]}))
"""


def test_an_installed_project_finds_its_tree_through_console_home(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _PATHS],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "CONSOLE_HOME": str(tmp_path),
            "CONSOLE_DATA_DIR": str(tmp_path / "data"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    paths = json.loads(out)
    assert paths == {
        "templates": [str(tmp_path / "templates")],
        "static": [str(tmp_path / "static")],
    }
