"""Idempotency key domains (pure): each kind of intent has its own shape, stable for the same
intent and different for another, so keys of different kinds never collide."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.keys import key_compensation, key_notification, key_step, key_trigger
from runtime.tools import adapters

ident = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)


@given(task=ident, step=ident, version=st.integers(min_value=1, max_value=50))
def test_domains_never_collide(task, step, version):
    keys = {
        key_step(task, step, "demo.echo", version),
        key_compensation(key_step(task, step, "demo.echo", version), "demo.undo", version),
        key_notification(task, step, "a@example.com", version),
        key_trigger(task, step),
    }
    assert len(keys) == 4


@given(task=ident, step=ident, version=st.integers(min_value=1, max_value=50))
def test_the_same_intent_always_gets_the_same_key_and_a_new_version_another(task, step, version):
    assert key_step(task, step, "r", version) == key_step(task, step, "r", version)
    assert key_step(task, step, "r", version) != key_step(task, step, "r", version + 1)


def test_adapters_derive_keys_in_their_domain():
    tools = adapters()
    assert tools["demo.payments.charge"].key_for("t1", "pay", {}, 1) == (
        "t1:pay:demo.payments.charge:v1"
    )
    assert tools["demo.notify"].key_for("t1", "tell", {"to": "x@y"}, 2) == ("t1:notify:tell:x@y:v2")


@given(
    task=ident,
    step=ident,
    version=st.integers(min_value=1, max_value=50),
    comp=st.integers(min_value=1, max_value=5),
)
def test_compensation_keys_are_one_per_logical_compensation(task, step, version, comp):
    """Two effects of one step (other tools or other keys) and a second compensation of the same
    effect each get their own key: the per-task unique constraint is never hit by a saga."""
    charge = key_step(task, step, "demo.payments.charge", version)
    reserve = key_step(task, step, "demo.inventory.reserve", version)
    keys = {
        key_compensation(charge, "demo.payments.refund", comp),
        key_compensation(reserve, "demo.inventory.release", comp),
        key_compensation(charge, "demo.payments.refund", comp + 1),
        key_compensation(f"{charge}-other", "demo.payments.refund", comp),
    }
    assert len(keys) == 4
