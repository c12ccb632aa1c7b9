"""The URLs of the floor's server (deploy/bench_floor.py's settings): the floor, and the peers of
issue 37, fed over HTTP by the same agent processes through the same web server, edge,
middleware and bearer-token check as the console's API:

- ``POST /api/v1/floor``: the floor (bench_floor.floor), one authenticated INSERT.
- ``POST /api/v1/peers/drf_celery``: the non-durable version of this stack, as a team would
  write it with DRF and Celery: an APIView (the API's bearer authentication, handed over by
  the edge) INSERTs a row into ``bench_peer`` and ``.delay()``s ``bench.peer_done``
  (deploy/bench_celery.py), run by the plain Celery peer's worker processes, which marks the
  row done. No idempotency record, no journal, no fencing: a lost message is a lost operation.
- ``POST /api/v1/peers/dbos``: a DBOS workflow (deploy/bench_dbos.py's ``one_step``) started
  by an APIView with the body's ``step`` as its workflow id (``DBOS.start_workflow``: its
  status row is durable when the view answers; the workflow runs on DBOS's threads in this
  process). DBOS is launched in the process at the first such request (BENCH_DBOS_URL: its
  system database), so a server that serves only the floor never starts it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import bench_celery
import bench_dbos
from bench_floor import floor
from dbos import DBOS, SetWorkflowID
from django.db import connection
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.auth import BearerTokenAuthentication

_dbos_lock = threading.Lock()
_dbos_up = False


def _dbos() -> None:
    global _dbos_up
    with _dbos_lock:
        if not _dbos_up:
            bench_dbos.launch(os.environ["BENCH_DBOS_URL"], int(os.environ.get("DBOS_POOL", "8")))
            DBOS.launch()
            _dbos_up = True


class DrfCelery(APIView):
    authentication_classes = [BearerTokenAuthentication]

    def post(self, request: Request) -> Response:
        actor: Any = request.auth
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO bench_peer (actor, step) VALUES (%s, %s) RETURNING id",
                [str(actor.name), str(request.data.get("step", ""))],
            )
            row_id = cur.fetchone()[0]
        bench_celery.peer_done.delay(row_id)
        return Response({"id": row_id}, status=201)


class DbosHttp(APIView):
    authentication_classes = [BearerTokenAuthentication]

    def post(self, request: Request) -> Response:
        _dbos()
        step = str(request.data.get("step", ""))
        with SetWorkflowID(step):
            handle = DBOS.start_workflow(bench_dbos.one_step, 1)
        return Response({"id": handle.workflow_id}, status=201)


urlpatterns = [
    path("api/v1/floor", floor),
    path("api/v1/peers/drf_celery", DrfCelery.as_view()),
    path("api/v1/peers/dbos", DbosHttp.as_view()),
]
