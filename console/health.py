"""``GET /healthz``: 200 once the database and the broker answer; 503 otherwise."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse

from console.celery import app
from runtime.executions import executions_live


def healthz(request: HttpRequest) -> JsonResponse:
    body: dict[str, object] = {"database": "ok", "broker": "ok", "workers": 0}
    healthy = True
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        body["workers"] = executions_live()
    except Exception as exc:
        body["database"] = f"error: {type(exc).__name__}"
        healthy = False
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        body["broker"] = f"error: {type(exc).__name__}"
        healthy = False
    return JsonResponse(body, status=200 if healthy else 503)
