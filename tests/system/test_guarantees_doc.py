"""docs/guarantees.md cannot rot: each of the seed's eight interruption rows is there with at
least one test, and every test it names exists (read by AST, so nothing is imported or run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guarantees.md"
NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
ROWS = 8


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {p.splitlines()[0].strip(): p for p in parts}


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test_"
        ):
            names.add(node.name)
    return names


def named_tests(text: str) -> list[tuple[str, str]]:
    return NODE.findall(text)


def missing_tests(text: str) -> list[str]:
    missing = []
    for rel, name in named_tests(text):
        path = ROOT / rel
        if not path.is_file() or name not in _test_names(path):
            missing.append(f"{rel}::{name}")
    return missing


def test_the_page_has_the_eight_rows_each_with_a_test():
    sections = _sections(PAGE.read_text())
    numbered = [title for title in sections if re.match(r"\d+\. ", title)]
    assert [int(t.split(".")[0]) for t in numbered] == list(range(1, ROWS + 1))
    for title in numbered:
        assert named_tests(sections[title]), f"row {title!r} names no test"


def test_every_test_the_page_names_exists():
    assert missing_tests(PAGE.read_text()) == []


def test_a_name_that_does_not_exist_is_caught():
    """The check itself bites: a misspelt test or file is reported."""
    page = (
        "`tests/runtime/test_worker_recovery.py::test_no_such_test`\n"
        "`tests/runtime/no_such_file.py::test_x`\n"
        "`tests/runtime/test_worker_recovery.py::"
        "test_child_killed_mid_operation_completes_once_under_a_newer_generation`\n"
    )
    assert missing_tests(page) == [
        "tests/runtime/test_worker_recovery.py::test_no_such_test",
        "tests/runtime/no_such_file.py::test_x",
    ]


def test_the_readme_links_the_page():
    assert "docs/guarantees.md" in (ROOT / "README.md").read_text()
