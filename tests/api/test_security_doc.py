"""docs/security.md shows the authorization matrix that tests/api/test_authorization_matrix.py
walks: the same routes, callers and cells, so the page a person reads is the one the suite
enforces."""

from __future__ import annotations

import re

from tests.api.test_authorization_matrix import MATRIX, PRINCIPALS
from tests.conftest import ROOT

PAGE = ROOT / "docs" / "security.md"
ROW = re.compile(r"^\| `(GET|POST|PUT|PATCH|DELETE|WS) /([^`]*)` \|(.*)\|$")


def _documented() -> dict[tuple[str, str], tuple[str, ...]]:
    text = PAGE.read_text()
    section = text.split("## The authorization matrix", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = ROW.match(line.strip())
        if found:
            method, route, cells = found.groups()
            rows[(method, route)] = tuple(c.strip() for c in cells.split("|"))
    return rows


def test_the_security_page_shows_the_matrix_the_suite_walks():
    documented = _documented()
    enforced = {key: tuple(str(c) for c in cells) for key, cells in MATRIX.items()}
    missing = sorted(set(enforced) - set(documented))
    stale = sorted(set(documented) - set(enforced))
    assert not missing, f"rows to add to docs/security.md's authorization matrix: {missing}"
    assert not stale, f"rows in docs/security.md for routes the matrix no longer has: {stale}"
    differ = {k: (documented[k], enforced[k]) for k in enforced if documented[k] != enforced[k]}
    assert not differ, f"cells that differ (docs/security.md, the test): {differ}"
    assert all(len(cells) == len(PRINCIPALS) for cells in documented.values())
