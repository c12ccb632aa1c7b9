"""Outcomes over REST: artifact upload (multipart), acceptance guarded on the task version,
content download with its media type and Content-Disposition, provenance, checks, completion.
Runs on SQLite too (no postgres marker): the embedded mode serves the same contract."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests import factories
from tests.api.support import assert_error, post_json

SCHEMA = {"type": "object", "required": ["summary"]}
CHECKS = [
    {"name": "present", "checker": "artifact_present", "config": {"artifact": "report.json"}},
    {
        "name": "shape",
        "checker": "json_schema",
        "config": {"artifact": "report.json", "schema": SCHEMA},
    },
]


def upload(
    client, task_id, data: bytes, name="report.json", media_type="application/json", **headers
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = {"file": SimpleUploadedFile("ignored-name", data, content_type=media_type), "name": name,
            "media_type": media_type}  # fmt: skip
    return client.post(f"/api/v1/tasks/{task_id}/artifacts", body, format="multipart", **headers)


def version(client, task_id) -> int:
    return int(client.get(f"/api/v1/tasks/{task_id}").json()["state_version"])


@pytest.mark.django_db(transaction=True)
def test_upload_accept_download_and_provenance(fs_artifacts):
    alice = factories.agent()
    client = alice.client()
    task = post_json(client, "/api/v1/tasks", {"name": "t", "required_checks": CHECKS}).json()
    data = json.dumps({"summary": "done"}).encode()
    response = upload(client, task["id"], data)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert body["size"] == len(data) and body["status"] == "stored"
    assert {"id", "digest", "size", "status"} <= set(body)

    stale = version(client, task["id"])
    notes = upload(client, task["id"], b"notes", name="notes.txt", media_type="text/plain").json()
    moved = post_json(
        client, f"/api/v1/artifacts/{notes['id']}/accept", {"expected_state_version": stale}
    )
    assert moved.status_code == 200, moved.content
    assert_error(
        post_json(
            client, f"/api/v1/artifacts/{body['id']}/accept", {"expected_state_version": stale}
        ),
        409,
        "state_version_mismatch",
    )
    accepted = post_json(
        client,
        f"/api/v1/artifacts/{body['id']}/accept",
        {"expected_state_version": stale + 1},
    )
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["status"] == "accepted"
    assert accepted.json()["task_state_version"] == version(client, task["id"])

    content = client.get(f"/api/v1/artifacts/{body['id']}/content")
    assert content.status_code == 200
    assert b"".join(content.streaming_content) == data
    assert content["Content-Type"] == "application/json"
    assert content["Content-Disposition"] == 'attachment; filename="report.json"'
    assert content["ETag"] == f'"{body["digest"]}"'

    provenance = client.get(f"/api/v1/artifacts/{body['id']}/provenance").json()
    assert provenance["subject"][0]["digest"]["sha256"] == body["digest"][7:]

    listed = client.get(f"/api/v1/tasks/{task['id']}/artifacts").json()["artifacts"]
    assert [a["id"] for a in listed] == [notes["id"], body["id"]]


@pytest.mark.django_db(transaction=True)
def test_checks_and_completion_over_rest(fs_artifacts):
    alice = factories.agent()
    client = alice.client()
    task = post_json(client, "/api/v1/tasks", {"name": "t", "required_checks": CHECKS}).json()
    listed = client.get(f"/api/v1/tasks/{task['id']}/checks").json()["checks"]
    assert [(c["name"], c["checker"], c["result"]) for c in listed] == [
        ("present", "artifact_present", None),
        ("shape", "json_schema", None),
    ]

    refused = assert_error(
        post_json(client, f"/api/v1/tasks/{task['id']}/complete", {}), 409, "completion_refused"
    )
    assert {c["name"] for c in refused["checks"]} == {"present", "shape"}
    assert refused["operations"] == []
    assert client.get(f"/api/v1/tasks/{task['id']}").json()["outcome"] is None

    made = upload(client, task["id"], b'{"summary": "ok"}').json()
    post_json(
        client,
        f"/api/v1/artifacts/{made['id']}/accept",
        {"expected_state_version": version(client, task["id"])},
    )
    done = post_json(client, f"/api/v1/tasks/{task['id']}/complete", {})
    assert done.status_code == 200, done.content
    assert (done.json()["condition"], done.json()["outcome"]) == ("terminal", "succeeded")
    checks = client.get(f"/api/v1/tasks/{task['id']}/checks").json()["checks"]
    for check in checks:
        assert check["result"] == "passed" and check["counts"]
        assert check["checker_version"] == "1"
        assert check["subject_digest"] == made["digest"]
        assert check["at"].endswith("Z")
    outcome = client.get("/api/v1/tasks", {"outcome": "succeeded"}).json()["results"]
    assert [t["id"] for t in outcome] == [task["id"]]


@pytest.mark.django_db
def test_required_checks_are_honoured_not_dropped():
    client = factories.agent().client()
    assert_error(
        post_json(
            client,
            "/api/v1/tasks",
            {"name": "t", "required_checks": [{"name": "x", "checker": "nope", "config": {}}]},
        ),
        400,
        "unknown_checker",
    )
    assert_error(
        post_json(
            client,
            "/api/v1/tasks",
            {
                "name": "t",
                "required_checks": [{"name": "x", "checker": "json_schema", "config": {}}],
            },
        ),
        400,
        "invalid_input",
    )


@pytest.mark.django_db(transaction=True)
def test_bad_uploads_get_clear_4xx_and_change_nothing(fs_artifacts, settings):
    settings.ARTIFACT_MAX_BYTES = 100
    alice = factories.agent()
    client = alice.client()
    task = post_json(client, "/api/v1/tasks", {"name": "t"}).json()
    assert_error(upload(client, task["id"], b"x", name="../../etc/passwd"), 400, "invalid_input")
    assert_error(upload(client, task["id"], b"x", name="a\u202egpj.exe"), 400, "invalid_input")
    assert_error(
        upload(client, task["id"], b"<script>", name="x.html", media_type="text/html"),
        415,
        "unsupported_media_type",
    )
    assert_error(upload(client, task["id"], b"x" * 101), 413, "artifact_too_large")
    response = client.post(
        f"/api/v1/tasks/{task['id']}/artifacts", {"name": "x"}, format="multipart"
    )
    assert_error(response, 400, "invalid_input")
    assert_error(
        post_json(client, f"/api/v1/tasks/{task['id']}/artifacts", {"name": "x"}),
        415,
        "unsupported_media_type",
    )
    listed = client.get(f"/api/v1/tasks/{task['id']}/artifacts").json()["artifacts"]
    assert [a["status"] for a in listed] == ["failed"]  # only the oversized one got a row
    assert_error(client.get("/api/v1/artifacts/art_nope/content"), 404, "not_found")


@pytest.mark.django_db(transaction=True)
def test_visibility_and_rights(fs_artifacts):
    alice, mallory = factories.agent(), factories.agent()
    operator = factories.console_user("operator")
    task = post_json(alice.client(), "/api/v1/tasks", {"name": "t"}).json()
    made = upload(alice.client(), task["id"], b"{}").json()
    assert_error(mallory.client().get(f"/api/v1/artifacts/{made['id']}/content"), 404)
    assert_error(upload(mallory.client(), task["id"], b"{}"), 404)
    assert_error(post_json(mallory.client(), f"/api/v1/tasks/{task['id']}/complete", {}), 404)
    # A console operator reads, but does not change, an agent's outcome.
    assert operator.client().get(f"/api/v1/artifacts/{made['id']}/content").status_code == 200
    assert_error(upload(operator.client(), task["id"], b"{}"), 403, "not_authorized")
    assert_error(
        post_json(operator.client(), f"/api/v1/tasks/{task['id']}/complete", {}),
        403,
        "not_authorized",
    )


@pytest.mark.django_db(transaction=True)
def test_an_upload_replayed_with_its_idempotency_key_stores_once(fs_artifacts):
    alice = factories.agent()
    client = alice.client()
    task = post_json(client, "/api/v1/tasks", {"name": "t"}).json()
    first = upload(client, task["id"], b"{}", HTTP_IDEMPOTENCY_KEY="up-1")
    again = upload(client, task["id"], b"{}", HTTP_IDEMPOTENCY_KEY="up-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = upload(client, task["id"], b"[]", HTTP_IDEMPOTENCY_KEY="up-1")
    assert_error(other, 422, "idempotency_key_reused")
    assert len(client.get(f"/api/v1/tasks/{task['id']}/artifacts").json()["artifacts"]) == 1


@pytest.mark.postgres
def test_a_large_upload_over_a_real_socket_round_trips(transactional_db, tmp_path, fs_artifacts):
    """Through uvicorn: a body larger than Django keeps in memory (it spools to disk), streamed
    into storage, verified, and downloaded back byte for byte."""
    import httpx

    from tests.conftest import server_start

    server = server_start(tmp_path, ARTIFACT_ROOT=str(fs_artifacts))
    try:
        alice = factories.agent()
        task = factories_task_id(alice)
        data = bytes(range(256)) * (12 * 1024)  # 3 MiB, above FILE_UPLOAD_MAX_MEMORY_SIZE
        with httpx.Client(base_url=server.url, headers=alice.headers, timeout=60) as http:
            response = http.post(
                f"/api/v1/tasks/{task}/artifacts",
                files={"file": ("big.bin", data, "application/octet-stream")},
                data={"name": "big.bin", "media_type": "application/octet-stream"},
            )
            assert response.status_code == 201, response.text
            body = response.json()
            assert body["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
            assert body["size"] == len(data)
            down = http.get(f"/api/v1/artifacts/{body['id']}/content")
            assert down.status_code == 200
            assert down.content == data
            assert down.headers["content-disposition"] == 'attachment; filename="big.bin"'
            # A malformed multipart body is the contract's 400, not a bare one.
            bad = http.post(
                f"/api/v1/tasks/{task}/artifacts",
                content=b'--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nno end',
                headers={"Content-Type": "multipart/form-data; boundary=xyz"},
            )
            assert bad.status_code == 400, bad.text
            assert set(bad.json()["error"]) >= {"code", "message"}
            missing = http.post(
                f"/api/v1/tasks/{task}/artifacts",
                content=b"garbage",
                headers={"Content-Type": "multipart/form-data"},
            )
            assert missing.status_code == 400, missing.text
            assert "error" in missing.json()
    finally:
        server.stop()


def factories_task_id(owner) -> str:
    return str(factories.task(owner).pk)


@pytest.mark.django_db(transaction=True)
def test_running_checks_is_for_the_agent_or_an_admin(fs_artifacts):
    alice = factories.agent()
    task = post_json(alice.client(), "/api/v1/tasks", {"name": "t", "required_checks": CHECKS})
    task_id = task.json()["id"]
    operator = factories.console_user("operator").client()
    assert operator.get(f"/api/v1/tasks/{task_id}/checks").status_code == 200
    assert_error(operator.post(f"/api/v1/tasks/{task_id}/checks"), 403, "not_authorized")
    ran = alice.client().post(f"/api/v1/tasks/{task_id}/checks").json()["checks"]
    assert [(c["name"], c["result"]) for c in ran] == [("present", "failed"), ("shape", "failed")]
