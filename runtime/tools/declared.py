"""Tools declared without code (docs/tools.md, "Tools declared without code"): the adapters made
from the rows of runtime.models.tools, and the process's view of them.

Each version of a declared tool is an adapter of its own, built once per process from its row
(a version never changes) and kept. The catalogue holds each tool's newest version: its
``supported_versions`` are every version up to it, and ``invoke``/``lookup`` run the
definition of the version the operation was recorded under (``InvocationContext.tool_version``),
so work in flight keeps its version however often the tool is edited.

Every process reads the declarations from the database (``DatabaseDeclarations``, installed in
runtime.tools.base at import): once when it first needs them, then again only when asked by
the catalogue (a name or a version it does not know, a proposal of a declared tool, the
catalogue's page and endpoint), and then one statement says whether anything changed: the
number of versions, which only grows (rows are never deleted). Calls of the code's own tools
never cost a statement for this."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cryptography.fernet import InvalidToken
from django.db import connection
from django.db.models import F

from runtime.errors import UnknownTool
from runtime.keyring import sealer
from runtime.models import DeclaredToolVersion
from runtime.models.tools import DeclaredToolKind
from runtime.sqlfiles import queries
from runtime.tools.base import (
    InvocationContext,
    ToolAdapter,
    ToolFailure,
    ToolResult,
    adapters,
    declared_refresh,
    declared_source_set,
)

_SQL = queries("declared_versions_count", slots={})

_SEAL_DOMAIN = b"agent-console declared tool secrets"


def secret_seal(secret: str) -> str:
    """The credential an HTTP tool sends, sealed for its row (Fernet under TOOL_SECRET_KEYS, or
    keys derived from SECRET_KEY: runtime.keyring)."""
    return sealer("TOOL_SECRET_KEYS", _SEAL_DOMAIN).encrypt(secret.encode()).decode()


def secret_open(sealed: str) -> str:
    """The credential sealed by ``secret_seal``; ToolFailure (permanent) when none of the
    server's keys opens it (a key dropped from TOOL_SECRET_KEYS too soon)."""
    try:
        return sealer("TOOL_SECRET_KEYS", _SEAL_DOMAIN).decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise ToolFailure(
            ToolFailure.PERMANENT, "the tool's secret cannot be opened with the server's keys"
        ) from None


def approval_words(approval: Mapping[str, Any]) -> str:
    """A declared approval policy as the catalogue says it ("", "always", "amount above 500")."""
    required = approval.get("required", "never")
    if required == "always":
        return "always"
    if required == "conditional":
        return f"{approval['param']} above {approval['above']}"
    return ""


class Declared(ToolAdapter):
    """One version of a tool declared in the console. Preconditions: the row's definition was
    checked when it was declared (runtime.tool_declarations)."""

    declared = True

    def __init__(self, row: DeclaredToolVersion) -> None:
        tool = row.tool
        definition = row.definition
        approval = definition.get("approval") or {}
        self.name = tool.pk
        self.kind = tool.kind
        self.contract = tool.contract
        self.version = str(row.version)
        self.supported_versions = tuple(str(n) for n in range(1, row.version + 1))
        self.offered = row.offered
        self.definition = definition
        self.secret_sealed = row.secret_sealed
        self.description = str(definition.get("description") or "")
        self.params_schema = definition.get("params_schema") or {"type": "object"}
        self.max_attempts = int(definition.get("max_attempts") or 5)
        self.tool_class = str(definition.get("tool_class") or "")
        self.approval = dict(approval)
        self.approval_when = approval_words(approval)
        self.approver_role = str(approval.get("approver_role") or "operator")
        self.approval_timeout_seconds = int(approval.get("timeout_seconds") or 3600)
        self.approvers = int(approval.get("approvers") or 1)
        if approval.get("approvers_param"):
            self.approvers_when = (
                f"{approval['approvers_param']} above {approval['approvers_above']}"
            )

    def requires_approval(self, params: dict[str, Any]) -> bool:
        required = self.approval.get("required", "never")
        if required != "conditional":
            return required == "always"
        value = params.get(self.approval["param"])
        if isinstance(value, bool) or not isinstance(value, int | float):
            # The value the policy weighs is missing (or not a number): a person decides.
            return True
        return bool(value > self.approval["above"])

    def approvals_required(self, params: dict[str, Any]) -> int:
        param = self.approval.get("approvers_param")
        if not param:
            return self.approvers
        value = params.get(param)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self.approvers  # the value the rule weighs is missing: the stricter rule
        return self.approvers if value > self.approval["approvers_above"] else 1

    def supports(self, recorded_version: str) -> bool:
        if recorded_version in self.supported_versions:
            return True
        # A version declared since this process read the declarations: read them again.
        if not declared_refresh():
            return False
        fresh = adapters().get(self.name)
        return fresh is not None and recorded_version in fresh.supported_versions

    def at_version(self, version: str) -> ToolAdapter:
        if version in ("", self.version):
            return self
        return version_adapter(self.name, version)

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        tool = self.at_version(ctx.tool_version)
        assert isinstance(tool, Declared)
        return tool.call(ctx)

    def lookup(self, ctx: InvocationContext) -> ToolResult | None:
        tool = self.at_version(ctx.tool_version)
        assert isinstance(tool, Declared)
        return tool.ask(ctx)

    def call(self, ctx: InvocationContext) -> ToolResult:
        """Make the call as this version declares it."""
        raise NotImplementedError

    def ask(self, ctx: InvocationContext) -> ToolResult | None:
        """Ask the receiver what happened under the key, as this version declares it."""
        raise NotImplementedError


class AgentRun(Declared):
    """A step the agent runs and reports itself (executor=agent): the declaration gives it a
    name that means something, a parameter schema, a contract and an approval policy."""

    agent_run = True

    def call(self, ctx: InvocationContext) -> ToolResult:
        raise ToolFailure(
            ToolFailure.PERMANENT,
            f"{self.name} is run by the agent that proposes it (executor agent), not a worker",
        )


# The adapter class of each kind (runtime.tools.http adds the HTTP one as it is imported).
KINDS: dict[str, type[Declared]] = {DeclaredToolKind.AGENT: AgentRun}
# Every version this process built, by (name, version): a version never changes.
_BUILT: dict[tuple[str, int], Declared] = {}


def _built(row: DeclaredToolVersion) -> Declared:
    key = (row.tool_id, row.version)
    adapter = _BUILT.get(key)
    if adapter is None:
        adapter = KINDS[row.tool.kind](row)
        _BUILT[key] = adapter
    return adapter


def version_adapter(name: str, version: str) -> Declared:
    """The adapter of one version of a declared tool (read once, then kept). UnknownTool when
    there is no such version."""
    try:
        number = int(version)
    except ValueError:
        raise UnknownTool(f"no version {version!r} of {name!r}", tool=name) from None
    adapter = _BUILT.get((name, number))
    if adapter is not None:
        return adapter
    row = (
        DeclaredToolVersion.objects.select_related("tool")
        .filter(tool_id=name, version=number)
        .first()
    )
    if row is None:
        raise UnknownTool(f"no version {version!r} of {name!r}", tool=name)
    return _built(row)


class DatabaseDeclarations:
    """The declared tools as this process last read them (runtime.tools.base.DeclaredSource)."""

    def __init__(self) -> None:
        self.tools: dict[str, Declared] = {}
        self.seen: int | None = None

    def current(self) -> Mapping[str, ToolAdapter]:
        return self.tools

    def refresh(self) -> bool:
        # The number of versions only grows, and each declaration or edit adds one: a read that
        # finds the number unchanged finds nothing new. (Read before the rows: a version
        # committed in between is read now and makes the next look read them again, harmless.)
        with connection.cursor() as cursor:
            cursor.execute(_SQL["declared_versions_count"])
            seen = int(cursor.fetchone()[0])
        if seen == self.seen:
            return False
        rows = DeclaredToolVersion.objects.select_related("tool").filter(version=F("tool__version"))
        self.tools = {row.tool_id: _built(row) for row in rows}
        self.seen = seen
        return True


def declarations_forget() -> None:
    """Forget every declaration this process read (the next look reads them all again): for a
    process whose database was replaced under it, as a test's is rolled back. Rows never
    change nor go in a deployment, so nothing else needs it."""
    _BUILT.clear()
    declared_source_set(DatabaseDeclarations())


declared_source_set(DatabaseDeclarations())
