"""A revoked token fails on its next request, and an event stream it opened ends within
TOKEN_RECHECK_SECONDS (over a real socket, against uvicorn). Issuing and revoking are audited
with the actor who did it."""

from __future__ import annotations

import threading

import httpx
import pytest

from runtime.models import ApiToken, AuditRecord
from runtime.tokens import token_issue_for_agent, token_revoke
from tests import factories
from tests.conftest import server_start, wait_for

pytestmark = [pytest.mark.postgres]


def test_an_open_event_stream_ends_when_its_token_is_revoked(transactional_db, tmp_path):
    web = server_start(tmp_path, TOKEN_RECHECK_SECONDS="0.5")
    try:
        agent = factories.agent()
        task = factories.task(agent)
        token = ApiToken.objects.get(prefix=agent.token.split("_")[1])
        lines: list[str] = []
        ended = threading.Event()

        def follow() -> None:
            client = httpx.Client(base_url=web.url, headers=agent.headers, timeout=60)
            with (
                client,
                client.stream(
                    "GET",
                    f"/api/v1/tasks/{task.pk}/events",
                    headers={"Accept": "text/event-stream"},
                ) as response,
            ):
                for line in response.iter_lines():
                    lines.append(line)
            ended.set()

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        wait_for(lambda: any(line.startswith("id: 1") for line in lines), what="the stream")
        assert not ended.is_set()
        assert token_revoke(token.pk, revoked_by="user:test-admin")
        assert ended.wait(timeout=30), "the stream outlived its token"
        assert "event: error" in lines
        refused = httpx.get(f"{web.url}/api/v1/tasks", headers=agent.headers)
        assert refused.status_code == 401
    finally:
        web.stop()


def test_issuing_and_revoking_are_audited(db):
    issued = token_issue_for_agent("audited-bot", issued_by="user:alice")
    assert token_revoke(issued.token.pk, revoked_by="user:bob")
    assert not token_revoke(issued.token.pk, revoked_by="user:bob")  # once
    records = AuditRecord.objects.filter(subject=f"token:{issued.token.pk}").order_by("id")
    assert [(r.action, r.actor) for r in records] == [
        ("token.issued", "user:alice"),
        ("token.revoked", "user:bob"),
    ]
    assert issued.secret not in str([r.detail for r in records])


def test_the_shell_is_named_as_the_actor_of_what_it_issues(db):
    agent = factories.agent()
    token = ApiToken.objects.get(prefix=agent.token.split("_")[1])
    assert token.created_by == "system:cli"
    assert AuditRecord.objects.get(subject=f"token:{token.pk}").actor == "system:cli"
