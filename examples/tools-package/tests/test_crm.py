"""acme.crm.create_contact: the CRM creates a contact per request, so a repeat would create a
second one; the tool's ``lookup`` finds the first by the operation's key instead."""

from __future__ import annotations

import pytest
from acme_tools import CreateContact
from acme_tools.receivers import Crm, fail_next
from support import context

from runtime.tools import ToolFailure

PARAMS = {"email": "ada@example.com", "name": "Ada"}


def test_a_contact_is_created_under_the_operations_key():
    result = CreateContact().invoke(context(PARAMS, key="op-key"))
    assert result.result["email"] == "ada@example.com"
    assert result.provider_handle.startswith("ct_")
    assert Crm().contacts() == [
        {"id": result.provider_handle, "email": "ada@example.com", "external_ref": "op-key"}
    ]


def test_after_a_timeout_lookup_finds_the_contact_instead_of_creating_another():
    tool = CreateContact()
    fail_next("timeout")  # the contact is created, the answer lost
    with pytest.raises(ToolFailure) as unanswered:
        tool.invoke(context(PARAMS, key="op-key"))
    assert unanswered.value.kind == ToolFailure.UNKNOWN
    found = tool.lookup(context(PARAMS, key="op-key", invocation=2))
    assert found is not None and found.receipt is not None
    assert found.receipt["via"] == "lookup"
    assert [c["id"] for c in Crm().contacts()] == [found.provider_handle]


def test_lookup_says_none_when_nothing_happened_under_the_key():
    assert CreateContact().lookup(context(PARAMS, key="never-sent")) is None


@pytest.mark.parametrize(
    ("status", "kind"), [(503, "transient"), (429, "transient"), (422, "permanent")]
)
def test_answers_are_classified(status: int, kind: str):
    fail_next(status)
    with pytest.raises(ToolFailure) as failed:
        CreateContact().invoke(context(PARAMS))
    assert failed.value.kind == kind
    assert Crm().contacts() == []
