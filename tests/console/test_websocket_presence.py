"""Presence over Channels (issue 39), through the real ASGI stack with channels' test
communicator: two people on the same queue page each hear of the other by name, and of the
other's leaving; the card each is on; a page that vanished without a disconnect drops out; and
one who does not work the queue is refused, never recorded and never told."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from runtime.models import Presence
from tests import factories
from tests.console.test_websocket_auth import TIMEOUT, refusal, run, session_for, socket

pytestmark = [pytest.mark.postgres]


async def people(comm: WebsocketCommunicator) -> list[dict[str, Any]]:
    message = await comm.receive_json_from(timeout=TIMEOUT)
    assert message["type"] == "presence", message
    return list(message["people"])


async def opened(path: str, client: Any) -> WebsocketCommunicator:
    comm = socket(path, client)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


def test_two_people_on_the_inbox_see_each_other_then_one_leaves(transactional_db):
    alice = factories.console_user("operator", "alice")
    bob = factories.console_user("operator", "bob")
    alice_session, bob_session = session_for("alice"), session_for("bob")

    async def scenario() -> None:
        a = await opened("/ws/presence/approvals/", alice_session)
        try:
            assert await people(a) == []
            b = await opened("/ws/presence/approvals/", bob_session)
            try:
                assert await people(b) == [{"name": "alice", "items": []}]
                assert await people(a) == [{"name": "bob", "items": []}]
                # Bob is on a card: alice's list says which.
                await b.send_json_to({"type": "looking", "item": "op_card1"})
                assert await people(a) == [{"name": "bob", "items": ["op_card1"]}]
            finally:
                await b.disconnect()
            assert await people(a) == []
        finally:
            await a.disconnect()

    run(scenario)
    assert not Presence.objects.filter(user_id__in=[alice.actor.user_id, bob.actor.user_id])


def test_a_page_that_vanished_without_a_word_drops_out_after_presence_seconds(
    transactional_db, settings
):
    # Long enough that connecting on a loaded machine cannot outlast it, short for a test.
    settings.PRESENCE_SECONDS = 5
    factories.console_user("operator", "bob")
    carol = factories.console_user("operator", "carol")
    bob_session = session_for("bob")

    def carol_vanished() -> None:
        # Carol's tab was killed: her page's row stays, and no disconnect will ever remove it.
        Presence.objects.create(
            user_id=carol.actor.user_id,
            place="approvals",
            connection="gone",
            seen_at=timezone.now(),
        )

    async def scenario() -> None:
        await database_sync_to_async(carol_vanished)()
        b = await opened("/ws/presence/approvals/", bob_session)
        try:
            assert await people(b) == [{"name": "carol", "items": []}]
            # Bob's own beats reread the list: carol leaves it once her row is too old.
            message = await b.receive_json_from(timeout=6 * TIMEOUT)
            assert message == {"type": "presence", "people": []}
        finally:
            await b.disconnect()

    run(scenario)


def test_one_who_does_not_work_the_queue_is_refused_unrecorded_and_untold(transactional_db):
    factories.console_user("operator", "olga")
    factories.console_user("support", "sam")
    olga_session, sam_session = session_for("olga"), session_for("sam")

    async def scenario() -> tuple[int, int, int, list[Presence]]:
        o = await opened("/ws/presence/approvals/", olga_session)
        try:
            assert await people(o) == []
            refused = await refusal(socket("/ws/presence/approvals/", sam_session))
            nowhere = await refusal(socket("/ws/presence/tasks/", olga_session))
            anonymous = await refusal(socket("/ws/presence/approvals/"))
            # A valid session from a foreign page is refused at the handshake (the origin check).
            foreign = socket("/ws/presence/approvals/", olga_session, origin=b"http://evil.example")
            connected, _ = await foreign.connect(timeout=TIMEOUT)
            await foreign.disconnect()
            assert connected is False
            # Neither recorded anything: olga is told of nobody.
            assert await o.receive_nothing(timeout=0.5)
            sam_rows = await database_sync_to_async(
                lambda: list(Presence.objects.filter(user__username="sam"))
            )()
            return refused, nowhere, anonymous, sam_rows
        finally:
            await o.disconnect()

    assert run(scenario) == (4403, 4404, 4401, [])
