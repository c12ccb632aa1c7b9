"""Similar unresolved operations (same tool, receiver and error) grouped, and settled together
with the evidence recorded for each (issue 39); a stale member is refused on its own, and a
refusal of the whole (no right, no evidence) settles nothing."""

from __future__ import annotations

import pytest

from runtime.errors import InvalidInput, NotAuthorized
from runtime.models import Operation, Resolution
from runtime.resolution_bulk import MAX_BULK, BulkItem, operations_resolve_bulk
from runtime.selectors.unresolved_groups import error_of, receiver_of, similar_groups
from tests import factories

pytestmark = pytest.mark.django_db


def _lost(owner, task, to="c@x"):
    op = factories.unresolved_operation(owner, task)
    if to != "c@x":
        Operation.objects.filter(pk=op.pk).update(params={**op.params, "to": to})
    return Operation.objects.get(pk=op.pk)


def test_alike_operations_form_one_group_and_the_others_stay_apart():
    owner = factories.agent()
    task = factories.task(owner)
    alike = [_lost(owner, task) for _ in range(3)]
    elsewhere = _lost(owner, task, to="d@y")
    [group] = similar_groups([*alike, elsewhere])
    assert [op.pk for op in group.operations] == [op.pk for op in alike]
    assert (group.tool, group.receiver) == ("demo.notify", "c@x")
    assert group.error == error_of(alike[0]) and group.error
    assert receiver_of(elsewhere) == "d@y"
    # One of a kind is no group.
    assert similar_groups([elsewhere]) == []


def test_a_bulk_settle_records_the_evidence_for_each_and_refuses_a_stale_one_alone():
    owner = factories.agent()
    task = factories.task(owner)
    ops = [_lost(owner, task) for _ in range(3)]
    sue = factories.console_user("support")
    items = [BulkItem(op.pk, op.state_version) for op in ops]
    stale = BulkItem(ops[2].pk, ops[2].state_version + 1)
    results = operations_resolve_bulk(
        sue.actor, [*items[:2], stale], resolution="no_effect", evidence="mail log: none sent"
    )
    assert [r["ok"] for r in results] == [True, True, False]
    assert results[2]["code"] == "state_version_mismatch"
    audit = Resolution.objects.filter(operation__in=ops).order_by("operation_id")
    assert sorted(a.operation_id for a in audit) == sorted(op.pk for op in ops[:2])
    assert {(a.actor, a.evidence, a.resolution) for a in audit} == {
        (sue.actor.label, "mail log: none sent", "no_effect")
    }
    assert [Operation.objects.get(pk=op.pk).status for op in ops] == [
        "failed",
        "failed",
        "unresolved",
    ]


@pytest.mark.parametrize(
    ("role", "resolution", "evidence", "error"),
    [
        ("operator", "no_effect", "checked", NotAuthorized),
        ("support", "no_effect", "   ", InvalidInput),
        ("support", "requeue", "checked", InvalidInput),
    ],
)
def test_a_refused_bulk_settles_nothing(role, resolution, evidence, error):
    owner = factories.agent()
    task = factories.task(owner)
    ops = [_lost(owner, task) for _ in range(2)]
    person = factories.console_user(role)
    with pytest.raises(error):
        operations_resolve_bulk(
            person.actor,
            [BulkItem(op.pk, op.state_version) for op in ops],
            resolution=resolution,
            evidence=evidence,
        )
    assert not Resolution.objects.exists()
    assert {Operation.objects.get(pk=op.pk).status for op in ops} == {"unresolved"}


def test_too_many_or_twice_the_same_is_refused():
    sue = factories.console_user("support")
    op = factories.unresolved_operation()
    with pytest.raises(InvalidInput, match="twice"):
        operations_resolve_bulk(
            sue.actor, [BulkItem(op.pk, 1), BulkItem(op.pk, 1)], resolution="no_effect",
            evidence="x",
        )  # fmt: skip
    many = [BulkItem(f"op_{n}", 1) for n in range(MAX_BULK + 1)]
    with pytest.raises(InvalidInput, match="at most"):
        operations_resolve_bulk(sue.actor, many, resolution="no_effect", evidence="x")
    assert not Resolution.objects.exists()
