"""`make bench` survives a part that fails (issue 37): each part's figures are written as it
ends, and the report and the RESULT line come out with what the other parts measured, naming
what is missing. No timing is asserted: the parts here are stand-ins."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(DEPLOY))
    module = importlib.import_module("bench")
    monkeypatch.setattr(module, "OUT", tmp_path)
    yield module
    sys.modules.pop("bench", None)
    sys.modules.pop("bench_report", None)


def _ours() -> dict[str, Any]:
    return {
        "ops_per_s": 40.0,
        "propose_per_s": 90.0,
        "commits_per_op": 2.5,
        "wal_bytes_per_op": 6144.0,
        "wal_fpi_bytes_per_op": 2048.0,
        "wal_scanned": True,
        "web_cpu_ms_per_proposal": 4.0,
        "redis_cmds_per_op": 9.0,
    }


def test_a_part_that_raises_leaves_the_others_figures_and_is_named_missing(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = bench.Parts(tmp_path)

    def falls_over() -> dict[str, Any]:
        raise RuntimeError("the floor fell over")

    def refuses() -> dict[str, Any]:
        raise SystemExit("bench: timed out after 300 s waiting for the no-op tasks")

    rounds: list[dict[str, Any]] = []
    for r in range(2):
        got: dict[str, Any] = {"order": ["ours", "floor", "celery"]}
        got["ours"] = parts.run(f"r{r}-ours", _ours)
        assert parts.run(f"r{r}-floor", falls_over) is None
        celery = parts.run(f"r{r}-celery", refuses if r else lambda: {"ops_per_s": 100.0})
        if celery is not None:
            got["celery"] = celery
        rounds.append(got)

    code = bench.finish(parts, None, time.perf_counter(), "test", None, rounds, {})

    assert code == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1
    line = lines[0]
    figures = dict(kv.split("=", 1) for kv in line.split()[1:])
    assert figures["ops_per_s"] == "40.00"
    assert figures["wal_kb_per_op"] == "6.00"
    assert figures["wal_kb_per_op_no_fpi"] == "4.00"
    assert figures["ratio_vs_celery"] == "0.40"  # the round where both ran
    missing = figures["missing"].split(",")
    assert {"r0-floor", "r1-floor", "r1-celery", "floor_rest_per_s"} <= set(missing)
    assert "ops_per_s" not in missing
    # Each part's file was written as it ended, the failed ones with the reason.
    assert json.loads((tmp_path / "parts" / "r0-ours.json").read_text())["figures"] == _ours()
    failed = json.loads((tmp_path / "parts" / "r1-floor.json").read_text())
    assert "the floor fell over" in failed["error"]
    report = (tmp_path / "report.md").read_text()
    assert "r1-floor" in report and "the floor fell over" in report
    assert json.loads((tmp_path / "result.json").read_text())["result"]["ops_per_s"] == 40.0


def test_wal_per_operation_falls_back_to_the_counters_when_the_segments_are_gone(
    bench: ModuleType,
) -> None:
    scanned = {"wal_scanned": True, "wal_bytes_per_op": 5000.0, "server_wal_lsn_bytes_per_op": 9e3}
    recycled = {"wal_scanned": False, "wal_bytes_per_op": 0.0, "server_wal_lsn_bytes_per_op": 9e3}
    assert bench.wal_bytes(scanned) == 5000.0
    assert bench.wal_bytes(recycled) == 9000.0
