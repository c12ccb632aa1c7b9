"""Declaring tools without code (docs/tools.md, "Tools declared without code"): an admin declares
an HTTP endpoint the workers call, or a step agents run themselves, in the console or over the
API; every edit is a new version (runtime.models.tools), audited with the admin named, and every
process sees it at its next look (runtime.tools.declared).

A declaration is checked whole before anything is stored (400 ``invalid_input`` naming the field,
nothing changed): its name, its parameter schema (a valid JSON Schema of an object, compiled
now), its approval policy, and for an HTTP tool its URLs (the webhooks' address guard:
runtime.address_guard, switch TOOL_ALLOW_PRIVATE_HOSTS), method, headers, timeout and
credential. The credential is sealed (runtime.tools.declared.secret_seal) and never shown again.
The name, the kind and the contract never change: recovering the unconfirmed calls of work in
flight relies on the contract they were made under."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.address_guard import url_hint
from runtime.errors import Conflict, InvalidInput, NotFound, TransitionRejected
from runtime.models import AuditRecord, DeclaredTool, DeclaredToolVersion
from runtime.models.tools import DeclaredToolKind as Kind
from runtime.policy import can_declare_tools
from runtime.selectors.tool_declarations import Declaration, declaration_history
from runtime.tool_definitions import (
    AUTH_TYPES,
    COMMON,
    CONTRACTS,
    DEFAULTS,
    EDITABLE,
    HTTP,
    MAX_ATTEMPTS,
    MAX_TIMEOUT_SECONDS,
    METHODS,
    definition_checked,
    fields_only,
    name_checked,
    secret_kept,
)
from runtime.tools.base import declared_refresh


def tool_declare(actor: Actor, fields: dict[str, Any]) -> Declaration:
    """Declare a tool (version 1). ``fields``: name, kind (http, agent), contract, and the
    definition's fields (``EDITABLE``; an HTTP tool needs ``url``; ``auth.secret`` is sealed).
    Preconditions: admins (policy.can_declare_tools). InvalidInput naming the field; Conflict
    ``tool_exists`` when the name is taken (built in, or declared before)."""
    can_declare_tools(actor)
    name = name_checked(fields.get("name"))
    kind = fields.get("kind")
    if kind not in Kind.ALL:
        raise InvalidInput(f"kind must be one of {', '.join(Kind.ALL)}", field="kind")
    contract = fields.get("contract")
    if contract not in CONTRACTS[kind]:
        raise InvalidInput(
            f"contract must be one of {', '.join(CONTRACTS[kind])}", field="contract"
        )
    fields_only(
        fields, {"name", "kind", "contract", *COMMON, *(() if kind == Kind.AGENT else HTTP)}
    )
    definition, secret = definition_checked(
        kind, contract, {**DEFAULTS, **fields}, previous_secret=""
    )
    now = timezone.now()
    with transaction.atomic():
        try:
            with transaction.atomic():  # the name's row, or the one a concurrent declaration made
                tool = DeclaredTool.objects.create(
                    name=name,
                    kind=kind,
                    contract=contract,
                    version=1,
                    created_by=actor.label,
                    created_at=now,
                    updated_at=now,
                )
        except IntegrityError:
            raise Conflict(
                f"a tool named {name!r} is declared already", code="tool_exists"
            ) from None
        row = _version_add_txn(actor, tool, definition, secret or "", offered=True, now=now)
        _audit_txn(actor, "tool.declared", row, now, changed=sorted(definition))
    declared_refresh()  # this process offers it at once; the others at their next look
    return Declaration(row, (row,))


def tool_edit(
    actor: Actor, name: str, changes: dict[str, Any], *, version: int | None = None
) -> Declaration:
    """A new version of a declared tool: ``changes`` (``EDITABLE`` fields) over its newest
    definition; ``offered: false`` retires it (no new proposals; work recorded before runs on),
    ``true`` offers it again. ``version``: the version the edit is based on (TransitionRejected,
    409 state_version_mismatch, when another edit came first). Work in flight keeps the
    version it was recorded under. Nothing changes when nothing differs."""
    can_declare_tools(actor)
    _editable_check(changes)
    now = timezone.now()
    with transaction.atomic():
        tool = _locked_at_txn(name, version)
        current = DeclaredToolVersion.objects.get(tool=tool, version=tool.version)
        if tool.kind == Kind.AGENT:
            fields_only(changes, {*COMMON, "offered"})
        merged = {**current.definition, **changes}
        if "auth" in changes and isinstance(changes["auth"], dict):
            merged["auth"] = changes["auth"]
        offered = changes.get("offered", current.offered)
        if not isinstance(offered, bool):
            raise InvalidInput("offered must be true or false", field="offered")
        definition, secret = definition_checked(
            tool.kind, tool.contract, merged, previous_secret=current.secret_sealed
        )
        if (
            definition == current.definition
            and offered == current.offered
            and secret is None
            and current.secret_sealed == secret_kept(definition, current.secret_sealed)
        ):
            return Declaration(current, declaration_history(tool))
        tool.version += 1
        tool.updated_at = now
        tool.save(update_fields=["version", "updated_at"])
        row = _version_add_txn(
            actor,
            tool,
            definition,
            secret if secret is not None else secret_kept(definition, current.secret_sealed),
            offered=offered,
            now=now,
        )
        action = _edit_action(current.offered, offered)
        changed = sorted(k for k in definition if definition[k] != current.definition.get(k))
        _audit_txn(actor, action, row, now, changed=changed + (["secret"] if secret else []))
    declared_refresh()
    return Declaration(row, declaration_history(tool))


def _editable_check(changes: dict[str, Any]) -> None:
    """Refuse (400) a change to anything but ``EDITABLE``, naming the first such field."""
    unknown = sorted(set(changes) - EDITABLE)
    if unknown:
        raise InvalidInput(
            f"{unknown[0]} cannot be edited (a different name, kind or contract is another "
            "tool: declare it)"
            if unknown[0] in ("name", "kind", "contract")
            else f"{unknown[0]} is not a field of a declared tool",
            field=unknown[0],
        )


def _locked_at_txn(name: str, version: int | None) -> DeclaredTool:
    """The declared tool's row, locked, at ``version`` when one is given."""
    tool = DeclaredTool.objects.select_for_update().filter(pk=name).first()
    if tool is None:
        raise NotFound("no such declared tool")
    if version is not None and version != tool.version:
        raise TransitionRejected(
            f"the tool is at version {tool.version}, not {version}: someone edited it first"
        )
    return tool


def _edit_action(was_offered: bool, offered: bool) -> str:
    """How the audit names a new version: a retirement, an offer again, or an edit. Pure."""
    return (
        "tool.retired"
        if was_offered and not offered
        else "tool.offered"
        if offered and not was_offered
        else "tool.edited"
    )


def _version_add_txn(
    actor: Actor,
    tool: DeclaredTool,
    definition: dict[str, Any],
    secret_sealed: str,
    *,
    offered: bool,
    now: Any,
) -> DeclaredToolVersion:
    return DeclaredToolVersion.objects.create(
        tool=tool,
        version=tool.version,
        definition=definition,
        secret_sealed=secret_sealed,
        offered=offered,
        created_by=actor.label,
        created_at=now,
    )


def _audit_txn(
    actor: Actor, action: str, row: DeclaredToolVersion, now: Any, *, changed: list[str]
) -> None:
    """Who declared what a worker will call, and with which credential's presence: an access
    change, kept with the tokens' and webhooks' (never the credential, nor a URL's path)."""
    definition = row.definition
    detail: dict[str, Any] = {
        "version": row.version,
        "kind": row.tool.kind,
        "contract": row.tool.contract,
        "offered": row.offered,
        "changed": changed,
    }
    if "url" in definition:
        detail["endpoint"] = url_hint(definition["url"])
    AuditRecord.objects.create(
        at=now, actor=actor.label, action=action, subject=f"tool:{row.tool_id}", detail=detail
    )


__all__ = [
    "AUTH_TYPES",
    "MAX_ATTEMPTS",
    "MAX_TIMEOUT_SECONDS",
    "METHODS",
    "tool_declare",
    "tool_edit",
]
