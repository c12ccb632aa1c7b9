from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

from runtime.errors import InvalidInput, UnknownTool
from runtime.jsonschemas import json_instance_check, json_schema_compile
from runtime.keys import key_step


class Contract:
    """What the receiver promises when the same key arrives twice."""

    PURE = "pure"  # no external effect: repeating is always safe
    REPLAY = "replay"  # the receiver dedupes by key and returns the first result
    LOOKUP = "lookup"  # the receiver can be asked what happened under a key
    NONE = "none"  # no promise: an unconfirmed call goes to a person
    ALL = (PURE, REPLAY, LOOKUP, NONE)


@dataclass(frozen=True)
class InvocationContext:
    operation_id: str
    task_id: str
    step: str
    idempotency_key: str
    params: dict[str, Any]
    # The lease generation travels to the receiver as a fencing token.
    fencing_token: int
    invocation_number: int
    deadline: datetime | None
    heartbeat: Callable[[], bool] = field(default=lambda: False)
    # The tool version the operation was recorded under ("": the tool's current one): a tool
    # declared in the console runs the definition of that version (runtime.tools.declared).
    tool_version: str = ""

    def remaining_seconds(self, now: datetime | None = None) -> float | None:
        """What is left of the deadline: adapters pass it on to receivers (a header or a
        parameter), so a receiver does not start what cannot finish in time."""
        if self.deadline is None:
            return None

        return max(0.0, (self.deadline - (now or timezone.now())).total_seconds())


@dataclass
class ToolResult:
    result: Any
    usage: dict[str, float] = field(default_factory=dict)
    receipt: dict[str, Any] | None = None
    provider_handle: str = ""


class ToolFailure(Exception):
    """A classified failure of one invocation."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"  # the effect may have happened

    def __init__(self, kind: str, message: str, *, receipt: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.receipt = receipt


class ToolAdapter:
    name: str = ""
    version: str = "1"
    # Versions of recorded operations this code can still run faithfully.
    supported_versions: tuple[str, ...] = ("1",)
    contract: str = Contract.PURE
    max_attempts: int = 5
    # Retries stop once this long has passed since the first attempt.
    max_elapsed_seconds: float | None = 3600.0
    demo: bool = False
    # Proposed by the runtime itself only (the notification adapters): an agent may neither
    # propose it (400 unknown_tool, as for a tool that does not exist) nor see it in the
    # catalogue, so no caller can send the console's mail or sign its webhooks.
    system_only: bool = False
    # Run by the agent that proposes it only (executor=agent: model.call, a declared agent-run
    # tool): there is nothing for a worker to call, so a proposal for a worker is refused.
    agent_run: bool = False
    # False for a tool still run for the work recorded under it but no longer offered (a
    # declared tool an admin retired): out of the catalogue, and a proposal is unknown_tool.
    offered: bool = True
    # Declared in the console (runtime.tools.declared): its definition lives in the database,
    # so the process asks there whether it changed before a proposal takes it.
    declared: bool = False
    # Admission control groups tools into classes (TOOL_CONCURRENCY, TOOL_QUEUE_CAPACITY); a
    # tool without one is a class of its own.
    tool_class: str = ""
    # Calls that finish in milliseconds in this process (no network, no waiting) may be run by
    # a drainer, back to back with others under leases claimed together (runtime.drainers).
    # ``quick`` may still decline a call by its parameters.
    quick_calls: bool = False

    def quick(self, params: dict[str, Any]) -> bool:
        return self.quick_calls

    # Calls that spend their time waiting (on the network: a model, an HTTP API), not
    # computing: a worker process runs up to TOOL_SLOTS of them side by side, each under its own
    # lease (runtime.slots). An adapter whose ``invoke`` is ``async def`` waits too (``waits``).
    io_bound: bool = False

    # What the tool does, in a sentence (the catalogue, GET /api/v1/tools).
    description: str = ""
    # The parameters this tool accepts, as a JSON Schema (published in the catalogue): the one
    # rule proposals and edits are held to. ``check`` adds only what a schema cannot say.
    params_schema: dict[str, Any] = {"type": "object"}

    @cached_property
    def params_validator(self) -> Any:
        return json_schema_compile(self.params_schema)

    def validate(self, params: dict[str, Any]) -> None:
        """Raise InvalidInput, naming the field, for parameters this tool can never accept:
        what ``params_schema`` refuses, then what ``check`` refuses."""
        require_mapping(params)
        json_instance_check(params, self.params_validator, "params", subject=self.name)
        self.check(params)

    def check(self, params: dict[str, Any]) -> None:
        """Rules on ``params`` (already valid against ``params_schema``) that a JSON Schema
        cannot express."""

    # When ``requires_approval`` says yes, in words for the catalogue: "" never, "always", or
    # the condition ("amount_cents above 10000"). tests/api/test_tool_catalogue.py holds a tool
    # that overrides requires_approval to saying when.
    approval_when: str = ""

    def requires_approval(self, params: dict[str, Any]) -> bool:
        return False

    # Approval policy: who may release this tool's gated calls, and how long a request waits
    # for a decision unless the operation says otherwise (approval_timeout_seconds).
    approver_role: str = "operator"
    approval_timeout_seconds: int = 3600
    # The two-person rule: how many distinct people must approve a gated call (fixed on its
    # approval when requested); ``approvers`` at most, when ``approvers_when`` says ("" always).
    approvers: int = 1
    approvers_when: str = ""

    def approvals_required(self, params: dict[str, Any]) -> int:
        return self.approvers

    def invoke(self, ctx: InvocationContext) -> ToolResult:
        raise NotImplementedError

    def lookup(self, ctx: InvocationContext) -> ToolResult | None:
        """Ask the receiver what happened under ``ctx.idempotency_key`` (lookup contract)."""
        raise NotImplementedError

    # Sagas: the tool that undoes this one's effect, and its parameters from the result.
    compensation_tool: str | None = None

    def compensation_params(self, result: Any) -> dict[str, Any]:
        raise NotImplementedError

    def key_for(
        self,
        task_id: str,
        step: str,
        params: dict[str, Any],
        intent_version: int,
        attempt: int = 1,
    ) -> str:
        """The operation's idempotency key when the agent gives none (step-effect domain); a
        new attempt is a new pursuit, so its keys differ from the earlier attempt's."""
        return key_step(task_id, step, self.name, intent_version, attempt=attempt)

    def supports(self, recorded_version: str) -> bool:
        return recorded_version in self.supported_versions

    def at_version(self, version: str) -> ToolAdapter:
        """The adapter that runs work recorded under ``version``: this one for a tool in code
        (its ``supports`` says whether it can); a declared tool's adapter of that version."""
        return self


class DeclaredSource(Protocol):
    """Where tools declared without code come from (runtime.tools.declared_registry installs
    the database's): the process keeps what it read and asks again only when told to."""

    def current(self) -> Mapping[str, ToolAdapter]:
        """The declared tools as last read, by name (no statement)."""
        ...

    def refresh(self) -> bool:
        """Read the declarations again if they changed since the last read (one statement when
        they did not); True when they did."""
        ...


_REGISTRY: dict[str, ToolAdapter] = {}
# The visible adapters, by DEMO_TOOLS; emptied by each registration. Every proposal and claim
# asks for them several times, and rebuilding the dict each time showed in the profile.
_VISIBLE: dict[bool, _Catalogue] = {}
_declared: DeclaredSource | None = None
_refreshing = threading.Lock()


class _Catalogue(dict[str, ToolAdapter]):
    """The visible tools by name. A name it lacks may be a tool an admin declared since this
    process last read the declarations (in any process): before ``get`` or ``[]`` answer "no
    such tool" they have them read again (``declared_refresh``), so a declaration is seen
    everywhere without a restart, and a tool that is found costs nothing (a built-in one never
    a statement)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        found = _missed(name)
        return default if found is None else found

    def __missing__(self, name: str) -> ToolAdapter:
        found = _missed(name)
        if found is None:
            raise KeyError(name)
        return found

    # ``name in catalogue`` is a look at what the process holds (no statement): a drainer asks
    # it of quick tools, which are never declared ones.


def _missed(name: str) -> ToolAdapter | None:
    """A name the catalogue lacks, once the declarations were read again (None: still none).
    A name of the code's own tools (a demo tool while DEMO_TOOLS is off) or no name at all (a
    wait's) is never a declared one: no statement for those."""
    if not name or name in _REGISTRY or _declared is None:
        return None
    # Looked up again whatever the read found: a thread that waited for another's read (which
    # found the tool) finds nothing new itself, and the tool is there all the same.
    declared_refresh()
    return dict.get(adapters(), name)


def declared_source_set(source: DeclaredSource | None) -> None:
    """Install where declared tools come from (runtime.tools.declared_registry, at import)."""
    global _declared
    _declared = source
    _VISIBLE.clear()


def declared_refresh() -> bool:
    """Have the declared tools read again if they changed (one statement when they did not);
    True when the catalogue changed. Preconditions: none (a process without the declarations'
    table, before its migration, reads none)."""
    if _declared is None:
        return False
    with _refreshing:
        changed = _declared.refresh()
        if changed:
            _VISIBLE.clear()
    return changed


# While runtime.tools.loading imports a user's tool module, ``register`` sets its tools aside
# here: the loader checks them all before any joins the registry (all or none).
_captured: list[ToolAdapter] | None = None


def register(adapter: ToolAdapter) -> ToolAdapter:
    """Add a tool to this process's catalogue. The console's own modules call it at import;
    a team's tool modules call it when the console loads them (docs/tools.md)."""
    if not adapter.name:
        raise ValueError("a tool adapter needs a name")
    if _captured is not None:
        _captured.append(adapter)
        return adapter
    _REGISTRY[adapter.name] = adapter
    _VISIBLE.clear()
    return adapter


@contextmanager
def registrations_captured() -> Iterator[list[ToolAdapter]]:
    """Within, ``register`` collects into the list yielded instead of registering (the loader
    of user tools); nothing joins the registry."""
    global _captured
    if _captured is not None:
        raise RuntimeError("tool registrations are already being captured")
    _captured = []
    try:
        yield _captured
    finally:
        _captured = None


def registry_extend(batch: Sequence[ToolAdapter]) -> None:
    """Add tools checked together (runtime.tools.loading) in one step."""
    _REGISTRY.update({adapter.name: adapter for adapter in batch})
    _VISIBLE.clear()


def registered(name: str) -> bool:
    """Whether any tool, visible or not (demo tools with DEMO_TOOLS off), has this name."""
    return name in _REGISTRY


def adapters() -> dict[str, ToolAdapter]:
    """The adapters this deployment offers, by name (read-only: shared between callers)."""
    demo = bool(settings.DEMO_TOOLS)
    visible = _VISIBLE.get(demo)
    if visible is None:
        visible = _Catalogue({name: a for name, a in _REGISTRY.items() if demo or not a.demo})
        if _declared is not None:
            for name, adapter in _declared.current().items():
                # The code's tools keep their names (a declaration of one is refused; a tool
                # module loaded later with a declared tool's name wins over the declaration).
                if name not in _REGISTRY:
                    dict.__setitem__(visible, name, adapter)
        _VISIBLE[demo] = visible
    return visible


def adapter_for(name: str) -> ToolAdapter:
    """The tool of this name as it is now (for a proposal: a declared tool's newest version,
    read again from the database when it changed). UnknownTool when there is none."""
    adapter = adapters().get(name)
    if adapter is not None and adapter.declared and declared_refresh():
        adapter = adapters().get(name)
    if adapter is None:
        raise UnknownTool(f"no tool named {name!r}", tool=name)
    return adapter


def adapter_at(name: str, version: str) -> ToolAdapter:
    """The adapter that runs work recorded under ``name`` at ``version`` (a declared tool's
    definition of that version). UnknownTool when there is no tool of that name."""
    adapter = adapters().get(name)
    if adapter is None:
        raise UnknownTool(f"no tool named {name!r}", tool=name)
    return adapter.at_version(version)


def waits(adapter: ToolAdapter) -> bool:
    """Whether the tool's calls wait rather than compute: ``io_bound``, or an ``async def``
    invoke. Such calls run in a worker process's slots (runtime.slots), never in a drainer's
    batch."""
    return bool(adapter.io_bound) or inspect.iscoroutinefunction(adapter.invoke)


def contract_of(tool: str) -> str:
    """The receiver contract of a tool; a tool this code no longer has promises nothing."""
    adapter = adapters().get(tool)
    return adapter.contract if adapter is not None else Contract.NONE


def require_mapping(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise InvalidInput("params must be a JSON object", field="params")
    return params


def tool_catalogue() -> list[dict[str, Any]]:
    """What each tool this deployment offers is, promises and accepts, by name (pure: the
    registry, with the declared tools as last read: a caller that shows it to people or agents
    calls ``declared_refresh`` first). Anyone who may call the API may read it."""
    return [_entry(a) for name, a in sorted(adapters().items()) if not a.system_only and a.offered]


def _entry(adapter: ToolAdapter) -> dict[str, Any]:
    when = adapter.approval_when
    return {
        "name": adapter.name,
        "version": adapter.version,
        "description": adapter.description,
        "contract": adapter.contract,
        "approval": {
            "required": "never" if not when else "always" if when == "always" else "conditional",
            "when": None if when in ("", "always") else when,
            "approver_role": adapter.approver_role if when else None,
            "timeout_seconds": adapter.approval_timeout_seconds if when else None,
            "approvers": adapter.approvers if when else None,
            "approvers_when": (adapter.approvers_when or None) if adapter.approvers > 1 else None,
        },
        "params_schema": adapter.params_schema,
        "compensation_tool": adapter.compensation_tool,
        "max_attempts": adapter.max_attempts,
        "demo": adapter.demo,
        # Who runs its calls: a worker-run tool may also be run by an agent (executor=agent).
        "executors": ["agent"] if adapter.agent_run else ["worker", "agent"],
        "declared": adapter.declared,
    }
