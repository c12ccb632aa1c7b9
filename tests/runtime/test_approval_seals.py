"""Integrity of what was decided (issue 22 point 5): an approval is sealed with a keyed MAC over
the decision and the parameters it covers, and the release recheck refuses parameters or a
binding changed behind the application's back (a direct SQL UPDATE): nothing runs, the action
goes back to a person with the reason, and the journal names the integrity failure. Key
rotation: the first key seals, every listed key verifies, a dropped key's seals are refused.
Runs on SQLite too, except the worker-process test."""

from __future__ import annotations

import importlib
import json
from datetime import timedelta

import pytest
from django.apps import apps as live_apps
from django.db import connection
from django.test import Client

from runtime.approvals import approval_decide
from runtime.executions import execution_for_agent
from runtime.hashing import params_hash
from runtime.keyring import key_id
from runtime.models import Approval, Event, Operation, OutboxMessage
from runtime.sandbox import receivers
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories
from tests.conftest import wait_for

BIG = {"account": "acct-1", "amount_cents": 25000}
EVIL = {"account": "acct-evil", "amount_cents": 99999}
SEAL_DOMAIN = b"runtime.approval-seal-key"


@pytest.fixture(autouse=True)
def _seal_keys(settings):
    settings.APPROVAL_SEAL_KEYS = ["seal-key-1"]


def _gated(owner, task=None):
    task = task or factories.task(owner)
    op = factories.operation(owner, task, tool="demo.payments.charge", params=dict(BIG))
    return op, Approval.objects.get(operation=op)


def _approve(operator, approval):
    approval_decide(
        operator.actor,
        approval.pk,
        decision="approve",
        reason="looks right",
        params_hash=approval.params_hash,
    )


def _approved(owner, operator, task=None):
    op, approval = _gated(owner, task)
    _approve(operator, approval)
    op.refresh_from_db()
    approval.refresh_from_db()
    assert op.status == "pending" and approval.status == "approved"
    return op, approval


def _claim(op):
    return operation_claim(op.pk, execution_id=execution_for_agent("worker").pk)


def _sql(table: str, assignments: dict, pk: str) -> None:
    """A direct UPDATE, as someone with database access would write it (no model, no service)."""
    casts = {"params": "CAST(%s AS jsonb)" if connection.features.has_native_json_field else "%s"}
    sets = ", ".join(f"{column} = {casts.get(column, '%s')}" for column in assignments)
    values = [json.dumps(v) if column == "params" else v for column, v in assignments.items()]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {sets} WHERE id = %s", [*values, pk])


def _nothing_ran(op) -> None:
    assert receivers.effects_under("payments", op.idempotency_key) == []
    assert not op.invocations.exists()


def _back_with_a_person(op, approval, why: str) -> Event:
    """Refused at release: nothing ran, the approval waits on /approvals/ with the reason, bound
    to what the operation holds now, and the journal names the integrity failure."""
    approval.refresh_from_db()
    op.refresh_from_db()
    assert (approval.status, op.status) == ("pending", "waiting_approval")
    assert approval.reason.startswith("integrity check failed") and why in approval.reason
    assert op.status_reason == approval.reason
    assert approval.seal == "" and approval.decider_key == ""
    assert approval.params == op.params and approval.params_hash == params_hash(op.params)
    assert op.params_hash == approval.params_hash
    _nothing_ran(op)
    assert not OutboxMessage.objects.filter(operation=op).exists()
    event = Event.objects.get(operation=op, type="approval.integrity_failed")
    assert event.data["reason"] == approval.reason
    operator = factories.console_user("operator")
    browser = Client()
    assert browser.login(username=operator.actor.name, password=factories.PASSWORD)
    page = browser.get("/approvals/").content.decode()
    assert approval.pk in page and "integrity check failed" in page
    return event


@pytest.mark.django_db
def test_an_untampered_approval_is_sealed_and_released():
    owner, operator = factories.agent(), factories.console_user("operator")
    op, approval = _approved(owner, operator)
    assert approval.seal.startswith(key_id(b"seal-key-1", SEAL_DOMAIN) + ".")
    lease = _claim(op)
    assert isinstance(lease, Lease), lease
    approval.refresh_from_db()
    assert approval.status == "released"
    assert not Event.objects.filter(operation=op, type="approval.integrity_failed").exists()


@pytest.mark.django_db
def test_parameters_changed_by_sql_after_approval_are_refused_at_release():
    owner, operator = factories.agent(), factories.console_user("operator")
    op, approval = _approved(owner, operator)
    _sql("runtime_operation", {"params": EVIL}, op.pk)  # the hash column left as it was

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    assert "integrity check failed" in refused.reason
    event = _back_with_a_person(op, approval, "parameters are not the ones approved")
    assert event.data["approved_params"] == BIG and event.data["params_hash"] == params_hash(EVIL)
    assert approval.params == EVIL  # the person sees what would run, not what was approved
    # A person decides again, on what they now see: a denial ends it, nothing ran.
    approval_decide(operator.actor, approval.pk, decision="deny", reason="not ours", params_hash="")
    op.refresh_from_db()
    assert op.status == "failed"
    _nothing_ran(op)


@pytest.mark.django_db
def test_parameters_rewritten_with_every_hash_to_match_are_refused_at_release():
    """Someone who rewrites the parameters and both hashes consistently still cannot write the
    seal: only the key can."""
    owner, operator = factories.agent(), factories.console_user("operator")
    op, approval = _approved(owner, operator)
    forged = params_hash(EVIL)
    _sql("runtime_operation", {"params": EVIL, "params_hash": forged}, op.pk)
    _sql("runtime_approval", {"params": EVIL, "params_hash": forged}, approval.pk)

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    _back_with_a_person(op, approval, "its seal does not verify")


@pytest.mark.django_db
@pytest.mark.parametrize("tamper", ["approver", "params_hash", "expires_at", "proposal_version"])
def test_an_approval_row_changed_by_sql_is_refused_at_release(tamper):
    owner, operator = factories.agent(), factories.console_user("operator")
    other = factories.console_user("operator")  # holds the right: only the seal can tell
    op, approval = _approved(owner, operator)
    change = {
        "approver": {"decided_by": other.actor.label, "decider_key": other.actor.key},
        "params_hash": {"params_hash": params_hash(EVIL)},
        "expires_at": {"expires_at": approval.expires_at + timedelta(days=30)},
        "proposal_version": {"proposal_version": 7},
    }[tamper]
    _sql("runtime_approval", change, approval.pk)

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    why = (
        "parameter hash is not the approved one"
        if tamper == "params_hash"
        else "its seal does not verify"
    )
    _back_with_a_person(op, approval, why)


@pytest.mark.django_db
def test_a_retry_of_released_work_with_changed_parameters_goes_to_manual_intervention():
    """Released work whose lease was taken over is claimable again under the same (released)
    approval: the seal is checked again, and a change refuses the retry for a person."""
    owner, operator = factories.agent(), factories.console_user("operator")
    op, _approval = _approved(owner, operator)
    lease = _claim(op)
    assert isinstance(lease, Lease), lease
    assert lease_expire_sweep(now=lease.lease_expires_at + timedelta(seconds=1)) == 1
    op.refresh_from_db()
    assert op.status == "pending"
    _sql("runtime_operation", {"params": EVIL}, op.pk)

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    op.refresh_from_db()
    assert op.status == "manual_intervention"
    assert "integrity check failed" in op.status_reason
    assert Event.objects.filter(operation=op, type="approval.integrity_failed").exists()
    assert op.invocations.count() == 1  # the first attempt only
    assert receivers.effects_under("payments", op.idempotency_key) == []


@pytest.mark.django_db
def test_key_rotation_a_new_first_key_still_verifies_and_a_dropped_key_is_refused(settings):
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    settings.APPROVAL_SEAL_KEYS = ["old-key"]
    kept, _kept_approval = _approved(owner, operator, task)
    dropped, dropped_approval = _approved(owner, operator, task)

    # Rotation: the new key first, the old one still listed. The old seal verifies.
    settings.APPROVAL_SEAL_KEYS = ["new-key", "old-key"]
    assert isinstance(_claim(kept), Lease)
    # New decisions are sealed with the new key.
    fresh, fresh_approval = _approved(owner, operator, task)
    assert fresh_approval.seal.startswith(key_id(b"new-key", SEAL_DOMAIN) + ".")

    # The old key dropped: its seals no longer verify, and the action goes back to a person.
    settings.APPROVAL_SEAL_KEYS = ["new-key"]
    refused = _claim(dropped)
    assert isinstance(refused, Refusal), refused
    _back_with_a_person(dropped, dropped_approval, "key no longer configured")
    assert isinstance(_claim(fresh), Lease)
    # The person approves again: sealed with the current key, released.
    dropped_approval.refresh_from_db()
    _approve(operator, dropped_approval)
    assert isinstance(_claim(dropped), Lease)


@pytest.mark.django_db
def test_the_migration_seals_approvals_decided_before_it():
    """Approvals already approved when the seal column arrives are sealed from their rows (the
    upgrade trusts them as of that moment) and release as before."""
    owner, operator = factories.agent(), factories.console_user("operator")
    op, approval = _approved(owner, operator)
    _sql("runtime_approval", {"seal": ""}, approval.pk)  # as the row stood before 0014
    _pending_op, pending = _gated(owner)

    migration = importlib.import_module("runtime.migrations.0014_approval_seals")
    migration._seal_decided(live_apps, None)

    assert Approval.objects.get(pk=pending.pk).seal == ""  # sealed when it is decided
    assert isinstance(_claim(op), Lease)


@pytest.mark.workers
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_real_workers_run_sealed_work_and_refuse_tampered_or_dropped_key_work(workers, settings):
    """Real worker processes, whose keys are APPROVAL_SEAL_KEYS=new,current: work sealed under
    the current key runs (one charge); work whose parameters were changed by SQL and work sealed
    under a key the workers no longer list go back to a person, and the receiver sees nothing."""
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    settings.APPROVAL_SEAL_KEYS = ["retired-key"]
    dropped, dropped_approval = _approved(owner, operator, task)
    settings.APPROVAL_SEAL_KEYS = ["current-key"]
    good, _ = _approved(owner, operator, task)
    tampered, tampered_approval = _approved(owner, operator, task)
    _sql("runtime_operation", {"params": EVIL}, tampered.pk)

    workers.start(count=1, concurrency=1, APPROVAL_SEAL_KEYS="new-key,current-key")

    wait_for(lambda: Operation.objects.get(pk=good.pk).status == "succeeded", timeout=60)
    for op in (tampered, dropped):
        wait_for(
            lambda op=op: Event.objects.filter(
                operation=op, type="approval.integrity_failed"
            ).exists(),
            timeout=60,
            what="the integrity refusal",
        )
    assert len(receivers.effects_under("payments", good.idempotency_key)) == 1
    _back_with_a_person(tampered, tampered_approval, "parameters are not the ones approved")
    _back_with_a_person(dropped, dropped_approval, "key no longer configured")
    assert receivers.effects_under("payments", tampered.idempotency_key) == []
    assert not any(
        c["account"] == "acct-evil"
        for op in (good, tampered, dropped)
        for c in receivers.effects_under("payments", op.idempotency_key)
    )
