"""Tools declared without code (docs/tools.md): an HTTP endpoint the workers call, or a step an
agent runs itself, declared by an admin in the console or over the API.

A declaration is versioned: ``DeclaredTool`` holds what never changes (the name, what kind of
tool it is, its receiver contract) and the number of its newest version; each edit adds a
``DeclaredToolVersion`` and is never changed afterwards, so an operation recorded under a
version (``Operation.tool_version``) runs that version's definition however often the tool is
edited later. No row is ever deleted: a tool an admin retires gets a version that is not
offered."""

from __future__ import annotations

from django.db import models


class DeclaredToolKind:
    HTTP = "http"  # a worker calls the endpoint
    AGENT = "agent"  # the agent that proposes it runs it (executor=agent)
    ALL = (HTTP, AGENT)


class DeclaredTool(models.Model):
    name = models.CharField(primary_key=True, max_length=200)
    kind = models.CharField(max_length=16)
    # What recovery of its unconfirmed calls relies on: fixed for the tool's whole life (a
    # different promise is a different tool, under another name).
    contract = models.CharField(max_length=16)
    # The newest version; edits take this row's lock, so versions of one tool never race.
    version = models.PositiveIntegerField(default=1)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=DeclaredToolKind.ALL), name="declared_tool_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(contract__in=("pure", "replay", "lookup", "none")),
                name="declared_tool_contract_valid",
            ),
        ]


class DeclaredToolVersion(models.Model):
    """One version of a declared tool, as the admin declared it (``definition``: description,
    parameter schema, approval policy, and for an HTTP tool its request), never changed. The
    credential an HTTP tool sends is sealed (Fernet: runtime.tools.declared) in
    ``secret_sealed``; the definition holds no secret."""

    id = models.BigAutoField(primary_key=True)
    tool = models.ForeignKey(DeclaredTool, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    definition = models.JSONField(default=dict)
    secret_sealed = models.TextField(blank=True, default="")
    # Whether new work may be proposed under it (False: retired; the work recorded before runs).
    offered = models.BooleanField(default=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tool", "version"], name="declared_tool_version_once"),
            models.CheckConstraint(
                condition=~models.Q(created_by=""), name="declared_tool_version_names_its_author"
            ),
        ]
