"""A dialect difference is a named capability (``runtime/dialect.py``), never a comparison of
``connection.vendor``; a service's transaction is named by its entry (``x()`` opens its own,
``x_txn()`` runs in the caller's), never decided by probing Django's open blocks.

Migrations ask the capabilities of ``runtime/migrations/_dialect.py``, frozen with them (they are
history and import no runtime module that may change after them). Exception: ``runtime/db.py``
reads the open blocks to refuse a broken precondition (``outside_transaction``,
``durable_statement``), never to choose a path."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIALECT = "runtime/dialect.py"
MIGRATIONS_DIALECT = "runtime/migrations/_dialect.py"
GUARDS = "runtime/db.py"
PROBES = {"atomic_blocks", "in_atomic_block", "get_autocommit"}
# Files still comparing a vendor while they move to runtime.dialect (none left): the test below
# fails on an entry whose file stopped comparing.
PENDING: set[str] = set()


def _vendor(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "vendor"


def vendor_comparisons(source: str) -> list[int]:
    """Lines comparing a ``.vendor`` with anything (``==``, ``!=``, ``in``...)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(map(_vendor, [node.left, *node.comparators]))
    )


def transaction_probes(source: str) -> list[int]:
    """Lines reading whether a transaction is open: Django's ``atomic_blocks`` or
    ``in_atomic_block`` (as an attribute or a ``getattr`` name), or ``get_autocommit``."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if (isinstance(node, ast.Attribute) and node.attr in PROBES)
        or (isinstance(node, ast.Constant) and node.value in PROBES)
    )


def _sources(*folders: str) -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "migrations" not in path.parts or folder == "runtime/migrations"
    }


def breaches() -> list[str]:
    found = []
    sources = _sources("runtime", "console", "tests", "runtime/migrations")
    for name, source in sources.items():
        if name in (DIALECT, MIGRATIONS_DIALECT, "tests/test_dialect_lint.py") or name in PENDING:
            continue
        found += [f"{name}:{line}: ask runtime.dialect" for line in vendor_comparisons(source)]
    for name, source in _sources("runtime").items():
        if name != GUARDS:
            found += [f"{name}:{line}: name the entry" for line in transaction_probes(source)]
    return found


def test_no_vendor_comparison_and_no_transaction_probe_outside_their_places():
    assert breaches() == []


def test_each_pending_exception_still_compares():
    for name in PENDING:
        path = ROOT / name
        assert not path.exists() or vendor_comparisons(path.read_text()), (
            f"{name} no longer compares a vendor: drop it from PENDING"
        )


def test_the_checks_find_what_they_refuse():
    source = (
        "postgres = connection.vendor == 'postgresql'\n"
        "if 'sqlite' != conn.vendor:\n"
        "    pass\n"
        "print(connection.vendor)\n"
    )
    assert vendor_comparisons(source) == [1, 2]
    source = (
        "own = connection.in_atomic_block\n"
        "blocks = getattr(connection, 'atomic_blocks', [])\n"
        "x = transaction.get_autocommit()\n"
        "with transaction.atomic():\n"
        "    pass\n"
    )
    assert transaction_probes(source) == [1, 2, 3]
