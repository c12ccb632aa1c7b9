"""``CONSOLE_ENV=production`` gives settings that Django's deployment checks accept as they are,
and refuses to start without the secrets it cannot invent."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "CONSOLE_", "DJANGO_"))
        and k not in ("SECRET_KEY", "ALLOWED_HOSTS", "DEBUG", "DEMO_TOOLS", "SECURE_SSL_REDIRECT")
    }
    base.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        CONSOLE_DATA_DIR=str(tmp_path / "data"),
        PYTHONUNBUFFERED="1",
    )
    if os.environ.get("DATABASE_URL"):
        base["DATABASE_URL"] = os.environ["DATABASE_URL"]
    base.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_check_deploy_reports_no_issue_in_production(tmp_path: Path):
    done = _manage(
        tmp_path,
        "check",
        "--deploy",
        CONSOLE_ENV="production",
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="example.com",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "System check identified no issues" in output, output


def test_check_deploy_flags_the_development_settings(tmp_path: Path):
    """The same check is not blind: outside production it names the missing hardening."""
    done = _manage(tmp_path, "check", "--deploy", CONSOLE_ENV="development")
    output = done.stdout + done.stderr
    assert "no issues" not in output, output
    for check_id in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check_id in output, output


@pytest.mark.parametrize(
    ("missing", "env"),
    [
        ("SECRET_KEY", {"ALLOWED_HOSTS": "example.com"}),
        ("ALLOWED_HOSTS", {"SECRET_KEY": secrets.token_urlsafe(64)}),
    ],
)
def test_production_refuses_to_start_without_its_secrets(
    tmp_path: Path, missing: str, env: dict[str, str]
):
    done = _manage(tmp_path, "check", CONSOLE_ENV="production", **env)
    assert done.returncode != 0
    assert f"CONSOLE_ENV=production needs {missing}" in done.stderr, done.stderr
