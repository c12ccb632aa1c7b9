"""The HTTP tools' receiver for `make bench` (BENCH_PARTS=http): a process of its own answering
every ``POST /call`` after BENCH_HTTP_DELAY_MS (50 ms), as a remote API would, and recording
each request's ``Idempotency-Key``. deploy/bench.py starts it; the console's declared HTTP tool
and plain Celery's thread pool call the same one.

``GET /stats`` answers {"calls": requests to /call, "keys": distinct keys among them};
``POST /reset`` forgets them. A thread per connection (ThreadingHTTPServer), HTTP/1.1 keep-alive
for the clients that keep their connections (httpx); the console's tool opens one a call.

Run as ``python deploy/bench_receiver.py PORT``; prints ``ready`` once it listens.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELAY = float(os.environ.get("BENCH_HTTP_DELAY_MS", "50")) / 1000

_lock = threading.Lock()
_calls = 0
_keys: set[str] = set()


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        global _calls
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path == "/reset":
            with _lock:
                _calls = 0
                _keys.clear()
            self._answer(200, {"reset": True})
            return
        time.sleep(DELAY)
        key = self.headers.get("Idempotency-Key") or ""
        with _lock:
            _calls += 1
            _keys.add(key)
        self._answer(200, {"ok": True})

    def do_GET(self) -> None:
        with _lock:
            stats = {"calls": _calls, "keys": len(_keys)}
        self._answer(200, stats)

    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of slots connect at once: a short backlog would drop (and delay) their SYNs.
    request_queue_size = 1024


def main() -> int:
    server = Server(("127.0.0.1", int(sys.argv[1])), Receiver)
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
