"""A person downloads an accepted artifact and sees its checks, in Chromium against the server:
checks arrive live when the agent asks for completion, and the downloaded bytes are exactly the
accepted ones (digest and all)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from runtime import completion
from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.errors import CompletionRefused
from runtime.models import Artifact, Task
from tests import factories
from tests.browser.conftest import operator, wait_live
from tests.conftest import Server, server_start

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

REPORT = {"artifact": "report.json"}
SCHEMA = {"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}


@pytest.fixture
def artifact_server(transactional_db: None, tmp_path: Path, fs_artifacts: Path) -> Iterator[Server]:
    """The web server reading artifacts from the same directory this test process writes them to."""
    srv = server_start(tmp_path, ARTIFACT_ROOT=str(fs_artifacts))
    try:
        yield srv
    finally:
        srv.stop()


def _accept(owner, task, document) -> Artifact:
    made = artifact_upload(
        owner.actor,
        task.pk,
        UploadSpec(name="report.json", media_type="application/json"),
        io.BytesIO(json.dumps(document).encode()),
    )
    version = Task.objects.get(pk=task.pk).state_version
    return artifact_accept(owner.actor, made.pk, expected_state_version=version)


def test_a_person_downloads_an_accepted_artifact_and_sees_its_checks(
    page: Page, artifact_server: Server, tmp_path: Path
):
    owner = factories.agent()
    task = factories.task(
        owner,
        "write the quarterly report",
        required_checks=[
            {"name": "report present", "checker": "artifact_present", "config": REPORT},
            {
                "name": "report shape",
                "checker": "json_schema",
                "config": {**REPORT, "schema": SCHEMA},
            },
        ],
    )
    first = _accept(owner, task, {"summary": 7})
    operator(page, artifact_server.url)
    page.goto(f"{artifact_server.url}/tasks/{task.pk}/")
    wait_live(page)
    row = page.locator(f'#artifacts tr[data-artifact="{first.pk}"]')
    expect(row).to_have_attribute("data-status", "accepted")
    expect(row.locator("[data-field=digest] span")).to_have_attribute("title", first.digest)
    expect(page.locator('#checks tr[data-check="report shape"]')).to_have_attribute(
        "data-result", "none"
    )

    # The agent asks for completion: the checks run and arrive on the open page, live.
    with pytest.raises(CompletionRefused):
        completion.task_complete(owner.actor, task.pk)
    shape = page.locator('#checks tr[data-check="report shape"]')
    expect(shape).to_have_attribute("data-result", "failed")
    expect(shape).to_contain_text("summary: 7 is not of type 'string'")
    expect(page.locator("#task-outcome")).to_contain_text("none yet")

    # A corrected report replaces the first; the old check is stale; completion succeeds.
    report = _accept(owner, task, {"summary": "revenue up"})
    expect(page.locator(f'#artifacts tr[data-artifact="{first.pk}"]')).to_have_attribute(
        "data-status", "superseded"
    )
    assert completion.task_complete(owner.actor, task.pk).outcome == "succeeded"
    for name in ("report present", "report shape"):
        check = page.locator(f'#checks tr[data-check="{name}"]')
        expect(check).to_have_attribute("data-result", "passed")
        expect(check).to_have_attribute("data-counts", "true")
        expect(check).to_contain_text(report.digest[:19])
    expect(page.locator("#task-outcome")).to_contain_text("succeeded")

    current = page.locator(f'#artifacts tr[data-artifact="{report.pk}"]')
    expect(current.locator("[data-field=verification]")).to_have_text("checks: passed")
    with page.expect_download() as info:
        current.locator("[data-link=download]").click()
    download = info.value
    assert download.suggested_filename == "report.json"
    saved = tmp_path / "downloaded.json"
    download.save_as(saved)
    data = saved.read_bytes()
    assert json.loads(data) == {"summary": "revenue up"}
    assert "sha256:" + hashlib.sha256(data).hexdigest() == report.digest
    assert page.page_errors == []  # type: ignore[attr-defined]
