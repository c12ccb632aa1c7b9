"""Agents for `make bench`: a process of its own that posts proposals over HTTP, as agents do.

deploy/bench.py starts BENCH_AGENT_PROCS of these. Each reads one JSON line on stdin (the plan),
opens its keep-alive connections, prints ``ready``, then reads a second line: the wall-clock
time at which every process starts. Operation ``i`` of the run (numbered across all processes)
belongs to client ``i % total_clients`` and is due at ``start + i / rate`` (all at ``start``
with rate 0, a burst); a client that falls behind sends late, and the latency is still taken
from the due time, so a lagging sender is counted against the path, not hidden.

Prints one JSON line: {"ops": [[operation id, due, sent, answered], ...], "errors": [...]}
(times are epoch seconds from time.time(): the same clock as PostgreSQL's commit times here).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import uuid
from typing import Any


def main() -> int:
    plan = json.loads(sys.stdin.readline())
    port, secret = int(plan["port"]), str(plan["secret"])
    tasks, count, rate = plan["tasks"], int(plan["count"]), float(plan["rate"])
    first, mine, total_clients = int(plan["first_client"]), int(plan["clients"]), int(plan["total"])
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=120) for _ in range(mine)]
    for conn in conns:  # connect (and authenticate once) before the clock starts
        conn.request("GET", "/api/v1/tasks?limit=1", headers=headers)
        conn.getresponse().read()
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    ops: list[list[Any]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        conn, g = conns[k], first + k
        done: list[list[Any]] = []
        for i in range(g, count, total_clients):
            due = start + (i / rate if rate else 0.0)
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            step = f"{plan['label']}-{i}-{uuid.uuid4().hex[:8]}"
            body = json.dumps(
                {"tool": plan["tool"], "step": step, "params": {**plan["params"], "i": i}}
            ).encode()
            sent = time.time()
            try:
                conn.request(
                    "POST",
                    plan.get("path") or f"/api/v1/tasks/{tasks[i % len(tasks)]}/operations",
                    body,
                    {**headers, "Idempotency-Key": step},
                )
                response = conn.getresponse()
                data = json.loads(response.read() or b"null")
            except (http.client.HTTPException, OSError) as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                continue
            if response.status != 201:
                with lock:
                    errors.append(f"{response.status} {str(data)[:300]}")
                continue
            done.append([data["id"], due, sent, time.time()])
        with lock:
            ops.extend(done)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(mine)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for conn in conns:
        conn.close()
    print(json.dumps({"ops": ops, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
