"""Who is working on what, over the API (/api/v1/queues/{queue}/items/{id}): the same services as
the console's forms, the same rights (runtime.policy.can_work_on), the error format, and an
Idempotency-Key that replays a comment instead of writing it twice."""

from __future__ import annotations

import pytest

from runtime.models import Claim, Event
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _item(op, action=""):
    return f"/api/v1/queues/unresolved/items/{op.pk}" + (f"/{action}" if action else "")


def test_support_takes_hands_over_and_reads_an_item_with_its_comments():
    op = factories.unresolved_operation()
    sue, sam = factories.console_user("support"), factories.console_user("support")
    taken = sue.client().post(_item(op, "take"), format="json")
    assert taken.status_code == 200, taken.content
    assert taken.json()["holder"] == sue.actor.name and taken.json()["returns_at"]
    refused = sam.client().post(_item(op, "take"), format="json")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "item_taken"
    assert sue.actor.name in refused.json()["error"]["message"]
    given = sue.client().post(_item(op, "give"), {"to": sam.actor.name}, format="json")
    assert (given.json()["holder"], given.json()["given_by"]) == (sam.actor.name, sue.actor.label)
    said = sam.client().post(_item(op, "comments"), {"text": "<b>on it</b>"}, format="json")
    assert said.status_code == 201 and said.json()["actor"] == sam.actor.label
    read = factories.console_user("operator").client().get(_item(op)).json()
    assert read["holder"] == sam.actor.name
    assert [c["text"] for c in read["comments"]] == ["<b>on it</b>"]
    released = sam.client().post(_item(op, "release"), format="json")
    assert released.status_code == 200 and released.json()["holder"] is None


def test_a_comment_sent_twice_under_one_key_is_written_once():
    op = factories.unresolved_operation()
    sue = factories.console_user("support")
    headers = {"HTTP_IDEMPOTENCY_KEY": "comment-1"}
    first = sue.client().post(_item(op, "comments"), {"text": "once"}, format="json", **headers)
    again = sue.client().post(_item(op, "comments"), {"text": "once"}, format="json", **headers)
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json() == again.json()
    assert Event.objects.filter(operation=op, type="comment.added").count() == 1


@pytest.mark.parametrize("action", ["take", "release", "comments"])
def test_the_agent_and_an_operator_are_refused_and_nothing_changes(action):
    owner = factories.agent()
    op = factories.unresolved_operation(owner)
    before = Event.objects.count()
    for who in (owner, factories.console_user("operator")):
        response = who.client().post(_item(op, action), {"text": "x"}, format="json")
        assert response.status_code == 403, response.content
        assert set(response.json()) == {"error"}
    assert owner.client().get(_item(op)).status_code == 403
    assert not Claim.objects.exists() and Event.objects.count() == before


def test_an_unknown_queue_or_a_blank_comment_is_a_400():
    op = factories.unresolved_operation()
    sue = factories.console_user("support")
    elsewhere = f"/api/v1/queues/elsewhere/items/{op.pk}/take"
    assert sue.client().post(elsewhere, format="json").status_code == 400
    blank = sue.client().post(_item(op, "comments"), {"text": "  "}, format="json")
    assert blank.status_code == 400 and blank.json()["error"]["code"] == "invalid_input"
    assert not Claim.objects.exists()
