"""The runtime's SQL as it is sent: every named statement of ``runtime/sql/*.sql``, rendered
with the rule tables' values, is pinned in ``tests/runtime/sql_snapshots/<name>.sql``, so a
change to a statement, a fragment or a rule shows in the diff as the final SQL.

After an intended change, regenerate the snapshots and read their diff::

    SQL_SNAPSHOTS=update .venv/bin/pytest -q tests/runtime/test_sql_snapshot.py
"""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from pathlib import Path

import pytest

from runtime import sqlfiles

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).resolve().parent / "sql_snapshots"
UPDATE = os.environ.get("SQL_SNAPSHOTS") == "update"


def _sources() -> dict[str, str]:
    found = {}
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        if "migrations" not in path.parts:
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path.read_text()
    return found


SOURCES = _sources()
# The modules that load statements (importing them renders their statements, once).
LOADERS = sorted(name for name, text in SOURCES.items() if re.search(r"\bqueries\(", text))
for _module in LOADERS:
    importlib.import_module(_module)


@pytest.mark.parametrize("name", sorted(sqlfiles.RENDERED))
def test_a_named_statement_renders_as_its_snapshot(name):
    text = sqlfiles.RENDERED[name] + "\n"
    path = SNAPSHOTS / f"{name}.sql"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"no snapshot for {name}: run with SQL_SNAPSHOTS=update"
    assert text == path.read_text(), f"{name} changed: run with SQL_SNAPSHOTS=update, read the diff"


def test_every_snapshot_is_of_a_statement_that_renders():
    stale = {p.stem for p in SNAPSHOTS.glob("*.sql")} - set(sqlfiles.RENDERED)
    if UPDATE:
        for name in stale:
            (SNAPSHOTS / f"{name}.sql").unlink()
        stale = set()
    assert not stale, f"snapshots of no statement: {sorted(stale)}"


def test_every_block_is_run_by_some_code_or_included_by_a_statement_that_is():
    included = set().union(*sqlfiles.INCLUDED.values())
    unused = set(sqlfiles.BLOCKS) - set(sqlfiles.RENDERED) - included
    assert not unused, f"blocks nothing loads or includes: {sorted(unused)}"
    for name in sqlfiles.RENDERED:
        # Loaded by name, and run by name: the module indexes its statements with it.
        runs = [m for m in LOADERS if re.search(rf'\[\s*"{name}"\s*\]', SOURCES[m])]
        assert runs, f"{name} is loaded but no module runs it"


def test_every_sql_file_is_made_of_named_blocks():
    for path in sorted(sqlfiles.SQL_DIR.glob("*.sql")):
        text = path.read_text()
        head = text.split("-- name: ", 1)[0]
        # Before the first block, only the file's comment.
        assert all(not line or line.startswith("--") for line in head.splitlines()), path.name
        assert sqlfiles.parse(text, path.name), f"{path.name} has no block"


def test_slots_fill_from_values_arguments_and_fragments_keeping_the_indentation():
    blocks = sqlfiles.parse(
        "-- file comment\n"
        "-- name: frag\n-- a fragment\nSELECT {{what}}\nFROM {{rows}}\n\n"
        # An argument over two lines is indented from its slot's line.
        '-- name: stmt\nWITH x AS (\n  {{frag rows="op\n  WHERE %(go)s"}}\n)\n'
        "SELECT '{}'::jsonb, {{alias_of name=\"t\"}} FROM x\n"
    )
    assert blocks["frag"].description == "a fragment"
    included: set[str] = set()
    slots: dict[str, sqlfiles.Slot] = {"what": "1", "alias_of": lambda name: f"{name}.id"}
    text = sqlfiles.render("stmt", slots, blocks, included)
    assert text == (
        "WITH x AS (\n  SELECT 1\n  FROM op\n  WHERE %(go)s\n)\nSELECT '{}'::jsonb, t.id FROM x"
    )
    assert included == {"frag"}


def test_an_unknown_slot_a_cycle_and_a_name_used_twice_are_refused():
    with pytest.raises(KeyError, match="nowhere"):
        sqlfiles.render("a", {}, sqlfiles.parse("-- name: a\nSELECT {{nowhere}}\n"))
    cycle = sqlfiles.parse("-- name: a\nSELECT {{b}}\n-- name: b\nSELECT {{a}}\n")
    with pytest.raises(ValueError, match="cycle"):
        sqlfiles.render("a", {}, cycle)
    with pytest.raises(ValueError, match="twice"):
        sqlfiles.parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")
    with pytest.raises(ValueError, match="no SQL"):
        sqlfiles.parse("-- name: a\n-- only a comment\n")


def test_the_sql_files_ship_with_the_package():
    """The runtime reads its SQL files at import: an installed copy without them cannot start."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = config["tool"]["setuptools"]["package-data"]["runtime"]
    files = {p.relative_to(ROOT / "runtime") for p in sqlfiles.SQL_DIR.glob("*.sql")}
    assert files and all(any(f.match(pattern) for pattern in shipped) for f in files)
