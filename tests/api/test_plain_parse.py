"""The request serializers' plain forms (console.api.plainparse) against the serializers
themselves: over generated bodies, whatever a plain form accepts the serializer validates to
the same data; what it is not sure of goes to the serializer. And the bodies agents send every
day are the ones it accepts, so the plain form is the path they take."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework import serializers
from rest_framework.fields import _UnvalidatedField

from console.api import serializers as s
from console.api.plainparse import NotPlain, plain_form

CONTRACT = [
    c
    for c in vars(s).values()
    if inspect.isclass(c) and issubclass(c, serializers.Serializer) and c.__module__ == s.__name__
]
PLAIN = [c for c in CONTRACT if plain_form(c) is not None]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 100, 2**31 - 1, 2**31, 2**53 - 1, 2**53, 2**1030]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 5.0, 1.5, -1.0, 2.0**53]),
    st.text(max_size=8),
    st.text(min_size=195, max_size=310),
    st.sampled_from(["", " ", "5", "5.0", "a\x00b", "\ud800", "tool", "agent", "worker", "x " * 3]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _likely(field: serializers.Field) -> st.SearchStrategy[Any]:
    """Values near what the field takes (in bounds, at them, just past them), so that the plain
    form accepts often and its edges are walked."""
    choices = list(getattr(field, "choice_strings_to_values", {}) or [])
    if choices:
        return st.sampled_from(choices)
    if isinstance(field, serializers.CharField):
        longest = field.max_length or 50
        return st.text(max_size=longest + 1)
    if isinstance(field, serializers.IntegerField | serializers.FloatField):
        low = field.min_value if field.min_value is not None else -5
        high = field.max_value if field.max_value is not None else 5
        return st.one_of(
            st.integers(min_value=low - 1, max_value=high + 1),
            st.floats(min_value=low - 1, max_value=high + 1),
        )
    if isinstance(field, serializers.DictField):
        child = field.child
        inner = _values if type(child) is _UnvalidatedField else _likely(child)
        return st.dictionaries(st.text(max_size=4), inner, max_size=3)
    return _values


@st.composite
def _bodies(draw: st.DrawFn, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    # Half the bodies are careful: every required field is there, and every value is near what
    # its field takes. Otherwise a serializer of many fields (OperationIn) got an accepted body
    # only by luck, a few in 400, and some runs none: its comparison then never ran.
    careful = draw(st.booleans())
    for name, field in serializer_class().fields.items():
        if (not careful or not field.required) and draw(st.booleans()):
            continue  # absent
        wild = not careful and not draw(st.integers(0, 4))
        body[name] = draw(_values if wild else _likely(field))
    if draw(st.booleans()):
        body[draw(st.text(max_size=6))] = draw(_values)  # a field the contract does not name
    return body


def _serializer(serializer_class: type[serializers.Serializer], body: dict[str, Any]) -> Any:
    ser = serializer_class(data=body)
    return dict(ser.validated_data) if ser.is_valid() else None


@pytest.mark.parametrize("serializer_class", PLAIN, ids=lambda c: c.__name__)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_what_a_plain_form_accepts_the_serializer_validates_to_the_same_data(
    serializer_class, data
):
    body = data.draw(_bodies(serializer_class))
    form = plain_form(serializer_class)
    assert form is not None
    try:
        plain = form(body)
    except NotPlain:
        return
    ACCEPTED.append(serializer_class.__name__)
    assert plain == _serializer(serializer_class, body)
    assert {k: type(v) for k, v in plain.items()} == {
        k: type(v) for k, v in _serializer(serializer_class, body).items()
    }


ACCEPTED: list[str] = []


def test_the_generated_bodies_reached_the_plain_forms_acceptance():
    """Runs after the property above (file order): it compared accepted bodies, not only
    refusals, for every serializer with a plain form."""
    assert {c.__name__ for c in PLAIN} <= set(ACCEPTED)


def test_the_bodies_agents_send_take_the_plain_form():
    form = plain_form(s.OperationIn)
    assert form is not None
    for body in (
        {"step": "charge", "tool": "demo.slow", "params": {"seconds": 0}},
        {
            "kind": "tool",
            "step": "s",
            "tool": "demo.payments.charge",
            "params": {"account": "a", "amount_cents": 5},
            "intent_version": 2,
            "idempotency_key": "k-1",
            "estimate": {"cost_cents": 5, "tool_calls": 1.5},
            "executor": "agent",
            "max_attempts": 3,
            "approval_timeout_seconds": None,
        },
        {"kind": "wait_signal", "step": "w", "signal": "approved", "timeout_seconds": 60},
    ):
        assert form(body) == _serializer(s.OperationIn, body)


def test_a_serializer_with_a_rule_of_its_own_has_no_plain_form():
    class Checked(serializers.Serializer):
        name = s.Text(max_length=5)

        def validate_name(self, value: str) -> str:
            return value.upper()

    class Trimmed(serializers.Serializer):
        name = serializers.CharField()  # DRF's: trims and coerces numbers

    class Sub(s.Text):
        pass

    class Subclassed(serializers.Serializer):
        name = Sub()

    assert plain_form(Checked) is None
    assert plain_form(Trimmed) is None
    assert plain_form(Subclassed) is None
    # The contract's own with a field the plain form does not know (JSON, nested) have none.
    assert plain_form(s.CompleteIn) is None
