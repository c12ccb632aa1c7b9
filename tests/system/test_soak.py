"""The kill soak's short variant (deploy/soak.py, docs/soak.md): a few dozen mixed operations
over every receiver contract, with approvals, budgets, children and artifacts, against a
PostgreSQL cluster and a Redis the soak starts for itself, while worker children are SIGKILLed,
Redis is stopped and restarted and PostgreSQL is restarted once."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.system]

OPS = 40


@pytest.mark.skipif(
    not glob.glob("/usr/lib/postgresql/*/bin/initdb") or not shutil.which("redis-server"),
    reason="the soak starts its own PostgreSQL cluster and Redis: needs initdb and redis-server",
)
@pytest.mark.timeout(240)
def test_short_soak_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, "deploy/soak.py", "--ops", str(OPS), "--seed", "7", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    print(run.stdout)  # the one line, shown with -s or on failure
    assert out.exists(), f"the soak ended without a verdict:\n{run.stdout}\n{run.stderr[-4000:]}"
    result = json.loads(out.read_text())
    line = result["line"]
    assert line in run.stdout.splitlines()
    # The faults happened while the work ran: otherwise the counts prove nothing.
    chaos = result["chaos"]
    assert chaos["child_kills"] > 0, chaos
    assert chaos["redis_restarts"] > 0, chaos
    assert chaos["postgres_restarts"] == 1, chaos
    assert result["approvals"] > 0 and result["children"] > 0 and result["artifacts"] > 0
    assert result["settled"], run.stdout
    assert result["acknowledged"] >= OPS // 2, line
    assert result["lost"] == 0, (line, result["lost_ids"])
    assert result["duplicates"] == 0, (line, result["duplicate_keys"])
    assert result["evidence"] == result["unresolved"], (line, result["no_evidence_ids"])
    assert result["budgets_balanced"], (line, result["budget_faults"])
    assert result["journals_gapless"], (line, result["journal_faults"])
    assert line.endswith("budgets balanced journals gapless")
    assert result["deadlocks"] == 0, line
    # The verdict is not true by construction: each fault planted into the settled state (and
    # rolled back) is named by it.
    bites = result["checker_bites"]
    assert all(bites[k] is True for k in ("duplicate", "lost", "budget", "journal")), bites
    assert bites["evidence"] is not False, bites
    assert run.returncode == 0, run.stdout
