"""The floor of `make bench`'s REST figures: the console's own settings, web server
(console.server: uvicorn, the same ASGI handler, middleware and database pool) and database,
with one URL only: ``POST /api/v1/floor`` authenticates the bearer token as the API does
(runtime.tokens.token_authenticate) and INSERTs one row (table ``bench_floor``, created by the
driver), in one transaction. Nothing else: no idempotency record, no journal, no outbox. The
gap between this and a proposal is the price of durability on the same stack.

It lives in deploy/ so the console carries no bench-only route: deploy/bench.py runs
``python -m console.server`` with ``DJANGO_SETTINGS_MODULE=bench_floor`` and deploy/ on the path.
Its URLs are deploy/bench_peers.py's: the floor's, and the peers fed over HTTP through the same
server (issue 37).

The token is checked once: console.edge authenticates the bearer token from the request's head
(before the body is read) and hands the principal over; the view takes it instead of asking
token_authenticate again (it asked twice before issue 37, the edge's check and its own).
"""

from __future__ import annotations

import json

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from console.settings import *  # noqa: F403 (the console's settings, all of them)

ROOT_URLCONF = "bench_peers"


@csrf_exempt
def floor(request: HttpRequest) -> HttpResponse:
    # Imported here: this module is the settings too, read before the apps are ready.
    from runtime.errors import NotAuthenticated
    from runtime.tokens import token_authenticate

    header = request.headers.get("Authorization", "")
    if request.method != "POST" or not header.startswith("Bearer "):
        return JsonResponse({"error": {"code": "not_authenticated", "message": "no"}}, status=401)
    # The edge's principal, found from the head (console.edge.hand_over); a request the edge
    # did not see (no body) is checked here.
    actor = getattr(request, "_force_auth_token", None)
    if actor is None:
        try:
            actor = token_authenticate(header[7:], address=request.META.get("REMOTE_ADDR"))
        except NotAuthenticated:
            return JsonResponse(
                {"error": {"code": "not_authenticated", "message": "no"}}, status=401
            )
    body = json.loads(request.body or b"{}")
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO bench_floor (actor, body) VALUES (%s, %s) RETURNING id",
            [str(actor.name), json.dumps(body)],
        )
        row_id = cur.fetchone()[0]
    return JsonResponse({"id": row_id}, status=201)
