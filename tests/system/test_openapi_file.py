"""The repository's API reference, docs/openapi.yaml, is what the code serves: generated the way
`make schema` generates it and compared byte for byte."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.system

COMMITTED = ROOT / "docs" / "openapi.yaml"


def test_committed_openapi_schema_matches_the_code(tmp_path: Path):
    generated = tmp_path / "openapi.yaml"
    made = subprocess.run(
        [
            *(sys.executable, "manage.py", "spectacular", "--file", str(generated)),
            *("--validate", "--fail-on-warn"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert COMMITTED.exists(), "docs/openapi.yaml is missing: run `make schema` and commit it"
    want = generated.read_text()
    have = COMMITTED.read_text()
    if have != want:
        diff = "".join(
            list(
                difflib.unified_diff(
                    have.splitlines(keepends=True),
                    want.splitlines(keepends=True),
                    "docs/openapi.yaml (committed)",
                    "generated from the code",
                )
            )[:80]
        )
        pytest.fail(f"docs/openapi.yaml differs from the code: run `make schema`\n{diff}")
