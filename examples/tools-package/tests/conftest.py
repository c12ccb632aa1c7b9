"""The tools run against the receivers' SQLite file in a temporary directory. They import the
console's runtime (runtime.tools), so the console must be importable: run these tests from the
console's environment, e.g. from the console's checkout:
    .venv/bin/pytest examples/tools-package
(the console's settings are loaded; no database or broker is touched)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import django
import pytest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django.setup()


@pytest.fixture(autouse=True)
def receivers_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "receivers.db"
    monkeypatch.setenv("ACME_RECEIVERS_DB", str(path))
    yield path
