"""Reads of the tools declared without code (selectors): each at its newest version, or one
with its history (admins: runtime.policy.can_declare_tools)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F

from runtime.actors import Actor
from runtime.errors import NotFound
from runtime.models import DeclaredTool, DeclaredToolVersion
from runtime.policy import can_declare_tools


@dataclass(frozen=True)
class Declaration:
    """A declared tool at one version (the row), with its history when asked for."""

    row: DeclaredToolVersion
    versions: tuple[DeclaredToolVersion, ...] = ()


def tool_declarations(actor: Actor) -> list[Declaration]:
    """Every declared tool at its newest version, by name (admins)."""
    can_declare_tools(actor)
    rows = DeclaredToolVersion.objects.select_related("tool").filter(version=F("tool__version"))
    return [Declaration(row) for row in sorted(rows, key=lambda r: r.tool_id)]


def tool_declaration(actor: Actor, name: str) -> Declaration:
    """One declared tool at its newest version, with every version (newest first)."""
    can_declare_tools(actor)
    tool = DeclaredTool.objects.filter(pk=name).first()
    if tool is None:
        raise NotFound("no such declared tool")
    history = declaration_history(tool)
    return Declaration(history[0], history)


def declaration_history(tool: DeclaredTool) -> tuple[DeclaredToolVersion, ...]:
    """Every version of the tool, newest first."""
    return tuple(
        DeclaredToolVersion.objects.select_related("tool").filter(tool=tool).order_by("-version")
    )
