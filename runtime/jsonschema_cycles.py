"""Reference cycles in a JSON Schema from outside: ``{"$ref": "#"}``, ``{"allOf": [{"$ref":
"#"}]}`` and their kin make jsonschema recurse until a RecursionError, which ended a check (and
its operation, unresolved) in an exception. Found statically, before any document is read, with
references resolved as the validators resolve them (``runtime.jsonschema_engine``).

Own code, as jsonschema has no such analysis: a reference reached again through applicators that
apply their subschemas to the very same instance ($ref and its kin, allOf/anyOf/oneOf/not,
if/then/else, dependentSchemas) is a cycle; one under properties, items and the like consumes
the instance (a tree's schema refers to itself there) and ends with the document."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

from runtime import jsonschema_engine as engine

# Applicators that apply their subschemas to the very instance they are given (draft 3's
# "extends", "type" and "disallow" included): a cycle through these alone never ends.
_IN_PLACE = frozenset(
    {"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies"}
    | {"extends", "type", "disallow"}
)


def _children(key: str, value: Any, at: str) -> Iterator[tuple[dict[str, Any], str]]:
    """The objects under one keyword of a schema, with their JSON pointers."""
    stack: list[tuple[Any, str]] = []
    if key in engine.SCHEMA_MAPS and isinstance(value, dict):
        stack = [(sub, f"{at}/{_escape(name)}") for name, sub in value.items()]
    else:
        stack = [(value, at)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            yield node, where
        elif isinstance(node, list):
            stack.extend((item, f"{where}/{i}") for i, item in enumerate(node))


# (object, its place, its resolver, its specification, the in-place parent, the edge's label)
_Visit = tuple[dict[str, Any], str, Any, Any, "int | None", str]


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def reference_cycle(schema: Any) -> str | None:
    """Where ``schema`` has a reference that comes back to itself through applicators that do
    not descend into the instance ($ref and its kin, allOf/anyOf/oneOf/not, if/then/else,
    dependentSchemas): validating would never end. References under properties, items and the
    like consume the instance, and a recursive schema through them is fine. Resolution is the
    validators' own (a ``$dynamicRef``/``$recursiveRef`` counts every anchor it could reach).
    Returns the reference's place, or None. Pure; refuses nothing it cannot resolve (the
    verdict says unavailable of those)."""
    import referencing.jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    if not isinstance(schema, dict):
        return None
    cls = engine.validator_class(schema)
    root = cls(schema, registry=engine.local_registry())
    root_spec = referencing.jsonschema.specification_with(
        str(cls.ID_OF(cls.META_SCHEMA) or ""), default=referencing.Specification.OPAQUE
    )
    graph = _Graph()
    graph.walk((schema, "", root._resolver, root_spec, None, ""))
    graph.dynamic_edges()
    return _cycle(graph.edges)


class _Graph:
    """A schema's objects and its in-place edges: node -> [(target, the reference's place, or ""
    for a lexical child)]; a node is an object's id, or (keyword, reference) for the anchors a
    dynamic one may reach."""

    def __init__(self) -> None:
        self.nodes: dict[int, dict[str, Any]] = {}
        self.places: dict[int, str] = {}
        self.edges: dict[Hashable, list[tuple[Hashable, str]]] = {}
        self.dynamic: list[tuple[int, str, str]] = []  # (node, keyword, reference)

    def walk(self, first: _Visit) -> None:
        """Every object of the document in place first (so each is named by its own place),
        then what references reach outside them (inside "enum", say)."""
        import referencing.jsonschema  # noqa: PLC0415 (on first use, as reference_cycle)

        lexical: list[_Visit] = [first]
        referred: list[_Visit] = []
        while lexical or referred:
            node, at, resolver, spec, parent, label = (lexical or referred).pop()
            if parent is not None:
                self.edges[parent].append((id(node), label))
            if id(node) in self.nodes:
                continue
            self.nodes[id(node)] = node
            self.places[id(node)] = at
            self.edges[id(node)] = []
            dialect = node.get("$schema")
            if isinstance(dialect, str):
                spec = referencing.jsonschema.specification_with(dialect, default=spec)
            referred.extend(self._references(node, at, resolver, spec))
            lexical.extend(_lexical_children(node, at, resolver, spec))

    def _references(self, node: dict[str, Any], at: str, resolver: Any, spec: Any) -> list[_Visit]:
        """The objects ``node``'s references resolve to; its dynamic references noted."""
        import referencing.exceptions  # noqa: PLC0415 (on first use, as reference_cycle)

        found: list[_Visit] = []
        for keyword in engine.REF_KEYWORDS:
            ref = "#" if keyword == "$recursiveRef" else node.get(keyword)
            if keyword not in node or not isinstance(ref, str):
                continue
            if keyword != "$ref":
                self.dynamic.append((id(node), keyword, ref))
            try:
                resolved = resolver.lookup(ref)
            except (referencing.exceptions.Unresolvable, ValueError):
                # ValueError: an $id no URL parser takes ("http://[::1"). Validation cannot
                # follow this reference either: it says so, the verdict is unavailable.
                continue
            if isinstance(resolved.contents, dict):
                place = f"{at}/{keyword}"
                found.append((resolved.contents, place, resolved.resolver, spec, id(node), place))
        return found

    def dynamic_edges(self) -> None:
        """A dynamic reference may land on any anchor of its kind that the dynamic scope holds:
        an edge to one node per anchor, and from it to each anchor (not one edge per pair, which
        an agent could make quadratic)."""
        for object_id, node in self.nodes.items():
            anchor = node.get("$dynamicAnchor")
            if isinstance(anchor, str):
                self.edges.setdefault(("$dynamicRef", f"#{anchor}"), []).append((object_id, ""))
            if node.get("$recursiveAnchor") is True:
                self.edges.setdefault(("$recursiveRef", "#"), []).append((object_id, ""))
        for source, keyword, ref in self.dynamic:
            if (keyword, ref) in self.edges:
                self.edges[source].append(((keyword, ref), f"{self.places[source]}/{keyword}"))


def _lexical_children(node: dict[str, Any], at: str, resolver: Any, spec: Any) -> list[_Visit]:
    """The objects under ``node``'s keywords, each with the resolver of its own scope, linked to
    ``node`` where the keyword applies them in place."""
    found: list[_Visit] = []
    for key, value in node.items():
        if key in engine.DATA_KEYWORDS or key in engine.REF_KEYWORDS:
            continue
        for child, where in _children(key, value, f"{at}/{_escape(key)}"):
            try:
                inner = resolver.in_subresource(spec.create_resource(child))
            except ValueError:
                inner = resolver
            found.append((child, where, inner, spec, id(node) if key in _IN_PLACE else None, ""))
    return found


def _cycle(edges: dict[Hashable, list[tuple[Hashable, str]]]) -> str | None:
    """The place of a reference on a cycle of ``edges``, or None (an iterative depth-first
    search: a schema may be deeper than the interpreter's recursion limit)."""
    state: dict[Hashable, int] = {}  # 1 on the current path, 2 done
    for start in edges:
        if start in state:
            continue
        path: list[tuple[Hashable, str]] = [(start, "")]
        iters = [iter(edges[start])]
        state[start] = 1
        while iters:
            step = next(iters[-1], None)
            if step is None:
                state[path.pop()[0]] = 2
                iters.pop()
                continue
            target, label = step
            if state.get(target) == 1:
                loop = [lbl for node, lbl in path[[n for n, _ in path].index(target) + 1 :]]
                refs = [lbl for lbl in [*loop, label] if lbl]
                return refs[0] if refs else "(a subschema that contains itself)"
            if target not in state:
                state[target] = 1
                path.append((target, label))
                iters.append(iter(edges[target]))
    return None
