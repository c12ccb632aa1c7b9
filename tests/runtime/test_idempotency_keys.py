"""Idempotency key domains (pure): each kind of intent has its own shape, stable for the same
intent and different for another, so keys of different kinds never collide."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import idempotent_requests
from runtime.keys import (
    given_key_check,
    key_compensation,
    key_legacy,
    key_notification,
    key_step,
    key_trigger,
)
from runtime.models import IdempotentRequest
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


# --- hostile parts (issue 22): a step, kind or recipient may hold ":", "%", "/" or anything ---

# Single characters and whole escape look-alikes, so a part may spell "%3A" or ":v1" itself.
_PIECES = [*":%/aA0_-. 3AF2é漢🙂", "%3A", "%25", "%2F", ":v1", ":a2", ":notify", ":compensate"]
hostile = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=8).map("".join)
task_ids = st.one_of(ident.map(lambda s: f"tsk_{s}"), hostile)
versions = st.integers(min_value=1, max_value=50)
attempts = st.integers(min_value=1, max_value=4)


def _fields(key: str) -> list[str]:
    return [key_legacy(f) for f in key.split(":")]


def _parse(key: str) -> tuple:
    """An independent reading of a derived key back into its domain and parts. That every key
    reads back as exactly what made it proves the domains injective: two different intents (of
    one domain or two) can never share a key."""
    f = _fields(key)
    if "compensate" in f and len(f) >= 7 and f[-3] == "compensate":
        return ("compensation", _parse(":".join(key.split(":")[:-3])), f[-2], f[-1])
    if f[0] == "trigger" and len(f) == 3:
        return ("trigger", f[1], f[2])
    attempt = 1
    rest = f[1:]
    if len(f) in (5, 6) and re.fullmatch(r"a\d+", f[1]) and not (len(f) == 5 and f[1] == "notify"):
        attempt, rest = int(f[1][1:]), f[2:]
    if rest[0] == "notify" and len(rest) == 4:
        return ("notification", f[0], rest[1], rest[2], rest[3], attempt)
    assert len(rest) == 3, key
    return ("step", f[0], rest[0], rest[1], rest[2], attempt)


@given(task=task_ids, step=hostile, tool=hostile, version=versions, attempt=attempts)
def test_a_step_key_reads_back_as_exactly_its_parts(task, step, tool, version, attempt):
    key = key_step(task, step, tool, version, attempt=attempt)
    assert _parse(key) == ("step", task, step, tool, f"v{version}", attempt)
    assert "/" not in key  # never misread as a namespace by key_in_namespace


@given(task=task_ids, kind=hostile, to=hostile, version=versions, attempt=attempts)
def test_a_notification_key_reads_back_as_exactly_its_parts(task, kind, to, version, attempt):
    key = key_notification(task, kind, to, version, attempt=attempt)
    assert _parse(key) == ("notification", task, kind, to, f"v{version}", attempt)


@given(task=task_ids, step=hostile, tool=hostile, undo=hostile, version=versions, n=versions)
def test_a_compensation_key_reads_back_as_its_original_and_tool(task, step, tool, undo, version, n):
    original = key_step(task, step, tool, version)
    key = key_compensation(original, undo, n)
    assert _parse(key) == ("compensation", _parse(original), undo, f"v{n}")


@given(source=hostile, event=hostile)
def test_a_trigger_key_reads_back_as_exactly_its_parts(source, event):
    assert _parse(key_trigger(source, event)) == ("trigger", source, event)


@given(
    task=task_ids,
    a=st.tuples(hostile, hostile, versions, attempts),
    b=st.tuples(hostile, hostile, versions, attempts),
    comp=st.tuples(hostile, versions),
)
def test_no_two_intents_of_any_domains_share_a_key(task, a, b, comp):
    """Hostile parts across domains: steps, notifications and compensations of the same task."""
    made = {
        ("step", a): key_step(task, a[0], a[1], a[2], attempt=a[3]),
        ("step", b): key_step(task, b[0], b[1], b[2], attempt=b[3]),
        ("notification", a): key_notification(task, a[0], a[1], a[2], attempt=a[3]),
        ("notification", b): key_notification(task, b[0], b[1], b[2], attempt=b[3]),
        ("compensation", a, comp): key_compensation(
            key_step(task, a[0], a[1], a[2], attempt=a[3]), comp[0], comp[1]
        ),
        ("compensation", b, comp): key_compensation(
            key_step(task, b[0], b[1], b[2], attempt=b[3]), comp[0], comp[1]
        ),
    }
    assert len(set(made.values())) == len(made)


def test_the_collisions_the_review_found_are_gone():
    assert key_step("t", "notify:x", "demo.echo", 1) != key_notification("t", "x", "demo.echo", 1)
    charge = key_step("t", "pay", "demo.payments.charge", 1)
    assert key_step(
        "t", "pay:demo.payments.charge:v1:compensate", "demo.payments.refund", 1
    ) != key_compensation(charge, "demo.payments.refund", 1)
    assert key_step("t", "a2:s", "r", 1) != key_step("t", "s", "r", 1, attempt=2)


@given(task=ident, step=ident, tool=st.sampled_from(sorted(adapters())), version=versions)
def test_keys_without_reserved_characters_are_what_they_were(task, step, tool, version):
    """Existing keys (parts without ':', '%', '/') keep matching their stored operations."""
    assert key_step(task, step, tool, version) == f"{task}:{step}:{tool}:v{version}"
    assert key_step(task, step, tool, version, attempt=3) == f"{task}:a3:{step}:{tool}:v{version}"
    assert (
        key_notification(task, step, "a@b.c", version) == f"{task}:notify:{step}:a@b.c:v{version}"
    )


@given(task=task_ids, step=hostile, tool=hostile, version=versions, attempt=attempts)
def test_the_legacy_key_is_the_parts_joined_unescaped(task, step, tool, version, attempt):
    instance = task if attempt <= 1 else f"{task}:a{attempt}"
    assert key_legacy(key_step(task, step, tool, version, attempt=attempt)) == (
        f"{instance}:{step}:{tool}:v{version}"
    )


@pytest.mark.parametrize(
    "given_key",
    [
        "tsk_01hzzzzzzzzzzzzzzzzzzzzzzz:pay:demo.payments.charge:v1",
        "tsk_x:pay:demo.payments.charge:v1:compensate:demo.payments.refund:v1",
        "agt_01abc/tsk_x:notify:a:demo.echo:v1",
        "trigger:github:42",
    ],
)
def test_a_given_key_may_not_take_a_derived_keys_shape(given_key):
    with pytest.raises(ValueError):
        given_key_check(given_key)


@pytest.mark.parametrize("given_key", ["order-42", "tsk_x", "stripe:ch_1", "a/tsk_x:y", "task:1"])
def test_ordinary_given_keys_are_kept(given_key):
    assert given_key_check(given_key) == given_key


def test_the_key_records_raw_read_names_every_column_of_its_model():
    """runtime.idempotent_requests reads a record with its own statement: a column added to the
    model must be read there too (a stored response would come back without it)."""
    assert [
        f.attname for f in IdempotentRequest._meta.concrete_fields
    ] == idempotent_requests._FIELDS
