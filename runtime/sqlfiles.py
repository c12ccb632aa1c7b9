"""The runtime's hand-written SQL, read from named blocks in ``runtime/sql/*.sql`` once at import.

A file holds blocks, each headed by its name and an optional description::

    -- name: claim_one
    -- The common claim in one statement (comment lines right under the header describe the
    -- block; they are not sent).
    WITH prev AS ( ... )

A block is a statement a module runs, or a fragment other blocks include (the journal, outbox
and invocation rows several statements write). Slots are ``{{name}}``, and ``{{name
arg="text" ...}}`` with arguments; a slot is, in this order of lookup, an argument of the
fragment being included, a value the loading module passes (rendered from the rule tables:
status sets, the stop rule's predicate, the admission refusals; a callable takes the
arguments), or another block, included with its own slots filled. Single braces are SQL's own
(``'{}'::jsonb``) and ``%(name)s`` stays a bound parameter: nothing but ``{{...}}`` is
template, so the file reads as the SQL it sends. An included text keeps the indentation of
the line the slot is on; an argument may run over several lines, indented from that line.
Unknown slots, duplicate names and include cycles fail at import.

A module loads its statements once, at import (``queries``), with the values of its rule
tables; every text rendered is recorded (``RENDERED``), which the snapshot test compares with
``tests/runtime/sql_snapshots/`` so a reviewer reads the final SQL in the diff. Dialect
differences are separate blocks chosen by a capability of ``runtime.dialect``.

Why own code: Procrastinate reads its ``sql/queries.sql`` with a 30-line parser of its own too;
aiosql, the library for named SQL files, binds each query to a driver of its own and has no
includes or import-time values, while these statements must run through Django's cursor (the
statement counts and ``db.prepared_cursor``'s server-side binding) and be filled from the
rule tables."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent / "sql"

_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*)[ \t]*$", re.M)
_SLOT = re.compile(r"\{\{\s*([a-z][a-z0-9_]*)((?:\s+[a-z_]+=\"[^\"]*\")*)\s*\}\}")
_ARG = re.compile(r"([a-z_]+)=\"([^\"]*)\"")

Slot = str | Callable[..., str]


@dataclass(frozen=True)
class Block:
    name: str
    file: str
    description: str
    body: str


def parse(text: str, file: str = "<text>") -> dict[str, Block]:
    """The named blocks of one file's ``text``. Text before the first header is the file's
    own comment; a block with no SQL is refused."""
    blocks: dict[str, Block] = {}
    parts = _HEADER.split(text)
    for name, chunk in zip(parts[1::2], parts[2::2], strict=True):
        lines = chunk.strip("\n").splitlines()
        described = 0
        while described < len(lines) and lines[described].startswith("--"):
            described += 1
        body = "\n".join(lines[described:]).strip()
        if not body:
            raise ValueError(f"{file}: block {name} has no SQL")
        if name in blocks:
            raise ValueError(f"{file}: block {name} is named twice")
        description = " ".join(line.removeprefix("--").strip() for line in lines[:described])
        blocks[name] = Block(name, file, description, body)
    return blocks


def parse_dir(directory: Path = SQL_DIR) -> dict[str, Block]:
    """Every block of the directory's ``*.sql`` files; a name is unique across files."""
    found: dict[str, Block] = {}
    for path in sorted(directory.glob("*.sql")):
        for name, block in parse(path.read_text(), path.name).items():
            if name in found:
                raise ValueError(f"{path.name}: block {name} is also in {found[name].file}")
            found[name] = block
    return found


BLOCKS = parse_dir()
# What each loaded name rendered to, and the fragments each one included.
RENDERED: dict[str, str] = {}
INCLUDED: dict[str, set[str]] = {}


def render(
    name: str,
    slots: Mapping[str, Slot],
    blocks: Mapping[str, Block] = BLOCKS,
    included: set[str] | None = None,
) -> str:
    """Block ``name`` with its slots filled (see the module's docstring)."""
    return _fill(name, blocks[name].body, dict(slots), blocks, (name,), included)


def _fill(
    name: str,
    text: str,
    scope: dict[str, Slot],
    blocks: Mapping[str, Block],
    stack: tuple[str, ...],
    included: set[str] | None,
) -> str:
    def one(match: re.Match[str]) -> str:
        line = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
        indent = line[: len(line) - len(line.lstrip())]
        # An argument written over several lines is indented from its slot's line.
        args = {k: v.replace("\n" + indent, "\n") for k, v in _ARG.findall(match.group(2))}
        slot = match.group(1)
        value = scope.get(slot)
        if callable(value):
            out = value(**args)
        elif value is not None and not args:
            out = value
        elif slot in blocks and value is None:
            if slot in stack:
                raise ValueError(f"block {name}: include cycle {' > '.join((*stack, slot))}")
            if included is not None:
                included.add(slot)
            inner = {**scope, **args}
            out = _fill(slot, blocks[slot].body, inner, blocks, (*stack, slot), included)
        else:
            raise KeyError(f"block {name}: no value for {match.group(0)}")
        return out.replace("\n", "\n" + indent)

    return _SLOT.sub(one, text)


def queries(*names: str, slots: Mapping[str, Slot]) -> dict[str, str]:
    """The statements ``names``, rendered once with ``slots`` (the loading module's values of
    the rule tables), and recorded for the snapshot test. A name loaded twice must render the
    same text."""
    out = {}
    for name in names:
        included: set[str] = set()
        text = render(name, slots, included=included)
        if RENDERED.setdefault(name, text) != text:
            raise ValueError(f"block {name} is loaded twice with different values")
        INCLUDED[name] = included
        out[name] = text
    return out


def column_list(names: tuple[str, ...], alias: str = "", prefix: str = "", width: int = 88) -> str:
    """``alias.name`` for each of ``names`` (``AS prefixname`` with a ``prefix``, so that two
    rows joined in one result keep apart by name), wrapped to ``width``: the slot a statement
    writes for a model's columns."""
    items = [
        (f"{alias}.{name}" if alias else name) + (f" AS {prefix}{name}" if prefix else "")
        for name in names
    ]
    lines = [""]
    for item in items:
        if lines[-1] and len(lines[-1]) + len(item) + 2 > width:
            lines[-1] += ","
            lines.append("")
        lines[-1] += (", " if lines[-1] else "") + item
    return "\n  ".join(lines)
