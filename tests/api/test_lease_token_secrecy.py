"""No secret is kept in clear: a claim's lease token is derived (HMAC under LEASE_TOKEN_KEYS), so
the database holds only its digest and a stored idempotent response only a placeholder; a
replay derives the same token again. Keys rotate: the first signs, all verify, and a token of a
dropped key is a stale lease."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import override_settings
from rest_framework.test import APIClient

from runtime.models import IdempotentRequest, Operation
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


def _columns_holding(secret: str) -> list[str]:
    """Every text or JSON column of every table in the schema that contains ``secret``."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() "
            "AND data_type IN ('text', 'character varying', 'json', 'jsonb', 'character')"
        )
        columns = cur.fetchall()
        found = []
        for table, column in columns:
            cur.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text LIKE %s',
                [f"%{secret}%"],
            )
            if cur.fetchone()[0]:
                found.append(f"{table}.{column}")
    return found


def _claim(client: APIClient, op_id: str, key: str) -> Any:
    return client.post(f"/api/v1/operations/{op_id}/claim", HTTP_IDEMPOTENCY_KEY=key)


def _heartbeat(client: APIClient, op_id: str, body: dict[str, Any]) -> Any:
    return post_json(
        client,
        f"/api/v1/operations/{op_id}/heartbeat",
        {"lease_generation": body["lease_generation"], "lease_token": body["lease_token"]},
    )


def test_no_column_holds_a_claims_token_and_its_replay_works_for_heartbeat_and_complete():
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner), executor="agent")
    client = owner.client()
    first = _claim(client, op.pk, "claim-once")
    assert first.status_code == 200, first.content
    token = first.json()["lease_token"]
    assert len(token) > 20
    # Neither the idempotency record nor any other column (journal, receipts, rejections,
    # sessions) holds the token, nor does any column hold the agent's API token in clear.
    assert _columns_holding(token) == []
    assert _columns_holding(owner.token) == []
    # Nor does an API token minted on /tokens/ land anywhere (its row, the audit, the session).
    admin = factories.console_user("admin")
    page_client = APIClient()
    page_client.force_login(admin.actor_user())
    page = page_client.post(
        "/tokens/", {"kind": "agent", "subject": "fresh-bot", "name": "t"}, format="multipart"
    )
    assert page.status_code == 200
    secret = page.content.decode().split('<code id="issued-secret">', 1)[1].split("<", 1)[0]
    assert secret.startswith("ac_")
    assert _columns_holding(secret) == []
    assert _columns_holding(secret.rsplit("_", 1)[1]) == []
    stored = IdempotentRequest.objects.get(key="claim-once").response_body
    assert stored["lease_token"] != token and "$derived" in stored["lease_token"]
    # The replay answers the same token, and that token is the lease's.
    replay = _claim(client, op.pk, "claim-once")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    beat = _heartbeat(client, op.pk, replay.json())
    assert beat.status_code == 200, beat.content
    done = post_json(
        client,
        f"/api/v1/operations/{op.pk}/complete",
        {
            "lease_generation": replay.json()["lease_generation"],
            "lease_token": replay.json()["lease_token"],
            "outcome": "succeeded",
            "result": {"ok": True},
        },
    )
    assert done.status_code == 200, done.content
    assert Operation.objects.get(pk=op.pk).status == "succeeded"
    assert _columns_holding(token) == []


def test_rotation_keeps_old_tokens_until_their_key_is_dropped():
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner), executor="agent")
    client = owner.client()
    with override_settings(LEASE_TOKEN_KEYS=["old-lease-key"]):
        body = _claim(client, op.pk, "claim-rotating").json()
    with override_settings(LEASE_TOKEN_KEYS=["new-lease-key", "old-lease-key"]):
        # The new key signs; the old one still verifies, and a replay still answers.
        assert _heartbeat(client, op.pk, body).status_code == 200
        replay = _claim(client, op.pk, "claim-rotating")
        assert replay.status_code == 200 and replay.json()["lease_token"] == body["lease_token"]
    with override_settings(LEASE_TOKEN_KEYS=["new-lease-key"]):
        assert_error(_heartbeat(client, op.pk, body), 409, "stale_lease")
        assert_error(_claim(client, op.pk, "claim-rotating"), 409, "stale_lease")
        # The dropped key's token no longer completes the work either.
        done = post_json(
            client,
            f"/api/v1/operations/{op.pk}/complete",
            {**{k: body[k] for k in ("lease_generation", "lease_token")}, "outcome": "succeeded"},
        )
        assert_error(done, 409, "stale_lease")
    assert Operation.objects.get(pk=op.pk).status == "running"
