"""A team's own tools: the modules ``TOOL_MODULES`` names and the entry points of the group
``agent_console.tools`` (docs/tools.md), loaded once at start by every process of a deployment
(the web, each worker, beat: runtime.apps), so that all of them offer the same catalogue.

Loading is all or none. Each source is imported with registrations set aside
(runtime.tools.base.registrations_captured); then every tool set aside is checked (its name
free, a version it supports, its parameter schema valid, its contract's methods present...). A
single problem refuses the whole start with every problem named by its source, and no tool of
any source joins the registry: a process never serves half a catalogue, and a worker never runs
a call under a name that means something else elsewhere.

A source is ``package.module`` (its import registers its tools) or ``package.module:attr``, the
syntax of an entry point's value, where ``attr`` is a function that registers them (called with
no arguments) or a ToolAdapter subclass or instance (registered)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from runtime.actors import ROLES
from runtime.errors import DomainError
from runtime.tools.base import (
    Contract,
    ToolAdapter,
    adapters,
    register,
    registered,
    registrations_captured,
    registry_extend,
)

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agent_console.tools"
# What an operation row can hold (runtime.models: tool 200, tool_version 64 characters).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")
_SOURCE = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?")
_VERSION_MAX = 64

# Where each loaded tool came from (``manage.py tools``); a tool not named here is built in.
_ORIGINS: dict[str, str] = {}


@dataclass(frozen=True)
class ToolSource:
    """One place user tools come from: ``label`` names it in messages."""

    label: str
    load: Callable[[], Any]


def tool_sources(modules: Sequence[str] | str, group: str = ENTRY_POINT_GROUP) -> list[ToolSource]:
    """The ``TOOL_MODULES`` entries (a list, or one comma-separated string), then the entry
    points installed under ``group`` (by distribution and name, so every process orders them
    alike)."""
    if isinstance(modules, str):
        modules = modules.split(",")
    sources = []
    for raw in modules:
        path = raw.strip()
        if path:
            sources.append(ToolSource(f"TOOL_MODULES entry {path!r}", _path_loader(path)))
    found = sorted(
        entry_points(group=group),
        key=lambda ep: (ep.dist.name if ep.dist else "", ep.name),
    )
    for ep in found:
        dist = f" of {ep.dist.name} {ep.dist.version}" if ep.dist else ""
        sources.append(ToolSource(f"entry point {ep.name!r} ({ep.value}){dist}", ep.load))
    return sources


def _path_loader(path: str) -> Callable[[], Any]:
    def load() -> Any:
        if not _SOURCE.fullmatch(path):
            raise ValueError("not an import path (package.module or package.module:attribute)")
        return EntryPoint(name=path, value=path, group="TOOL_MODULES").load()

    return load


def tools_load(modules: Sequence[str] | str, group: str = ENTRY_POINT_GROUP) -> list[ToolAdapter]:
    """Load the user tools of ``modules`` and of the entry points of ``group``, all or none
    (the module docstring). Raises ImproperlyConfigured naming each source and its problem;
    then nothing was registered. Call once per process, at start."""
    problems: list[str] = []
    loaded: list[tuple[ToolSource, ToolAdapter]] = []
    for source in tool_sources(modules, group):
        try:
            with registrations_captured() as captured:
                _register_object(source.load())
        except Exception as exc:
            problems.append(f"{source.label} could not be loaded: {type(exc).__name__}: {exc}")
            continue
        if not captured:
            problems.append(
                f"{source.label} registered no tool (a module registers its tools when first "
                "imported: was it imported before the console loaded it?)"
            )
        loaded.extend((source, adapter) for adapter in captured)

    names = {adapter.name for _, adapter in loaded}
    first: dict[str, ToolSource] = {}
    for source, adapter in loaded:
        where = f"{source.label}: tool {adapter.name!r}"
        if registered(adapter.name):
            problems.append(f"{where}: a tool of that name is built in")
        elif adapter.name in first:
            other = first[adapter.name]
            also = "" if other is source else f" (also by {other.label})"
            problems.append(f"{where}: registered twice{also}")
        else:
            first[adapter.name] = source
        problems.extend(f"{where}: {problem}" for problem in tool_problems(adapter, names))
    if problems:
        raise ImproperlyConfigured(
            "user tools refused, none loaded (docs/tools.md):\n  - " + "\n  - ".join(problems)
        )
    registry_extend([adapter for _, adapter in loaded])
    for source, adapter in loaded:
        _ORIGINS[adapter.name] = source.label
    if loaded:
        log.info("user tools loaded: %s", ", ".join(sorted(names)))
    return [adapter for _, adapter in loaded]


def _register_object(obj: Any) -> None:
    """What a source's import path names: a module registered its tools by being imported; an
    adapter (class or instance) is registered; a function registers them when called."""
    if isinstance(obj, ModuleType):
        return
    if isinstance(obj, type) and issubclass(obj, ToolAdapter):
        obj = obj()
    if isinstance(obj, ToolAdapter):
        register(obj)  # set aside by the capture, as a module's own call is
    elif callable(obj):
        obj()
    else:
        raise TypeError(f"{obj!r} is neither a module, a tool adapter nor a function")


def _overrides(adapter: ToolAdapter, method: str) -> bool:
    return getattr(type(adapter), method) is not getattr(ToolAdapter, method)


def tool_problems(adapter: ToolAdapter, names: Iterable[str] = ()) -> list[str]:
    """What keeps ``adapter`` out of a catalogue, in words ([] when nothing does). ``names``:
    the other tools loaded with it (a compensation tool may be one of them). A tool package's
    own tests call it (examples/tools-package)."""
    problems = []
    name = adapter.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(
            "its name must be 1 to 200 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    problems.extend(_version_problems(adapter))
    if adapter.contract not in Contract.ALL:
        problems.append(f"contract {adapter.contract!r} is not one of {', '.join(Contract.ALL)}")
    if not _overrides(adapter, "invoke"):
        problems.append("it does not implement invoke")
    if adapter.contract == Contract.LOOKUP and not _overrides(adapter, "lookup"):
        problems.append("its contract is lookup but it does not implement lookup")
    problems.extend(_schema_problems(adapter))
    problems.extend(_approval_problems(adapter))
    compensation = adapter.compensation_tool
    if compensation:
        if compensation not in set(names) and not registered(compensation):
            problems.append(f"its compensation_tool {compensation!r} is not a tool")
        if not _overrides(adapter, "compensation_params"):
            problems.append(
                "it names a compensation_tool but does not implement compensation_params"
            )
    if not _positive_int(adapter.max_attempts):
        problems.append("max_attempts must be a whole number of at least 1")
    return problems


def _version_problems(adapter: ToolAdapter) -> list[str]:
    version = adapter.version
    if not isinstance(version, str) or not version.strip() or len(version) > _VERSION_MAX:
        return [f"it has no version (a non-empty string of at most {_VERSION_MAX} characters)"]
    supported = adapter.supported_versions
    if not isinstance(supported, tuple | list) or version not in supported:
        # Every claim of its own new operations would be refused as a version mismatch.
        return [f"its version {version!r} is not among its supported_versions {supported!r}"]
    return []


def _schema_problems(adapter: ToolAdapter) -> list[str]:
    declared = "params_schema" in type(adapter).__dict__ or "params_schema" in vars(adapter)
    if not declared:
        return ["it declares no params_schema"]
    schema = adapter.params_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return ['its params_schema must be a JSON Schema with "type": "object"']
    try:
        adapter.params_validator  # noqa: B018 (compiled here, at start, not at a first call)
    except DomainError as exc:
        return [f"invalid params_schema: {exc.message}"]
    except Exception as exc:
        return [f"invalid params_schema: {type(exc).__name__}: {exc}"]
    return []


def _approval_problems(adapter: ToolAdapter) -> list[str]:
    problems = []
    asks = _overrides(adapter, "requires_approval")
    if asks and not adapter.approval_when:
        problems.append(
            "it overrides requires_approval but approval_when is empty (the catalogue would "
            "say it never needs approval)"
        )
    if adapter.approval_when and not asks:
        problems.append(
            "approval_when is set but requires_approval is not overridden (it would never ask)"
        )
    if adapter.approver_role not in ROLES:
        problems.append(f"approver_role {adapter.approver_role!r} is not one of {', '.join(ROLES)}")
    if not _positive_int(adapter.approval_timeout_seconds):
        problems.append("approval_timeout_seconds must be a whole number of at least 1")
    return problems


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def tool_origin(name: str) -> str:
    """Where a tool of this process came from: the source that loaded it, "declared in the
    console" (runtime.tools.declared), or "built in"."""
    if name in _ORIGINS:
        return _ORIGINS[name]
    adapter = adapters().get(name)
    if adapter is not None and adapter.declared:
        return f"declared in the console (version {adapter.version})"
    return "built in"
