"""The demo receivers' own contracts, seen from the receiver's side (their own tables)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.sandbox import receivers
from runtime.sandbox.models import Charge, PaymentRequest, SlowCall

pytestmark = [pytest.mark.django_db]


def test_payments_store_the_first_result_and_replay_it():
    body = {"account": "acct_1", "amount_cents": 500}
    first = receivers.payments_charge(key="k1", body=body, fencing_token=1)
    again = receivers.payments_charge(key="k1", body=body, fencing_token=2)
    assert first.status == again.status == 200
    assert again.body == first.body
    assert Charge.objects.filter(key="k1").count() == 1


def test_payments_refuse_the_same_key_with_a_different_body():
    receivers.payments_charge(key="k2", body={"account": "a", "amount_cents": 1}, fencing_token=1)
    other = receivers.payments_charge(
        key="k2", body={"account": "a", "amount_cents": 2}, fencing_token=1
    )
    assert other.status == 422
    assert Charge.objects.filter(key="k2").count() == 1


def test_payments_store_failures_too():
    body = {"account": "declined-card", "amount_cents": 100}
    first = receivers.payments_charge(key="k3", body=body, fencing_token=1)
    again = receivers.payments_charge(key="k3", body=body, fencing_token=1)
    assert first.status == again.status == 402
    assert again.body == first.body
    assert not Charge.objects.filter(key="k3").exists()


def test_payments_refuse_a_request_while_the_first_is_in_progress():
    PaymentRequest.objects.create(
        key="k4",
        request_hash=receivers.params_hash({"account": "a", "amount_cents": 3}),
        created_at=timezone.now(),
    )
    busy = receivers.payments_charge(
        key="k4", body={"account": "a", "amount_cents": 3}, fencing_token=1
    )
    assert busy.status == 409
    assert not Charge.objects.filter(key="k4").exists()


def test_payments_validation_failure_saves_nothing_under_the_key():
    bad = receivers.payments_charge(
        key="k5", body={"account": "a", "amount_cents": 0}, fencing_token=1
    )
    assert bad.status == 400
    good = receivers.payments_charge(
        key="k5", body={"account": "a", "amount_cents": 7}, fencing_token=1
    )
    assert good.status == 200


def test_payments_keys_older_than_a_day_may_be_pruned():
    receivers.payments_charge(key="k6", body={"account": "a", "amount_cents": 9}, fencing_token=1)
    assert receivers.payments_prune(now=timezone.now() + timedelta(hours=23)) == 0
    assert receivers.payments_prune(now=timezone.now() + timedelta(hours=25)) == 1
    # After pruning, the same key starts a new request.
    receivers.payments_charge(key="k6", body={"account": "a", "amount_cents": 9}, fencing_token=1)
    assert Charge.objects.filter(key="k6").count() == 2


def test_inventory_answers_lookups_by_key():
    assert receivers.inventory_lookup(key="r1").status == 404
    made = receivers.inventory_reserve(key="r1", sku="sku-1", qty=2, fencing_token=1)
    found = receivers.inventory_lookup(key="r1")
    assert found.status == 200 and found.body["id"] == made.body["id"]


def test_the_slow_receiver_records_its_start_and_end_as_the_orm_stores_times():
    """Its writes are SQL of their own (the bench's headline tool): the rows must read back and
    compare as the ORM's own do, on PostgreSQL and in the embedded mode (SQLite stores a time
    as text, where another format would sort and compare wrongly)."""
    before = timezone.now()
    answer = receivers.slow_call(key="s1", seconds=0, fencing_token=3, deadline_remaining=1.5)
    after = timezone.now()
    assert answer.status == 200
    call = SlowCall.objects.get(pk=answer.body["id"])
    assert (call.key, call.fencing_token, call.deadline_remaining) == ("s1", 3, 1.5)
    assert before <= call.started_at <= call.finished_at <= after
    # An exact match: the stored text equals what the ORM makes of the same time.
    same = SlowCall.objects.filter(started_at=call.started_at, finished_at=call.finished_at)
    assert list(same.values_list("pk", flat=True)) == [call.pk]
    assert [e["id"] for e in receivers.effects_under("slow", "s1")] == [call.pk]
