"""The report of `make bench`: var/bench/report.md, the chart var/bench/throughput.svg
(hand-written SVG: no plotting dependency), and the raw figures in var/bench/result.json."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

COLOURS = {"ours": "#1f6feb", "celery": "#2da44e", "dbos": "#bf8700"}
LABELS = {
    "ours": "ours (durable)",
    "celery": "plain Celery (no-op)",
    "dbos": "DBOS (one process)",
}


def chart_svg(series: dict[str, dict[int, float]], dbos: float, workers: list[int]) -> str:
    """Throughput against worker processes: one line per system, DBOS as a reference level
    (it runs in one process with threads, so worker processes do not apply to it)."""
    width, height, left, right, top, bottom = 720, 360, 70, 190, 30, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([dbos, *(v for s in series.values() for v in s.values()), 1.0]) * 1.1
    xs = sorted(set(workers) | {w for s in series.values() for w in s})

    def x(w: int) -> float:
        return left + (xs.index(w) / max(1, len(xs) - 1)) * plot_w

    def y(v: float) -> float:
        return top + plot_h - v / peak * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="14">Throughput against worker processes</text>',
    ]
    for i in range(6):
        v = peak * i / 5
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            'stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    for w in xs:
        out.append(f'<text x="{x(w):.1f}" y="{top + plot_h + 18}" text-anchor="middle">{w}</text>')
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">'
        "worker processes (prefork)</text>"
    )
    out.append(
        f'<text transform="translate(16 {top + plot_h / 2}) rotate(-90)" '
        'text-anchor="middle">operations per second</text>'
    )
    if dbos:
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(dbos):.1f}" y2="{y(dbos):.1f}" '
            f'stroke="{COLOURS["dbos"]}" stroke-dasharray="6 4" stroke-width="2"/>'
        )
    for name, points in series.items():
        pts = sorted(points.items())
        if not pts:
            continue
        path = " ".join(f"{x(w):.1f},{y(v):.1f}" for w, v in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{COLOURS[name]}" stroke-width="2"/>'
        )
        for w, v in pts:
            out.append(
                f'<circle cx="{x(w):.1f}" cy="{y(v):.1f}" r="4" fill="{COLOURS[name]}">'
                f"<title>{escape(name)} {w}: {v:.1f}/s</title></circle>"
            )
            out.append(
                f'<text x="{x(w) + 6:.1f}" y="{y(v) - 6:.1f}" fill="{COLOURS[name]}">{v:.0f}</text>'
            )
    for i, name in enumerate(["ours", "celery", "dbos"]):
        ly = top + 10 + i * 20
        lx = left + plot_w + 15
        dash = ' stroke-dasharray="6 4"' if name == "dbos" else ""
        out.append(
            f'<line x1="{lx}" x2="{lx + 20}" y1="{ly}" y2="{ly}" stroke="{COLOURS[name]}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 26}" y="{ly + 4}">{escape(LABELS[name])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_report(out: Path, *, result: dict[str, float], details: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    chart = details["chart"]
    workers = sorted(set(chart["ours"]) | set(chart["celery"]))
    dbos = result["dbos_ops_per_s"]
    (out / "throughput.svg").write_text(chart_svg(chart, dbos, workers))
    (out / "result.json").write_text(
        json.dumps({"result": result, "details": details}, indent=2, default=str)
    )
    counts, paced, api, reads = (
        details["counts"],
        details["paced"],
        details["api"],
        details["reads"],
    )
    bursts = details["bursts"]
    w = details["workers"]
    quick = " (BENCH_QUICK: small runs, only a check of the harness)" if details["quick"] else ""
    propose_st = counts["phases"]["propose"]["statements"]
    execute_st = counts["phases"]["execute"]["statements"]
    rows = [
        (
            "ours: durable operations/s (median)",
            result["ops_per_s"],
            ", ".join(f"{b['ops_per_s']:.1f}" for b in bursts),
        ),
        (
            "plain Celery: no-op tasks/s",
            result["celery_ops_per_s"],
            ", ".join(f"{v:.0f}" for v in details["celery"]),
        ),
        (
            "DBOS: single-step workflows/s",
            dbos,
            ", ".join(f"{v:.0f}" for v in details["dbos"]["rounds"]),
        ),
    ]
    lines = [
        "# make bench",
        "",
        f"{details['when']}; {w} worker processes; {details['rounds']} rounds{quick};"
        f" load average at the end {details['load'][0]:.2f}; {details['seconds']:.0f} s in all.",
        "",
        "| figure | median | rounds |",
        "|---|---:|---|",
        *(f"| {name} | {value:.1f} | {each} |" for name, value, each in rows),
        "",
        f"- Ratios: **{result['ratio_vs_celery']:.2f}** of plain Celery, "
        f"**{result['ratio_vs_dbos']:.2f}** of DBOS (targets: >= 0.5 and >= 2): the medians of "
        "the rounds' own ratios, each round running ours, plain Celery and DBOS back to back ("
        + ", ".join(f"{c:.2f}" for c in details["ratios"]["celery"])
        + " of Celery; "
        + ", ".join(f"{d:.2f}" for d in details["ratios"]["dbos"])
        + " of DBOS).",
        f"- Latency, proposal sent to acceptance committed, from an open-loop proposer at "
        f"{paced['rate']:.1f}/s (half the peak; achieved {paced['achieved_rate']:.1f}/s) over "
        f"{paced['ops']} operations: "
        f"p50 **{paced['p50_ms']:.1f} ms**, p99 **{paced['p99_ms']:.1f} ms** (target p50 < 20 ms).",
        f"- Write commits per operation, commit records in the WAL during the bursts "
        f"(server-wide: other databases' writes count too on a shared machine): "
        f"**{result['commits_per_op']:.2f}**; "
        f"counted in-process over a sample of {counts['sample']}: "
        f"{counts['commits_per_op']:.2f} (target <= 3). Under the bursts a backlog makes the "
        "workers drain quick calls in batches (README: Batches under a backlog), so the WAL "
        "figure is below the one-operation path's 3; the in-process sample runs that path.",
        f"- SQL statements per operation (in-process sample, propose + the worker's task body): "
        f"**{counts['statements_per_op']:.1f}** (propose {propose_st:.1f}, "
        f"claim + invoke + report {execute_st:.1f}; target <= 10); "
        "by kind: " + ", ".join(f"{k} {v:.1f}" for k, v in counts["verbs"].items()) + ".",
        f"- REST: **{api['api_propose_per_s']:.1f}** proposals/s over HTTP from "
        f"{details['api_clients']} keep-alive clients, each POST with an Idempotency-Key; "
        f"p50 {api['api_p50_ms']:.1f} ms, p99 **{api['api_p99_ms']:.1f} ms**; "
        f"{api['api_commits_per_op']:.2f} write commits per proposal (WAL commit records).",
        f"- Reads with {details['seed']['events']:,} journal events over "
        f"{details['seed']['tasks']:,} tasks ({details['seed']['big_events']:,} on one task): "
        f"task list p50 {reads['list_p50_ms']:.1f} ms, p99 **{reads['list_p99_ms']:.1f} ms**; "
        f"timeline p50 {reads['timeline_p50_ms']:.1f} ms, "
        f"p99 **{reads['timeline_p99_ms']:.1f} ms** (target < 50 ms).",
        f"- Proposal rate of the bench's own proposers ({details['proposers']} threads) during the "
        "bursts: "
        + ", ".join(f"{b['propose_per_s']:.0f}/s" for b in bursts)
        + " (if this is close to the durable rate, the proposers are the bottleneck).",
        "",
        "## Throughput against worker processes",
        "",
        "![throughput against worker processes](throughput.svg)",
        "",
        "| worker processes | ours ops/s | plain Celery tasks/s |",
        "|---:|---:|---:|",
        *(
            f"| {n} | {chart['ours'].get(n, 0):.1f} | {chart['celery'].get(n, 0):.0f} |"
            for n in workers
        ),
        "",
        f"DBOS runs in one process with {details['dbos']['threads']} threads "
        "(the dashed line). Points other than the main worker count are one shorter round each. "
        "On a 2-core machine more than 2 processes share the same cores: past 2 the curve shows "
        "contention, not scale-out.",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
