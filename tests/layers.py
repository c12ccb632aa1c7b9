"""The import contract, checked by ``make lint`` (``python -m tests.layers``) and by the suite.

- Modules of ``runtime`` and of ``console`` import each other without cycles (imports at module
  level, those under ``if TYPE_CHECKING:`` included: a type-only import is still a cycle the
  layout should not need).
  Function-level imports, the usual way to dodge a cycle, are refused by ruff's PLC0415.
- ``runtime`` never imports ``console``: the domain knows nothing of HTTP.
- ``runtime.worker`` (the Celery tasks) is the top of the runtime: nothing imports it; work is
  published by task name (``runtime.publish``).
- The bottom layer (models, the transition tables, the rule tables of ``runtime.rules``,
  errors, ids, keys, hashing, text rules, the SQL files' loader) imports nothing of the runtime
  above it: a rule is a table over models and transitions, never a service.
- Above it the layers of ``LAYERS``, in order, and no module imports a module of a layer above
  its own: the foundation the writers consult (database, journal, outbox, rights, ledgers, tool
  adapters), the selectors (reads), the one status writer and the one insert, the reactions a
  transition applies (what follows a settled operation, sagas, attempts, pause, the approval
  gate, task creation), the transitions (runtime/transitions/: one module per transition), the
  services people and agents call, the worker side (executor, sweeper, Celery tasks), the
  simulation, and the console on top.
- Sizes (limits in ``pyproject.toml``, ``[tool.agent_console.limits]``): no module of ``runtime``
  over ``module_lines`` lines, no function of ``runtime`` or ``console`` over ``function_lines``
  (ruff's complexity rules, C901 and PLR0912/PLR0915, bound their branches and statements). A
  module still being split is named in ``PENDING_SIZES`` until it is; the list only shrinks.

Prints each breach and exits 1 when there is one."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "console")
TOP = "runtime.worker"
BOTTOM = (
    "runtime.models",
    "runtime.rules.statuses",
    "runtime.errors",
    "runtime.ids",
    "runtime.keys",
    "runtime.hashing",
    "runtime.text",
    "runtime.crashpoints",
    "runtime.sqlfiles",
    "runtime.tracing",
    "runtime.rules",
)


# The layers above the bottom one, lowest first; a module belongs to the layer of its longest
# matching prefix, and a runtime module named nowhere is a service.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bottom", BOTTOM),
    (
        "foundation",
        (
            *("runtime.db", "runtime.dialect", "runtime.events", "runtime.outbox"),
            *("runtime.publish", "runtime.drainers", "runtime.lease_tokens", "runtime.keyring"),
            *("runtime.actors", "runtime.specs", "runtime.stoprule", "runtime.notify_events"),
            *("runtime.logcontext", "runtime.history", "runtime.address_guard"),
            *("runtime.artifact_store", "runtime.jsonschemas", "runtime.jsonschema_engine"),
            *("runtime.jsonschema_cycles", "runtime.notify_secrets", "runtime.executions"),
            *("runtime.ratelimit_counters", "runtime.ratelimits", "runtime.tokens"),
            *("runtime.accounts", "runtime.schedule_owners", "runtime.admission"),
            *("runtime.budgets", "runtime.budget_allocations", "runtime.children"),
            *("runtime.slots", "runtime.sandbox", "runtime.tools", "runtime.policy"),
            *("runtime.policy_features", "runtime.approval_seal", "runtime.checkers"),
        ),
    ),
    ("selectors", ("runtime.selectors",)),
    (
        "status writer",
        (
            *("runtime.transitions.status", "runtime.transitions.insert"),
            *("runtime.transitions.rejections", "runtime.transitions.fast"),
        ),
    ),
    (
        "reactions",
        (
            *("runtime.reactor", "runtime.compensation", "runtime.attempts"),
            *("runtime.control", "runtime.approval_gate", "runtime.tasks"),
            "runtime.approval_votes",
        ),
    ),
    ("transitions", ("runtime.transitions",)),
    ("services", ("runtime",)),
    ("worker", ("runtime.executor", "runtime.sweeper", TOP)),
    ("simulation", ("runtime.simulation",)),
    ("console", ("console",)),
)


def layer_of(module: str) -> int:
    """The index in LAYERS of the layer ``module`` belongs to (its longest matching prefix)."""
    best, found = -1, len(LAYERS) - 1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(f"{prefix}.")) and len(prefix) > best:
                best, found = len(prefix), index
    return found


# Modules and functions over the limits while issue 35 splits them: each entry leaves this list
# when it is split, and nothing joins it.
PENDING_SIZES: frozenset[str] = frozenset()


def limits() -> dict[str, int]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)["tool"]["agent_console"]["limits"]


def oversized() -> list[str]:
    """Modules of runtime over module_lines and functions over function_lines, by name
    (``module`` or ``module:function``), pending ones left out."""
    bounds = limits()
    found = []
    for name, path in sorted(modules().items()):
        text = path.read_text()
        if name.startswith("runtime") and len(text.splitlines()) > bounds["module_lines"]:
            found.append((name, f"{len(text.splitlines())} lines"))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > bounds["function_lines"]:
                    found.append((f"{name}:{node.name}", f"{length} lines"))
    return [f"{where} is {size}" for where, size in found if where not in PENDING_SIZES]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements at module level, into if/try blocks (``if TYPE_CHECKING:`` included)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            stack.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                stack.extend(handler.body)
        else:
            yield node


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports at module level."""

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _module_level(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            module = resolve(target)
            if module and module != name and not name.startswith(f"{module}."):
                found.add(module)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def breaches(edges: dict[str, set[str]] | None = None) -> list[str]:
    edges = graph() if edges is None else edges
    problems = [f"import cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    for module, targets in sorted(edges.items()):
        if module.startswith("runtime") and any(t.startswith("console") for t in targets):
            problems.append(f"{module} imports console (the domain knows nothing of HTTP)")
        if TOP in targets:
            problems.append(f"{module} imports {TOP} (publish by task name: runtime.publish)")
        if module.startswith(BOTTOM):
            above = sorted(
                t for t in targets if t.startswith("runtime") and not t.startswith(BOTTOM)
            )
            if above:
                problems.append(f"{module} (bottom layer) imports {', '.join(above)}")
        upward = sorted(t for t in targets if layer_of(t) > layer_of(module))
        if upward and not module.startswith(BOTTOM):
            own = LAYERS[layer_of(module)][0]
            names = ", ".join(f"{t} ({LAYERS[layer_of(t)][0]})" for t in upward)
            problems.append(f"{module} ({own}) imports upward: {names}")
    return problems


def main() -> int:
    problems = breaches() + oversized()
    for problem in problems:
        print(problem)
    if not problems:
        print(f"layers: {len(modules())} modules, no cycle, no layer breached")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
