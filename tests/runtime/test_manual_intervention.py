"""Work a machine stopped for a person (``manual_intervention``) is no dead end (issue 34): support
staff see it on /unresolved/ with why, and settle it through the resolve service and endpoint:
``requeue`` (back to ``pending`` under the same key once the cause is gone: it runs again) or
``abandon`` (ended with a reason; where a call may have had an effect the status writer hands it
to ``unresolved`` instead). Each is a guarded transition, audited with the person."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client

from runtime.errors import Conflict
from runtime.executions import execution_for_agent
from runtime.models import BudgetMeter, Event, Operation, OutboxMessage, Resolution, Task
from runtime.resolutions import ResolutionNotAllowed, operation_resolve, resolutions_allowed
from runtime.tools import adapters
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories
from tests.concurrency import barrier_at

pytestmark = [pytest.mark.django_db(transaction=True)]

RETIRED = "0-retired"


def _stopped(owner, task, **spec) -> Operation:
    """Proposed, recorded (as if) by an older deployment's adapter, and refused at the claim by
    a worker that does not support that version: ``manual_intervention``, with the reason."""
    op = factories.operation(owner, task, **{"tool": "demo.echo", "params": {"v": 1}, **spec})
    Operation.objects.filter(pk=op.pk).update(tool_version=RETIRED)
    refusal = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(refusal, Refusal)
    op.refresh_from_db()
    assert op.status == "manual_intervention", (op.status, op.status_reason)
    assert RETIRED in op.status_reason
    return op


def _post(who, op: Operation, resolution: str, evidence: str = ""):
    return who.client().post(
        f"/api/v1/operations/{op.pk}/resolve",
        {"resolution": resolution, "evidence": evidence, "state_version": op.state_version},
        format="json",
    )


def _supported(monkeypatch, tool: str = "demo.echo") -> None:
    """The cause goes away: the running code supports the recorded version again."""
    adapter = adapters()[tool]
    monkeypatch.setattr(adapter, "supported_versions", (*adapter.supported_versions, RETIRED))


def test_requeue_puts_it_back_under_its_key_and_it_runs_and_succeeds(monkeypatch):
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner, budget={"cost_cents": 100})
    op = _stopped(owner, task, estimate={"cost_cents": 30})
    key = op.idempotency_key
    meter = BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter="cost_cents")
    assert meter.reserved == 0  # the stop released the proposal's hold

    # While the cause is there, requeueing would only stop it again: refused, nothing changed.
    assert resolutions_allowed(op) == ("abandon",)
    refused = _post(support, op, "requeue")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "resolution_not_allowed"
    assert Operation.objects.get(pk=op.pk).state_version == op.state_version

    _supported(monkeypatch)
    assert resolutions_allowed(op) == ("requeue", "abandon")
    response = _post(support, op, "requeue", "the worker runs the retired version again")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "pending"
    op.refresh_from_db()
    assert (op.status, op.idempotency_key) == ("pending", key)
    assert OutboxMessage.objects.filter(operation=op).exists()  # announced to the workers
    meter.refresh_from_db()
    assert meter.reserved == 30  # held again, as any admitted work
    event = Event.objects.filter(operation=op).latest("seq")
    assert (event.type, event.actor) == ("operation.requeued", support.actor.label)
    assert (event.data["from"], event.data["to"]) == ("manual_intervention", "pending")
    audit = Resolution.objects.get(operation=op)
    assert (audit.resolution, audit.from_status, audit.to_status, audit.actor) == (
        "requeue",
        "manual_intervention",
        "pending",
        support.actor.label,
    )

    factories.run_claimable(task.pk)
    op.refresh_from_db()
    assert op.status == "succeeded", (op.status, op.status_reason)
    assert op.idempotency_key == key


def test_abandon_ends_it_with_the_reason_and_the_person_in_the_journal():
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = _stopped(owner, task)

    missing = _post(support, op, "abandon")  # a reason is required
    assert missing.status_code == 400, missing.content
    agent = _post(owner, op, "abandon", "not mine to end")  # only support staff
    assert agent.status_code == 403, agent.content

    response = _post(support, op, "abandon", "the retired version is gone for good")
    assert response.status_code == 200, response.content
    op.refresh_from_db()
    assert op.status == "failed"
    assert op.error == {"kind": "abandoned", "message": "the retired version is gone for good"}
    assert "the retired version is gone for good" in op.status_reason
    event = Event.objects.filter(operation=op).latest("seq")
    assert (event.type, event.actor) == ("operation.abandoned", support.actor.label)
    assert (event.data["from"], event.data["to"]) == ("manual_intervention", "failed")
    audit = Resolution.objects.get(operation=op)
    assert (audit.resolution, audit.to_status, audit.evidence) == (
        "abandon",
        "failed",
        "the retired version is gone for good",
    )
    # Settled: a second resolution is refused, not applied.
    again = _post(support, op, "requeue")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "not_manual_intervention"
    task.refresh_from_db()
    assert task.condition == "runnable"  # nothing waits for a person any more


def test_abandoning_work_whose_call_may_have_had_an_effect_hands_it_to_unresolved():
    """A charge lost with its lease (the receiver may hold it), then stopped for a person at its
    re-dispatch: abandoning it does not end it ``failed``; the writer makes it ``unresolved``,
    where the person settles what happened with unresolved's choices."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 5}
    )
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    assert lease_expire_sweep(now=lease.lease_expires_at + timedelta(seconds=1)) == 1
    Operation.objects.filter(pk=op.pk).update(tool_version=RETIRED)
    assert isinstance(operation_claim(op.pk, execution_id=execution_for_agent("w2").pk), Refusal)
    op.refresh_from_db()
    assert op.status == "manual_intervention"

    response = _post(support, op, "abandon", "the order was withdrawn")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "unresolved"
    op.refresh_from_db()
    assert "the order was withdrawn" in op.status_reason and "unconfirmed" in op.status_reason
    assert Resolution.objects.get(operation=op).to_status == "unresolved"
    assert "no_effect" in resolutions_allowed(op)
    done = operation_resolve(
        support.actor,
        op.pk,
        resolution="no_effect",
        evidence="the receiver shows no charge",
        state_version=op.state_version,
    )
    assert done.status == "failed"


def test_work_whose_unconfirmed_call_could_be_repeated_cannot_be_requeued(monkeypatch):
    """A notification (no receiver contract: it neither dedupes nor answers lookups) whose call
    is unconfirmed: requeueing could notify twice, so only abandoning is offered and a requeue
    is refused; abandoning hands it to ``unresolved``."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = _stopped(owner, task, tool="demo.notify", params={"to": "c@x"})
    # As if a call of it had been made and lost before it was stopped for a person.
    Operation.objects.filter(pk=op.pk).update(attempts_used=1, lease_generation=1)
    op.invocations.create(number=1, lease_generation=1, started_at=op.created_at, outcome="lost")
    op.refresh_from_db()
    _supported(monkeypatch, "demo.notify")

    assert resolutions_allowed(op) == ("abandon",)
    with pytest.raises(ResolutionNotAllowed):
        operation_resolve(
            support.actor, op.pk, resolution="requeue", evidence="", state_version=op.state_version
        )
    assert Operation.objects.get(pk=op.pk).status == "manual_intervention"
    abandoned = operation_resolve(
        support.actor,
        op.pk,
        resolution="abandon",
        evidence="not needed",
        state_version=op.state_version,
    )
    assert abandoned.status == "unresolved"


def test_the_support_page_lists_work_stopped_for_a_person_with_why_and_its_actions():
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = _stopped(owner, task)
    browser = Client()
    assert browser.login(username=support.actor.name, password=factories.PASSWORD)

    page = browser.get("/unresolved/").content.decode()
    assert f'data-operation="{op.pk}"' in page
    assert "manual_intervention" in page
    assert RETIRED in page and "does not support" in page  # why
    assert "The cause is still there" in page
    assert 'value="abandon"' in page and 'value="requeue"' not in page

    posted = browser.post(
        f"/unresolved/{op.pk}/resolve",
        {"resolution": "abandon", "evidence": "retired", "state_version": op.state_version},
    )
    assert posted.status_code == 302
    assert Operation.objects.get(pk=op.pk).status == "failed"
    page = browser.get("/unresolved/").content.decode()
    assert f"operation {op.pk} (abandon): it is now failed, abandoned" in page  # the message
    assert f'data-operation="{op.pk}"' not in page  # no longer on the queue


@pytest.mark.postgres
def test_two_people_settling_it_at_once_one_wins_the_other_gets_409(monkeypatch):
    owner = factories.agent()
    first, second = factories.console_user("support"), factories.console_user("support")
    task = factories.task(owner)
    op = _stopped(owner, task)
    _supported(monkeypatch)
    answers: dict[str, tuple[int, dict]] = {}

    def settle(name: str, who, resolution: str) -> None:
        try:
            response = _post(who, op, resolution, f"{name} checked")
            answers[name] = (response.status_code, response.json())
        finally:
            connection.close()

    threads = [
        threading.Thread(target=settle, args=("a", first, "requeue")),
        threading.Thread(target=settle, args=("b", second, "abandon")),
    ]
    # Both read it at the same version before either takes its lock (forced by the barrier).
    with barrier_at("resolve.before_lock", 2):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    codes = sorted(code for code, _ in answers.values())
    assert codes == [200, 409], answers
    loser = next(body for code, body in answers.values() if code == 409)
    assert loser["error"]["code"] == "state_version_mismatch"
    winner = Resolution.objects.get(operation=op)
    assert Operation.objects.get(pk=op.pk).status == winner.to_status


def test_a_requeue_in_a_task_that_stopped_meanwhile_is_refused(monkeypatch):
    """The stop is decided under the task's lock: work of a stopped task is not re-admitted."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = _stopped(owner, task)
    _supported(monkeypatch)
    # As a stop that committed without reaching this operation (the cancel settles it too).
    Task.objects.filter(pk=task.pk).update(cancellation="requested")
    with pytest.raises(Conflict) as refused:
        operation_resolve(
            support.actor, op.pk, resolution="requeue", evidence="", state_version=op.state_version
        )
    assert refused.value.code == "task_cancelled"
    assert Operation.objects.get(pk=op.pk).status == "manual_intervention"
