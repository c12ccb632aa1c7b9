"""The client's typed errors: a class for every code docs/api.md documents and every code the
server can send, each with the server's code exactly, under the class of its HTTP status."""

from __future__ import annotations

import re

import httpx
import pytest
from agent_console_client import _core, errors

from console.api.errors import _DRF_CODES
from runtime import compensation, ratelimits, resolutions, worklist
from runtime import errors as domain
from runtime.transitions import status as statemachine
from tests.conftest import ROOT


def _documented() -> dict[str, int]:
    """{code: status} from docs/api.md's "Error codes" table."""
    text = (ROOT / "docs" / "api.md").read_text()
    table = text.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    found: dict[str, int] = {}
    for row in re.findall(r"^\| (\d{3}) \| (.+) \|$", table, flags=re.MULTILINE):
        # "(with `field`)" names a field of the body, not a code.
        for code in re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", row[1])):
            found[code] = int(row[0])
    return found


def _domain_classes(base: type[domain.DomainError]) -> list[type[domain.DomainError]]:
    found = [base]
    for cls in base.__subclasses__():
        found.extend(_domain_classes(cls))
    return found


def _server_codes() -> dict[str, int | None]:
    """{code: status or None when the source does not say} the server can send: its error
    classes, DRF's table, and every ``code="..."`` and ``error_body("...")`` in its source."""
    # The modules that define error classes of their own are imported (above) to be walked.
    assert compensation and ratelimits and resolutions and statemachine and worklist
    found: dict[str, int | None] = {}
    for cls in _domain_classes(domain.DomainError):
        found[cls.code] = cls.status
    for _, status, code in _DRF_CODES:
        found[code] = status
    pattern = re.compile(r"""(?:\bcode=|error_body\()\s*"([a-z_]+)\"""")
    for package in ("runtime", "console"):
        for path in (ROOT / package).rglob("*.py"):
            if "simulation" in path.parts or "migrations" in path.parts:
                continue
            for code in pattern.findall(path.read_text()):
                found.setdefault(code, None)
    server = (ROOT / "console" / "server.py").read_text()
    for status, code in re.findall(r"^\s+(\d{3}): \(\"([a-z_]+)\"", server, flags=re.MULTILINE):
        found[code] = int(status)
    return found


def test_the_documented_table_is_read():
    documented = _documented()
    # The table's rows, so a change of its layout cannot empty the check below.
    assert documented["not_authenticated"] == 401
    assert documented["storage_unavailable"] == 503
    assert len(documented) >= 36


@pytest.mark.parametrize("code, status", sorted(_documented().items()))
def test_every_documented_code_has_its_class(code: str, status: int):
    cls = errors.by_code().get(code)
    assert cls is not None, f"no class for the documented code {code}"
    assert cls.code == code
    assert cls.http_status == status
    assert errors.error_class(status, code) is cls


def test_every_code_the_server_sends_has_its_class():
    missing = sorted(set(_server_codes()) - set(errors.by_code()))
    assert not missing, f"codes the server sends without a class: {missing}"
    for code, status in _server_codes().items():
        cls = errors.by_code()[code]
        assert cls.code == code
        if status is not None:
            assert cls.http_status == status, (code, status, cls)


def test_unauthenticated_says_the_servers_code_and_keeps_its_name():
    assert errors.Unauthenticated is errors.NotAuthenticated
    assert errors.NotAuthenticated.code == "not_authenticated"


@pytest.mark.parametrize(
    "status, code, expected",
    [
        (401, "not_authenticated", errors.NotAuthenticated),
        (409, "task_paused", errors.TaskPaused),
        (409, "a_code_from_a_newer_server", errors.Conflict),
        (413, "artifact_too_large", errors.ArtifactTooLarge),
        (429, "queue_full", errors.QueueFull),
        (503, "storage_unavailable", errors.StorageUnavailable),
        (502, "", errors.ServerError),
        (418, "", errors.ConsoleError),
    ],
)
def test_an_answer_becomes_its_class_with_the_code_as_sent(status, code, expected):
    body = {"error": {"code": code, "message": "no"}} if code else None
    response = httpx.Response(status, json=body, headers={"Retry-After": "2"})
    error = _core.error_for(response)
    assert type(error) is expected
    assert error.status == status and error.retry_after == 2.0
    assert error.code == (code or expected.code)
    # Each is caught by its status's class.
    if status == 409:
        assert isinstance(error, errors.Conflict)
