"""Who is working on what, on the queue pages without a browser: Take, Hand over, Release and
comments on /approvals/ and /unresolved/, the "To do / Mine / All" views, escaped comments,
and the refusals (403 without the right, 400 for what cannot be read, CSRF) that change
nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime.models import Approval, Claim, Event, Resolution
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

HOSTILE = '<img src=x onerror="window.__xss=1">'


def _browser(role: str, csrf: bool = False) -> tuple[Client, factories.Principal]:
    person = factories.console_user(role)
    client = Client(enforce_csrf_checks=csrf)
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client, person


def _request(owner=None):
    owner = owner or factories.agent()
    task = factories.task(owner, name="pay supplier")
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a-1", "amount_cents": 25000}
    )
    return op, Approval.objects.get(operation=op)


def _act(client, queue, op, action, **form):
    return client.post(f"/work/{queue}/{op.pk}", {"action": action, **form})


def test_a_taken_request_leaves_the_others_to_do_and_shows_who_has_it_since_when():
    op, approval = _request()
    alice, alice_p = _browser("operator")
    bob, _ = _browser("operator")
    assert "Nobody has taken it" in bob.get("/approvals/").content.decode()
    taken = _act(alice, "approvals", op, "take", next="/approvals/?view=mine")
    assert (taken.status_code, taken["Location"]) == (302, "/approvals/?view=mine")
    mine = alice.get("/approvals/?view=mine").content.decode()
    assert approval.pk in mine and "You have it" in mine and ">Release<" in mine
    # Bob's "to do" (the default) no longer lists it; "All" does, naming the holder.
    todo = bob.get("/approvals/").content.decode()
    assert approval.pk not in todo and "every waiting request is taken" in todo
    everything = bob.get("/approvals/?view=all").content.decode()
    assert (
        approval.pk in everything
        and f'Taken by <span class="holder-name">{alice_p.actor.name}' in everything
    )
    assert "since <time" in everything and "back to everyone at" in everything
    # The live fragment follows the same view.
    assert approval.pk not in bob.get("/fragments/approvals").content.decode()
    assert approval.pk in bob.get("/fragments/approvals?view=all").content.decode()


def test_taking_what_another_holds_tells_who_and_changes_nothing():
    op, _ = _request()
    alice, alice_p = _browser("operator")
    bob, _ = _browser("operator")
    _act(alice, "approvals", op, "take")
    response = _act(bob, "approvals", op, "take")
    assert response.status_code == 302
    page = bob.get("/approvals/?view=all").content.decode()
    assert f"Nothing was changed on {op.pk}: {alice_p.actor.name} has it since" in page
    assert Claim.objects.get().holder_id == alice_p.actor.user_id


def test_the_holder_hands_it_over_then_the_receiver_releases_it():
    op = factories.unresolved_operation()
    sue, _ = _browser("support")
    sam, sam_p = _browser("support")
    _act(sue, "unresolved", op, "take")
    page = sue.get("/unresolved/").content.decode()
    assert f'<option value="{sam_p.actor.name}">' in page
    _act(sue, "unresolved", op, "give", to=sam_p.actor.name)
    assert Claim.objects.get().holder_id == sam_p.actor.user_id
    card = f'data-operation="{op.pk}"'
    assert card not in sue.get("/unresolved/").content.decode()
    assert card in sam.get("/unresolved/?view=mine").content.decode()
    _act(sam, "unresolved", op, "release")
    assert not Claim.objects.exists()
    assert card in sue.get("/unresolved/").content.decode()


def test_a_comment_is_shown_escaped_on_the_item_with_its_author():
    op = factories.unresolved_operation()
    sue, sue_p = _browser("support")
    _act(sue, "unresolved", op, "comment", text=f"called them {HOSTILE}")
    event = Event.objects.get(operation=op, type="comment.added")
    assert event.actor == sue_p.actor.label
    page = sue.get("/unresolved/").content.decode()
    assert HOSTILE not in page and "called them &lt;img src=x" in page
    assert f'<span class="who">{sue_p.actor.label}</span>' in page and "Comments (1)" in page


def test_an_operator_comments_on_a_request_and_support_staff_see_it_but_cannot():
    op, _ = _request()
    olga, _ = _browser("operator")
    sue, _ = _browser("support")
    _act(olga, "approvals", op, "comment", text="asked finance")
    page = sue.get("/approvals/").content.decode()
    assert "asked finance" in page and 'value="comment"' not in page
    assert _act(sue, "approvals", op, "comment", text="me too").status_code == 403
    assert _act(sue, "approvals", op, "take").status_code == 403
    assert Event.objects.filter(type="comment.added").count() == 1
    assert not Claim.objects.exists()


def test_an_operator_may_not_take_an_unresolved_operation():
    op = factories.unresolved_operation()
    olga, _ = _browser("operator")
    assert 'value="take"' not in olga.get("/unresolved/").content.decode()
    assert _act(olga, "unresolved", op, "take").status_code == 403
    assert not Claim.objects.exists()


@pytest.mark.parametrize(
    ("queue", "form"),
    [
        ("elsewhere", {"action": "take"}),
        ("unresolved", {"action": "steal"}),
        ("unresolved", {"action": "comment", "text": "a\x00b"}),
        ("unresolved", {"action": "give", "to": ""}),
    ],
)
def test_what_cannot_be_read_is_a_400_and_changes_nothing(queue, form):
    op = factories.unresolved_operation()
    sue, _ = _browser("support")
    before = Event.objects.count()
    response = sue.post(f"/work/{queue}/{op.pk}", form)
    # A refusal the page reports (the give without a person) comes back as a message.
    assert response.status_code in (400, 302)
    if response.status_code == 302:
        assert "choose the person" in sue.get("/unresolved/").content.decode()
    assert not Claim.objects.exists() and Event.objects.count() == before


def test_an_unknown_view_is_a_400_that_says_which_views_exist():
    _request()
    olga, _ = _browser("operator")
    page = olga.get("/approvals/?view=someone")
    assert page.status_code == 400 and "“view” is one of todo" in page.content.decode()
    assert olga.get("/unresolved/?view=someone").status_code == 400


def test_the_actions_need_the_csrf_token():
    op = factories.unresolved_operation()
    sue, _ = _browser("support", csrf=True)
    assert _act(sue, "unresolved", op, "take").status_code in (403, 303)
    assert not Claim.objects.exists()


def test_alike_unresolved_operations_are_grouped_and_settled_together_with_the_evidence():
    owner = factories.agent()
    task = factories.task(owner, "tell the customers")
    ops = [factories.unresolved_operation(owner, task) for _ in range(3)]
    sue, sue_p = _browser("support")
    page = sue.get("/unresolved/").content.decode()
    assert 'data-group-size="3"' in page and "3 alike · demo.notify" in page
    for op in ops:
        assert f'value="{op.pk}|{op.state_version}" checked' in page
    response = sue.post(
        "/unresolved/bulk",
        {
            "selected": [f"{op.pk}|{op.state_version}" for op in ops[:2]],
            "resolution": "no_effect",
            "evidence": "provider log: <b>nothing</b> sent",
        },
    )
    assert response.status_code == 302
    settled = Resolution.objects.filter(operation__in=ops)
    assert sorted(r.operation_id for r in settled) == sorted(op.pk for op in ops[:2])
    assert {(r.actor, r.evidence) for r in settled} == {
        (sue_p.actor.label, "provider log: <b>nothing</b> sent")
    }
    page = sue.get("/unresolved/").content.decode()
    assert f"Resolved {ops[0].pk} (mark no effect)" in page
    # One left is no group.
    assert "data-group-size" not in page


def test_an_operator_cannot_settle_a_group():
    owner = factories.agent()
    task = factories.task(owner)
    ops = [factories.unresolved_operation(owner, task) for _ in range(2)]
    olga, _ = _browser("operator")
    assert "Settle together" not in olga.get("/unresolved/").content.decode()
    response = olga.post(
        "/unresolved/bulk",
        {
            "selected": [f"{op.pk}|{op.state_version}" for op in ops],
            "resolution": "no_effect",
            "evidence": "x",
        },
    )
    assert response.status_code == 403 and not Resolution.objects.exists()
