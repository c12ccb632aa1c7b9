"""A quick `make bench` of the peers over HTTP (issue 37): `BENCH_QUICK=1 BENCH_PARTS=peers`
runs ours, the floor and the two peers fed over HTTP by the agent processes through the same
server (drf_celery: a DRF view and a Celery task; dbos_http: DBOS workflows started by a view),
one round each, on a bench database of its own. The figures are not asserted (a shared
machine's noise); the peers' apps running, their parts' files and the RESULT line's keys are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.conftest import ROOT, service_env

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.timeout(1500)]

PEER_KEYS = (
    "ops_per_s",
    "drf_celery_ops_per_s",
    "dbos_http_ops_per_s",
    "ratio_vs_drf_celery",
    "ratio_vs_dbos_http",
    "cpu_ratio_vs_floor",
    "web_cpu_ratio_vs_floor",
    "web_concurrency",
    "commits_per_op",
    "wal_kb_per_op",
    "api_propose_per_s",
    "floor_rest_per_s",
)


def test_a_quick_bench_of_the_peers_over_http_gives_every_key(tmp_path: Path) -> None:
    url = urlparse(os.environ["DATABASE_URL"])
    name = f"{url.path.lstrip('/')}_bench"  # the bench refuses a name without "bench"
    done = subprocess.run(
        [sys.executable, "deploy/bench.py"],
        cwd=ROOT,
        env=service_env(
            DATABASE_URL=url._replace(path=f"/{name}").geturl(),
            # The bench starts a Redis server of its own; this is only its fallback, which must
            # not be one of the suite's databases (CI's first worker has 15, which it refuses).
            REDIS_URL="redis://127.0.0.1:6379/3",
            BENCH_DBOS_DB=f"{name}_dbos",
            BENCH_OUT=str(tmp_path),
            BENCH_QUICK="1",
            BENCH_PARTS="peers",
            BENCH_ROUNDS="1",
            CONN_MAX_AGE="60",
        ),
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    output = done.stdout[-4000:] + done.stderr[-4000:]
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, output
    figures = dict(kv.split("=", 1) for kv in lines[0].split()[1:])
    # The one figure a busy shared server may take away: the images' share of the WAL needs
    # the WAL scan, skipped when the window's segments were recycled before it.
    missing = set(figures.get("missing", "").split(",")) - {""}
    assert missing <= {"wal_kb_per_op_no_fpi"}, lines[0]
    assert done.returncode == (1 if missing else 0), output
    assert set(PEER_KEYS) <= set(figures), lines[0]
    for part in ("r0-ours", "r0-floor", "r0-drf_celery", "r0-dbos_http"):
        written = json.loads((tmp_path / "parts" / f"{part}.json").read_text())
        assert written["figures"]["ops_per_s" if part != "r0-floor" else "floor_rest_per_s"] > 0
