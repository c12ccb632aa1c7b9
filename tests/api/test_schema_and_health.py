"""The operational endpoints: health with its checks, the OpenAPI schema and the browsable docs."""

from __future__ import annotations

import httpx
import pytest
import yaml
from rest_framework.test import APIClient

pytestmark = pytest.mark.postgres


def test_healthz_reports_database_broker_and_workers(db):
    response = APIClient().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"] == "ok" and body["broker"] == "ok"
    assert body["workers"] == 0


@pytest.mark.workers
def test_healthz_counts_live_worker_processes(workers):
    workers.start(count=1, concurrency=2)
    body = APIClient().get("/healthz").json()
    assert body == {"database": "ok", "broker": "ok", "workers": 2}


def test_healthz_over_the_real_server(server):
    response = httpx.get(f"{server.url}/healthz", timeout=30)
    assert response.status_code == 200
    body = response.json()
    assert {"database", "broker", "workers"} <= set(body)
    assert (body["database"], body["broker"]) == ("ok", "ok")


def test_schema_is_an_openapi_document_with_the_v1_paths(db):
    response = APIClient().get("/api/schema/")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    assert str(document["openapi"]).startswith("3.")
    paths = document["paths"]
    for path in (
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/operations",
        "/api/v1/tasks/{task_id}/events",
        "/api/v1/operations/{operation_id}",
    ):
        assert path in paths, sorted(paths)
    assert "post" in paths["/api/v1/tasks"] and "get" in paths["/api/v1/tasks"]


def test_schema_as_json(db):
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    assert "/api/v1/tasks" in response.json()["paths"]


def test_docs_page_is_html_served_from_this_site(db):
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "swagger" in html.lower()
    # The page's own script comes from a URL of this site (no inline script: the CSP), and
    # points the UI at the schema.
    assert "<script>" not in html
    script = APIClient().get("/api/docs/", {"script": ""})
    assert script.status_code == 200
    assert "/api/schema/" in script.content.decode()
    # No CDN: the machine (and many deployments) cannot reach one.
    assert "cdn.jsdelivr.net" not in html and "unpkg.com" not in html


def test_schema_declares_the_bearer_scheme(db):
    document = yaml.safe_load(APIClient().get("/api/schema/").content)
    schemes = document["components"]["securitySchemes"].values()
    assert {"type": "http", "scheme": "bearer"} in list(schemes)
    assert any("bearerAuth" in s for s in document["paths"]["/api/v1/tasks"]["post"]["security"])
