"""Who is working on what (issue 39): taking an item of a people's queue, handing it over,
releasing it, its return after CLAIM_RETURN_MINUTES, comments journalled with their actor, and
refusals that change nothing; two people taking the same item at once on real concurrent
PostgreSQL transactions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from runtime import approvals, resolutions, worklist
from runtime.errors import Conflict, InvalidInput, NotAuthorized, NotFound
from runtime.models import Approval, Claim, Event
from runtime.selectors.worklist import claims_live, comments_of, in_view, people_for
from tests import factories
from tests.concurrency import barrier_at, in_thread

APPROVALS, UNRESOLVED = "approvals", "unresolved"


def _request():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a-1", "amount_cents": 25000}
    )
    assert Approval.objects.filter(operation=op, status="pending").exists()
    return op


def _journal(op, type_):
    return list(Event.objects.filter(operation=op, type=type_).values_list("actor", "data"))


@pytest.mark.django_db
def test_taking_an_item_journals_it_and_takes_it_out_of_the_others_to_do():
    op = _request()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    claim = worklist.claim_take(alice.actor, APPROVALS, op.pk)
    assert claim.holder_id == alice.actor.user_id and claim.given_by == ""
    [(actor, data)] = _journal(op, worklist.TAKEN)
    assert actor == alice.actor.label and data["holder"] == alice.actor.name
    live = claims_live(APPROVALS, [op.pk], timezone.now())[op.pk]
    assert not in_view("todo", live, bob.actor) and in_view("all", live, bob.actor)
    assert in_view("todo", live, alice.actor) and in_view("mine", live, alice.actor)
    assert not in_view("mine", None, alice.actor) and in_view("todo", None, bob.actor)


@pytest.mark.django_db
def test_a_second_taker_is_refused_naming_the_holder_and_nothing_changes():
    op = _request()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    first = worklist.claim_take(alice.actor, APPROVALS, op.pk)
    with pytest.raises(worklist.ItemTaken, match=alice.actor.name) as refused:
        worklist.claim_take(bob.actor, APPROVALS, op.pk)
    assert refused.value.status == 409
    assert list(Claim.objects.values_list("holder_id", "taken_at")) == [
        (alice.actor.user_id, first.taken_at)
    ]
    assert len(_journal(op, worklist.TAKEN)) == 1


@pytest.mark.django_db
def test_the_holder_hands_it_over_and_the_receiver_may_release_it():
    op = factories.unresolved_operation()
    sue, sam = factories.console_user("support"), factories.console_user("support")
    worklist.claim_take(sue.actor, UNRESOLVED, op.pk)
    given = worklist.claim_give(sue.actor, UNRESOLVED, op.pk, to=sam.actor.name)
    assert (given.holder_id, given.given_by) == (sam.actor.user_id, sue.actor.label)
    [(actor, data)] = _journal(op, worklist.GIVEN)
    assert actor == sue.actor.label and data["holder"] == sam.actor.name
    # The giver holds it no more: releasing is the receiver's.
    with pytest.raises(worklist.NotHolder):
        worklist.claim_release(sue.actor, UNRESOLVED, op.pk)
    worklist.claim_release(sam.actor, UNRESOLVED, op.pk)
    assert not Claim.objects.exists()
    assert [a for a, _ in _journal(op, worklist.RELEASED)] == [sam.actor.label]


@pytest.mark.django_db
def test_an_item_is_handed_only_to_a_person_who_may_work_it():
    op = factories.unresolved_operation()
    sue, olga = factories.console_user("support"), factories.console_user("operator")
    admin = factories.console_user("admin")
    worklist.claim_take(sue.actor, UNRESOLVED, op.pk)
    with pytest.raises(InvalidInput, match="may not work"):
        worklist.claim_give(sue.actor, UNRESOLVED, op.pk, to=olga.actor.name)
    with pytest.raises(InvalidInput, match="no active person"):
        worklist.claim_give(sue.actor, UNRESOLVED, op.pk, to="nobody-at-all")
    assert Claim.objects.get().holder_id == sue.actor.user_id
    assert not _journal(op, worklist.GIVEN)
    names = [name for _, name in people_for(UNRESOLVED)]
    assert sue.actor.name in names and admin.actor.name in names and olga.actor.name not in names


@pytest.mark.django_db
def test_someone_elses_item_cannot_be_handed_over_or_released_by_another():
    op = _request()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    worklist.claim_take(alice.actor, APPROVALS, op.pk)
    with pytest.raises(worklist.ItemTaken):
        worklist.claim_give(bob.actor, APPROVALS, op.pk, to=bob.actor.name)
    with pytest.raises(worklist.NotHolder):
        worklist.claim_release(bob.actor, APPROVALS, op.pk)
    assert Claim.objects.get().holder_id == alice.actor.user_id


@pytest.mark.django_db
def test_a_forgotten_item_returns_after_the_set_time_and_another_may_take_it(settings):
    settings.CLAIM_RETURN_MINUTES = 30
    op = _request()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    worklist.claim_take(alice.actor, APPROVALS, op.pk)
    Claim.objects.update(taken_at=timezone.now() - timedelta(minutes=29))
    assert op.pk in claims_live(APPROVALS, [op.pk], timezone.now())
    with pytest.raises(worklist.ItemTaken):
        worklist.claim_take(bob.actor, APPROVALS, op.pk)
    Claim.objects.update(taken_at=timezone.now() - timedelta(minutes=31))
    assert claims_live(APPROVALS, [op.pk], timezone.now()) == {}
    # Returned: the forgetful holder releases nothing, and someone else takes it.
    with pytest.raises(worklist.NotHolder):
        worklist.claim_release(alice.actor, APPROVALS, op.pk)
    worklist.claim_take(bob.actor, APPROVALS, op.pk)
    assert Claim.objects.get().holder_id == bob.actor.user_id


@pytest.mark.django_db
def test_taking_ones_own_item_again_renews_it():
    op = _request()
    alice = factories.console_user("operator")
    worklist.claim_take(alice.actor, APPROVALS, op.pk)
    old = timezone.now() - timedelta(minutes=20)
    Claim.objects.update(taken_at=old)
    assert worklist.claim_take(alice.actor, APPROVALS, op.pk).taken_at > old
    assert Claim.objects.count() == 1


@pytest.mark.django_db
def test_a_comment_is_journalled_with_its_actor_and_read_back_on_the_item():
    op = factories.unresolved_operation()
    sue = factories.console_user("support")
    hostile = "<script>alert(1)</script>\r\nchecked the ledger"
    event = worklist.comment_add(sue.actor, UNRESOLVED, op.pk, text=hostile)
    assert event.actor == sue.actor.label and event.task_id == op.task_id
    [read] = comments_of([op.pk])[op.pk]
    # Kept as written (escaping is the page's): only the textarea's CRLF becomes LF.
    assert read.data["text"] == "<script>alert(1)</script>\nchecked the ledger"


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["", "   ", "x" * (worklist.MAX_COMMENT + 1), "a\x00b"])
def test_a_blank_oversized_or_unstorable_comment_is_refused_and_nothing_is_written(text):
    op = factories.unresolved_operation()
    sue = factories.console_user("support")
    with pytest.raises(InvalidInput) as refused:
        worklist.comment_add(sue.actor, UNRESOLVED, op.pk, text=text)
    assert refused.value.status == 400
    assert comments_of([op.pk])[op.pk] == []


@pytest.mark.django_db
@pytest.mark.parametrize(("role", "queue"), [("support", APPROVALS), ("operator", UNRESOLVED)])
def test_those_without_the_right_are_refused_and_nothing_changes(role, queue):
    op = _request() if queue == APPROVALS else factories.unresolved_operation()
    person = factories.console_user(role)
    before = Event.objects.count()
    for attempt in (
        lambda: worklist.claim_take(person.actor, queue, op.pk),
        lambda: worklist.claim_give(person.actor, queue, op.pk, to=person.actor.name),
        lambda: worklist.claim_release(person.actor, queue, op.pk),
        lambda: worklist.comment_add(person.actor, queue, op.pk, text="mine now"),
    ):
        with pytest.raises(NotAuthorized) as refused:
            attempt()
        assert refused.value.status == 403
    assert not Claim.objects.exists() and Event.objects.count() == before


@pytest.mark.django_db
def test_an_agent_and_an_unseen_or_settled_item_are_refused():
    op = _request()
    alice = factories.console_user("operator")
    with pytest.raises(NotAuthorized):
        worklist.claim_take(factories.agent().actor, APPROVALS, op.pk)
    with pytest.raises(NotFound):
        worklist.claim_take(alice.actor, APPROVALS, "op_nosuch")
    # An unresolved operation is not an approval request: nothing to take on the inbox.
    other = factories.unresolved_operation()
    with pytest.raises(Conflict, match="no longer waits"):
        worklist.claim_take(alice.actor, APPROVALS, other.pk)
    with pytest.raises(NotFound):
        worklist.comment_add(alice.actor, APPROVALS, other.pk, text="hm")
    with pytest.raises(InvalidInput):
        worklist.claim_take(alice.actor, "elsewhere", op.pk)
    assert not Claim.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_people_taking_the_same_item_at_once_exactly_one_wins():
    op = _request()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    # Both have found the item unheld before either inserts: only the unique key decides.
    with barrier_at("worklist.unheld", 2):
        racers = [
            in_thread(
                lambda who=who: worklist.claim_take(who.actor, APPROVALS, op.pk), who.actor.name
            )
            for who in (alice, bob)
        ]
        for thread, _ in racers:
            thread.join(30)
    outcomes = []
    for _, future in racers:
        try:
            outcomes.append(future.result(timeout=1).holder_id)
        except worklist.ItemTaken as exc:
            outcomes.append(exc.code)
    assert sorted(map(str, outcomes)).count("item_taken") == 1
    [winner] = [o for o in outcomes if o != "item_taken"]
    assert list(Claim.objects.values_list("holder_id", flat=True)) == [winner]
    assert len(_journal(op, worklist.TAKEN)) == 1


@pytest.mark.django_db
def test_an_edited_request_stays_the_same_item_with_its_holder_and_comments():
    op = _request()
    alice = factories.console_user("operator")
    worklist.claim_take(alice.actor, APPROVALS, op.pk)
    worklist.comment_add(alice.actor, APPROVALS, op.pk, text="amount looks high")
    old = Approval.objects.get(operation=op, status="pending")
    new = approvals.approval_edit(
        alice.actor, old.pk, params={"account": "a-1", "amount_cents": 20000}, reason="lower"
    )
    assert new.pk != old.pk and new.operation_id == op.pk
    assert op.pk in claims_live(APPROVALS, [op.pk], timezone.now())
    assert [e.data["text"] for e in comments_of([op.pk])[op.pk]] == ["amount looks high"]


@pytest.mark.django_db
def test_a_settled_item_can_no_longer_be_taken_but_still_takes_a_comment():
    op = factories.unresolved_operation()
    sue = factories.console_user("support")
    worklist.claim_take(sue.actor, UNRESOLVED, op.pk)
    resolutions.operation_resolve(
        sue.actor, op.pk, resolution="no_effect", evidence="checked", state_version=op.state_version
    )
    with pytest.raises(Conflict, match="no longer waits") as refused:
        worklist.claim_take(sue.actor, UNRESOLVED, op.pk)
    assert refused.value.code == "item_settled"
    # A note on what was decided is still welcome.
    worklist.comment_add(sue.actor, UNRESOLVED, op.pk, text="settled: no effect")


@pytest.mark.django_db
def test_an_item_held_by_someone_deactivated_is_everyones_again():
    op = _request()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    worklist.claim_take(alice.actor, APPROVALS, op.pk)
    get_user_model().objects.filter(pk=alice.actor.user_id).update(is_active=False)
    assert claims_live(APPROVALS, [op.pk], timezone.now()) == {}
    worklist.claim_take(bob.actor, APPROVALS, op.pk)
    assert Claim.objects.get().holder_id == bob.actor.user_id


@pytest.mark.django_db
def test_the_opening_entry_refuses_a_callers_transaction_and_the_txn_one_rolls_back_with_it():
    op = _request()
    alice = factories.console_user("operator")
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        worklist.claim_take(alice.actor, APPROVALS, op.pk)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        worklist.claim_take_txn(alice.actor, APPROVALS, op.pk)
        worklist.comment_add_txn(alice.actor, APPROVALS, op.pk, text="then it failed")
        1 / 0  # noqa: B018 (the caller fails after the take)
    assert not Claim.objects.exists() and comments_of([op.pk])[op.pk] == []
