"""Presence (issue 39): who else has a people's queue page open. Each open page is recorded
with the right to work the queue, refreshed, and removed when it closes; one not heard of for
PRESENCE_SECONDS drops out by itself; the list is told only to those who work the queue, and
names only them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from runtime.errors import Conflict, InvalidInput, NotAuthorized, NotFound
from runtime.models import Presence
from runtime.presence import presence_leave, presence_record
from runtime.selectors.presence import Present, present_others
from tests import factories

APPROVALS, UNRESOLVED = "approvals", "unresolved"


def _names(actor, place=APPROVALS):
    return [p.name for p in present_others(actor, place, timezone.now())]


@pytest.mark.django_db
def test_each_sees_the_others_on_the_same_page_and_a_closed_page_leaves():
    alice, bob, carol = (
        factories.console_user("operator", name) for name in ("alice", "bob", "carol")
    )
    assert presence_record(alice.actor, APPROVALS, "chan-a") is True
    assert presence_record(bob.actor, APPROVALS, "chan-b") is True
    assert _names(alice.actor) == ["bob"]
    assert _names(bob.actor) == ["alice"]
    # Not there herself, carol still reads who is: by name.
    assert _names(carol.actor) == ["alice", "bob"]
    # Another queue's page is another place.
    admin = factories.console_user("admin", "dora")
    presence_record(admin.actor, UNRESOLVED, "chan-d")
    assert _names(carol.actor) == ["alice", "bob"]
    assert _names(factories.console_user("support").actor, UNRESOLVED) == ["dora"]
    assert _names(admin.actor) == ["alice", "bob"]
    # Saying it again is no change for the others.
    assert presence_record(alice.actor, APPROVALS, "chan-a") is False
    assert presence_leave(bob.actor, "chan-b") is True
    assert _names(alice.actor) == []
    assert presence_leave(bob.actor, "chan-b") is False


@pytest.mark.django_db
def test_a_person_with_two_pages_open_stays_until_the_last_one_closes():
    alice, bob = factories.console_user("operator", "alice"), factories.console_user("operator")
    presence_record(alice.actor, APPROVALS, "tab-1")
    presence_record(alice.actor, APPROVALS, "tab-2")
    assert _names(bob.actor) == ["alice"]
    presence_leave(alice.actor, "tab-1")
    assert _names(bob.actor) == ["alice"]
    presence_leave(alice.actor, "tab-2")
    assert _names(bob.actor) == []


@pytest.mark.django_db
def test_a_page_not_heard_of_for_presence_seconds_drops_out_and_is_cleared(settings):
    settings.PRESENCE_SECONDS = 30
    alice, bob = factories.console_user("operator", "alice"), factories.console_user("operator")
    presence_record(alice.actor, APPROVALS, "chan-a")
    presence_record(bob.actor, APPROVALS, "chan-b")
    # Alice's tab was killed: nothing said she left, and her last word is 31 s old.
    Presence.objects.filter(connection="chan-a").update(
        seen_at=timezone.now() - timedelta(seconds=31)
    )
    assert _names(bob.actor) == []
    # Bob's next beat clears the expired row; alice's page coming back is an arrival.
    assert presence_record(bob.actor, APPROVALS, "chan-b") is False
    assert not Presence.objects.filter(connection="chan-a").exists()
    assert presence_record(alice.actor, APPROVALS, "chan-a") is True
    assert _names(bob.actor) == ["alice"]
    # Within the lifetime a page counts.
    Presence.objects.filter(connection="chan-a").update(
        seen_at=timezone.now() - timedelta(seconds=20)
    )
    assert _names(bob.actor) == ["alice"]


@pytest.mark.django_db
def test_one_who_does_not_work_the_queue_is_neither_recorded_nor_told():
    operator = factories.console_user("operator", "olga")
    support = factories.console_user("support", "sam")
    presence_record(operator.actor, APPROVALS, "chan-o")
    with pytest.raises(NotAuthorized):
        presence_record(support.actor, APPROVALS, "chan-s")
    assert not Presence.objects.filter(connection="chan-s").exists()
    with pytest.raises(NotAuthorized):
        present_others(support.actor, APPROVALS, timezone.now())
    agent = factories.agent()
    with pytest.raises(NotAuthorized):
        presence_record(agent.actor, APPROVALS, "chan-agent")
    with pytest.raises(NotFound):
        presence_record(operator.actor, "tasks", "chan-x")
    assert list(Presence.objects.values_list("connection", flat=True)) == ["chan-o"]


@pytest.mark.django_db
def test_roles_are_read_now_one_who_lost_the_right_is_not_listed_nor_told():
    alice, bob = factories.console_user("operator", "alice"), factories.console_user("operator")
    presence_record(alice.actor, APPROVALS, "chan-a")
    presence_record(bob.actor, APPROVALS, "chan-b")
    users = get_user_model().objects
    users.get(username="alice").groups.clear()
    # Her row is still there (her socket closes at its next recheck), but her name is not shown,
    # and she is told nothing.
    assert _names(bob.actor) == []
    with pytest.raises(NotAuthorized):
        present_others(alice.actor, APPROVALS, timezone.now())
    with pytest.raises(NotAuthorized):
        presence_record(alice.actor, APPROVALS, "chan-a")
    users.filter(username=bob.actor.name).update(is_active=False)
    carol = factories.console_user("operator")
    assert _names(carol.actor) == []


@pytest.mark.django_db
def test_the_card_each_page_is_on_is_listed_with_its_person():
    alice, bob = factories.console_user("operator", "alice"), factories.console_user("operator")
    presence_record(alice.actor, APPROVALS, "tab-1", item="op_1")
    presence_record(alice.actor, APPROVALS, "tab-2")
    now = timezone.now()
    assert present_others(bob.actor, APPROVALS, now) == [
        Present(alice.actor.user_id, "alice", ("op_1",))
    ]
    # Moving to another card is a change for the others; staying on it, or a beat (None), is not.
    assert presence_record(alice.actor, APPROVALS, "tab-2", item="op_2") is True
    assert presence_record(alice.actor, APPROVALS, "tab-2", item="op_2") is False
    assert presence_record(alice.actor, APPROVALS, "tab-2") is False
    [seen] = present_others(bob.actor, APPROVALS, timezone.now())
    assert seen.items == ("op_1", "op_2")
    assert presence_record(alice.actor, APPROVALS, "tab-1", item="") is True
    [seen] = present_others(bob.actor, APPROVALS, timezone.now())
    assert seen.items == ("op_2",)
    for bad in ("<b>op</b>", "op 1", "x" * 65, "op_\x00"):
        with pytest.raises(InvalidInput):
            presence_record(alice.actor, APPROVALS, "tab-1", item=bad)
    assert Presence.objects.get(connection="tab-1").item == ""


@pytest.mark.django_db
def test_a_page_is_one_persons_and_one_places():
    alice, bob = factories.console_user("operator", "alice"), factories.console_user("admin")
    presence_record(alice.actor, APPROVALS, "chan-a")
    with pytest.raises(Conflict):
        presence_record(bob.actor, APPROVALS, "chan-a")
    with pytest.raises(Conflict):
        presence_record(bob.actor, UNRESOLVED, "chan-a")
    # Nobody else's page is removed by their leaving.
    assert presence_leave(bob.actor, "chan-a") is False
    assert Presence.objects.get(connection="chan-a").user_id == alice.actor.user_id
    with pytest.raises(InvalidInput):
        presence_record(bob.actor, APPROVALS, "")
