"""The resolve endpoint's ``Idempotency-Key`` (issue 34): it runs outside one transaction (a
lookup asks the receiver), so it writes its key's record before it runs; that write now takes
the key's advisory lock, as every request run in one commit does. Before, a resolve could take a
key while a request in one commit held it (that request writes its record only with its
response): both acted under one key, and the holder's record insert failed (500). Real
concurrent requests, each held at a named crash point while the other arrives."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime.models import IdempotentRequest, Operation, Resolution, Task
from tests import factories
from tests.api.support import assert_error
from tests.concurrency import gate_at, in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

KEY = "one-key"


def _resolve(person: factories.Principal, op: Operation, body: dict[str, Any]) -> Any:
    return person.client().post(
        f"/api/v1/operations/{op.pk}/resolve",
        {"state_version": op.state_version, **body},
        format="json",
        HTTP_IDEMPOTENCY_KEY=KEY,
    )


def _cancel(person: factories.Principal, task: Task) -> Any:
    return person.client().post(
        f"/api/v1/tasks/{task.pk}/cancel",
        {"reason": "stop"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=KEY,
    )


NO_EFFECT = {"resolution": "no_effect", "evidence": "the receiver has no record"}
SUCCEEDED = {"resolution": "succeeded", "evidence": "the customer confirmed"}


def test_a_resolve_while_a_request_in_one_commit_holds_the_key_is_refused_and_no_500():
    """The cancel holds the key (its request's transaction, no record yet); the resolve under the
    same key is refused at once. Before: the resolve ran (200) and the cancel's commit failed on
    the key's unique record (an IntegrityError: 500), one key having carried two requests."""
    admin, owner = factories.console_user("admin"), factories.agent()
    op = factories.unresolved_operation(owner)
    task = factories.task(owner)
    with gate_at("cancel.after_lock", "holder") as gate:
        holder, held = in_thread(lambda: _cancel(admin, task), "holder")
        assert gate.reached.wait(30), "the cancel never reached its lock"
        assert_error(_resolve(admin, op, NO_EFFECT), 409, "request_in_progress")
        gate.release()
        holder.join(30)
    assert held.result(timeout=1).status_code == 202
    assert Operation.objects.get(pk=op.pk).status == "unresolved"
    assert not Resolution.objects.filter(operation=op).exists()
    (record,) = IdempotentRequest.objects.filter(key=KEY)
    assert record.path == f"/api/v1/tasks/{task.pk}/cancel"
    # The key is the cancel's: it replays, and the resolve under it is another request.
    replay = _cancel(admin, task)
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"
    assert_error(_resolve(admin, op, NO_EFFECT), 422, "idempotency_key_reused")


def test_a_request_in_one_commit_while_a_resolve_holds_the_key_is_refused():
    admin, owner = factories.console_user("admin"), factories.agent()
    op = factories.unresolved_operation(owner)
    task = factories.task(owner)
    with gate_at("resolve.before_lock", "holder") as gate:
        holder, held = in_thread(lambda: _resolve(admin, op, NO_EFFECT), "holder")
        assert gate.reached.wait(30), "the resolve never reached its transaction"
        assert_error(_cancel(admin, task), 422, "idempotency_key_reused")
        gate.release()
        holder.join(30)
    assert held.result(timeout=1).status_code == 200
    assert Task.objects.get(pk=task.pk).cancellation == "none"
    assert Resolution.objects.filter(operation=op).count() == 1


def test_two_resolves_with_one_key_and_two_bodies_one_acts_the_other_is_refused():
    support = factories.console_user("support")
    op = factories.unresolved_operation()
    with gate_at("resolve.before_lock", "holder") as gate:
        holder, held = in_thread(lambda: _resolve(support, op, NO_EFFECT), "holder")
        assert gate.reached.wait(30), "the resolve never reached its transaction"
        assert_error(_resolve(support, op, SUCCEEDED), 422, "idempotency_key_reused")
        gate.release()
        holder.join(30)
    assert held.result(timeout=1).status_code == 200
    assert Operation.objects.get(pk=op.pk).status == "failed"  # no effect: the first body
    assert Resolution.objects.filter(operation=op).count() == 1


def test_resolves_with_one_key_at_once_never_answer_500():
    """Six at once, two bodies: exactly one acts; the others are refused with the contract's
    409 or 422 (or, once the first finished with the same body, replay its response)."""
    support = factories.console_user("support")
    op = factories.unresolved_operation()
    start = threading.Barrier(6, timeout=30)
    bodies = [NO_EFFECT, SUCCEEDED] * 3

    def send(body: dict[str, Any]) -> tuple[dict[str, Any], int, Any]:
        start.wait()
        response = _resolve(support, op, body)
        return body, response.status_code, response

    racers = [in_thread(lambda b=b: send(b), f"racer-{n}") for n, b in enumerate(bodies)]
    for thread, _ in racers:
        thread.join(60)
    answers = [future.result(timeout=1) for _, future in racers]
    acted = [(body, r) for body, status, r in answers if status == 200]
    assert acted, answers
    first = acted[0][0]
    for body, status, response in answers:
        if status == 200:
            assert body == first  # the others with 200 replayed the one that acted
        elif status == 409:
            assert response.json()["error"]["code"] == "request_in_progress"
        else:
            assert_error(response, 422, "idempotency_key_reused")
    assert Resolution.objects.filter(operation=op).count() == 1


def test_the_same_resolve_twice_at_once_resolves_once_and_the_replay_is_the_stored_answer():
    support = factories.console_user("support")
    op = factories.unresolved_operation()
    with gate_at("resolve.before_lock", "holder") as gate:
        holder, held = in_thread(lambda: _resolve(support, op, NO_EFFECT), "holder")
        assert gate.reached.wait(30), "the resolve never reached its transaction"
        assert_error(_resolve(support, op, NO_EFFECT), 409, "request_in_progress")
        gate.release()
        holder.join(30)
    first = held.result(timeout=1)
    assert first.status_code == 200
    replay = _resolve(support, op, NO_EFFECT)
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    assert Resolution.objects.filter(operation=op).count() == 1
