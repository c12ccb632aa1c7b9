"""The MCP gateway at /mcp (issue 38, point 3), driven by the ``mcp`` package's own client over
streamable HTTP against the real web server: the catalogue listed as tools with their
parameter schemas, a call proposed in the task the URL names and answered with its result, a
gated call answered at once with its approval's link and state (an input-required result on
protocol 2026-07-28, a pending tool result on handshake-era versions), an operator deciding
(over the API or the gateway's approval tools), the result fetched after; one operation per
call's arguments; bad tokens refused from the head; bad input answered as MCP errors (tool
errors in the contract's format, the protocol's invalid-params), never a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import httpx2
import pytest
from django.conf import settings
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from runtime.models import ApiToken, Approval, Operation, Task
from runtime.notifications.dispatch import approval_link
from runtime.sandbox.receivers import effects_under
from runtime.tokens import token_revoke
from runtime.tools.base import tool_catalogue
from tests import factories
from tests.api.support import raw_http
from tests.conftest import KeptProcesses, Server

pytestmark = pytest.mark.postgres

CHARGE = {"account": "acct_mcp", "amount_cents": 20000}  # above 10000: needs an approval
Elicit = Callable[[Any, Any], Awaitable[Any]]


@pytest.fixture
def quick(transactional_db: None, kept_processes: KeptProcesses) -> Iterator[Server]:
    """The web server with calls waiting one second for their operation (no workers here: the
    test runs the work itself, factories.run_claimable)."""
    yield kept_processes.server(MCP_CALL_WAIT_SECONDS=1)
    kept_processes.settle()


def _client(
    server: Server,
    token: str,
    query: str = "",
    *,
    mode: str = "auto",
    elicitation: Elicit | None = None,
    headers: dict[str, str] | None = None,
) -> Client:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}", **(headers or {})}, timeout=60
    )
    url = f"{server.url}/mcp{query}"
    return Client(
        streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=elicitation
    )


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_tools_are_the_catalogue_with_its_schemas(quick):
    agent, operator = factories.agent(), factories.console_user("operator")

    async def names(principal: factories.Principal, mode: str) -> dict[str, types.Tool]:
        async with _client(quick, principal.token, mode=mode) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    catalogue = {e["name"]: e for e in tool_catalogue()}
    for mode in ("auto", "legacy"):
        tools = _run(names(agent, mode))
        echo_schema = catalogue["demo.echo"]["params_schema"]
        assert tools["demo.echo"].input_schema == {"type": "object", **echo_schema}
        charge = tools["demo.payments.charge"]
        assert (
            charge.input_schema["properties"]["amount_cents"]
            == (catalogue["demo.payments.charge"]["params_schema"]["properties"]["amount_cents"])
        )
        assert "approval" in (charge.description or "")
        assert "console.get_result" in tools
        assert not {"console.list_approvals", "console.decide_approval"} & set(tools)
        # Steps an agent runs itself have nothing for a call to wait for: not offered.
        agent_run = {
            n for n, e in catalogue.items() if "worker" not in e.get("executors", ["worker"])
        }
        assert not agent_run & set(tools)
    assert {"console.list_approvals", "console.decide_approval"} <= set(
        _run(names(operator, "auto"))
    )


@pytest.mark.workers
def test_the_journey_list_call_gated_call_decision_result(server, workers):
    workers.start(count=1, concurrency=1)
    agent, operator = factories.agent(), factories.console_user("operator")
    asked: list[Any] = []

    async def person(context: Any, params: Any) -> types.ElicitResult:
        # The person opens the link and approves there (here: over the API, as the page does).
        asked.append(params)
        async with httpx.AsyncClient(base_url=server.url, headers=operator.headers) as api:
            pending = await api.get("/api/v1/approvals", params={"status": "pending"})
            (approval,) = pending.json()["results"]
            decided = await api.post(
                f"/api/v1/approvals/{approval['id']}/decision",
                json={"decision": "approve", "params_hash": approval["params_hash"]},
            )
            assert decided.status_code == 200, decided.text
        return types.ElicitResult(action="accept")

    async def journey() -> tuple[Any, ...]:
        async with _client(server, agent.token, "?task_key=journey", elicitation=person) as c:
            assert c.protocol_version == "2026-07-28"
            echoed = await c.call_tool("demo.echo", {"text": "hello"})
            # At once: the approval's link and state, the operation's id as the state to retry.
            gated = await c.session.call_tool(
                "demo.payments.charge", CHARGE, allow_input_required=True
            )
            assert not asked
            # The SDK's own loop: the person is asked (the link), decides, the retry answers.
            charged = await c.call_tool("demo.payments.charge", CHARGE)
            fetched = await c.call_tool("console.get_result", {"operation": gated.request_state})
            return echoed, gated, charged, fetched

    echoed, gated, charged, fetched = _run(journey())
    task = Task.objects.get(external_id="journey", agent_id=agent.actor.agent_id)
    assert echoed.is_error is False
    assert echoed.structured_content["status"] == "succeeded"
    assert echoed.structured_content["result"] == {"text": "hello"}
    assert echoed.structured_content["task"] == task.pk

    assert isinstance(gated, types.InputRequiredResult)
    op = Operation.objects.get(pk=gated.request_state)
    assert op.task_id == task.pk and op.tool == "demo.payments.charge"
    approval = Approval.objects.get(operation=op)
    request = gated.input_requests["approval"]
    assert request.params.mode == "url"
    assert request.params.url == approval_link(approval)
    assert request.params.url.startswith(f"{settings.CONSOLE_URL}/approvals/?")
    assert len(asked) == 1 and asked[0].url == request.params.url

    assert charged.is_error is False
    assert charged.structured_content["operation"] == op.pk
    assert charged.structured_content["status"] == "succeeded"
    assert charged.structured_content["result"]["amount_cents"] == 20000
    assert fetched.structured_content["result"] == charged.structured_content["result"]
    op.refresh_from_db()
    assert len(effects_under("payments", op.idempotency_key)) == 1
    assert Operation.objects.filter(task=task).count() == 2


def test_a_handshake_era_client_gets_the_pending_state_and_an_operator_decides_over_mcp(quick):
    agent, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(agent)

    async def propose() -> tuple[Any, Any]:
        async with _client(quick, agent.token, f"?task={task.pk}", mode="legacy") as c:
            assert c.protocol_version == "2025-11-25"
            charge = await c.call_tool("demo.payments.charge", CHARGE)
            other = await c.call_tool("demo.payments.charge", {**CHARGE, "amount_cents": 30000})
            return charge, other

    charge, other = _run(propose())
    body = charge.structured_content
    assert charge.is_error is False
    assert body["status"] == "waiting_approval"
    approval = Approval.objects.get(operation_id=body["operation"])
    assert body["approval"]["link"] == approval_link(approval)
    assert body["approval"]["state"] == "pending"
    assert "console.get_result" in body["next"]

    async def decide() -> tuple[Any, Any, Any]:
        async with _client(quick, operator.token, mode="legacy") as o:
            listed = await o.call_tool("console.list_approvals", {"task": task.pk})
            rows = {r["operation"]: r for r in listed.structured_content["approvals"]}
            first, second = rows[body["operation"]], rows[other.structured_content["operation"]]
            assert first["decidable"] is True and first["link"] == body["approval"]["link"]
            assert (first["approvals_required"], first["approved_by"]) == (1, [])
            approved = await o.call_tool(
                "console.decide_approval",
                {
                    "approval": first["approval"],
                    "decision": "approve",
                    "params_hash": first["params_hash"],
                },
            )
            no_reason = await o.call_tool(
                "console.decide_approval", {"approval": second["approval"], "decision": "deny"}
            )
            denied = await o.call_tool(
                "console.decide_approval",
                {"approval": second["approval"], "decision": "deny", "reason": "too much"},
            )
            return approved, no_reason, denied

    approved, no_reason, denied = _run(decide())
    assert approved.structured_content["status"] == "approved"
    assert approved.structured_content["approved_by"] == [operator.actor.label]
    assert no_reason.is_error is True
    assert no_reason.structured_content["error"]["code"] == "invalid_input"
    assert denied.structured_content["status"] == "denied"
    factories.run_claimable(task.pk)

    async def fetch() -> tuple[Any, Any]:
        async with _client(quick, agent.token, mode="legacy") as c:
            done = await c.call_tool("console.get_result", {"operation": body["operation"]})
            refused = await c.call_tool(
                "console.get_result", {"operation": other.structured_content["operation"]}
            )
            return done, refused

    done, refused = _run(fetch())
    assert done.structured_content["status"] == "succeeded"
    assert done.structured_content["result"]["amount_cents"] == 20000
    assert refused.is_error is True
    assert refused.structured_content["status"] == "failed"
    assert refused.structured_content["error"]["kind"] == "denied"


def test_a_call_is_one_operation_per_task_and_arguments(quick):
    agent = factories.agent()
    task = factories.task(agent)

    async def calls() -> list[Any]:
        answers = []
        async with _client(quick, agent.token, headers={"Console-Task": task.pk}) as c:
            answers.append(await c.call_tool("demo.echo", {"text": "a"}))
            answers.append(await c.call_tool("demo.echo", {"text": "a"}))
            answers.append(await c.call_tool("demo.echo", {"text": "b"}))
            answers.append(
                await c.call_tool("demo.echo", {"text": "a"}, meta={"agent-console/step": "again"})
            )
        async with _client(quick, agent.token, headers={"Console-Task-Key": "k-hdr"}) as c:
            answers.append(await c.call_tool("demo.echo", {"text": "a"}))
        return answers

    first, same, other, stepped, keyed = [a.structured_content for a in _run(calls())]
    # Not settled within the call's wait (no worker here): the answer says how to fetch it.
    assert first["status"] == "pending" and "console.get_result" in first["next"]
    assert same["operation"] == first["operation"]
    assert len({first["operation"], other["operation"], stepped["operation"]}) == 3
    assert Operation.objects.filter(task=task).count() == 3
    assert Operation.objects.get(pk=stepped["operation"]).step == "again"
    keyed_task = Task.objects.get(external_id="k-hdr", agent_id=agent.actor.agent_id)
    assert keyed["task"] == keyed_task.pk
    factories.run_claimable(task.pk)

    async def fetch() -> Any:
        async with _client(quick, agent.token) as c:
            return await c.call_tool("console.get_result", {"operation": first["operation"]})

    assert _run(fetch()).structured_content["result"] == {"text": "a"}


def test_bad_input_is_an_mcp_error_never_a_traceback(quick):
    agent, stranger = factories.agent(), factories.agent()
    theirs = factories.task(stranger)
    paused = factories.task(agent)
    Task.objects.filter(pk=paused.pk).update(paused=True)

    async def calls() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with _client(quick, agent.token, "?task_key=bad-input") as c:
            out["schema"] = await c.call_tool(
                "demo.payments.charge", {"account": "a", "amount_cents": "lots"}
            )
            out["get_result"] = await c.call_tool("console.get_result", {})
            out["unknown_op"] = await c.call_tool("console.get_result", {"operation": "op_nope"})
            out["extra"] = await c.call_tool("console.get_result", {"operation": "x", "more": 1})
            out["nul"] = await c.call_tool("demo.echo", {"text": "a\x00b"})
            with pytest.raises(MCPError) as raised:
                await c.call_tool("no.such.tool", {})
            out["unknown_tool"] = raised.value.error.code
            # Not offered to an agent, and refused by the policy when called all the same.
            out["approvals"] = await c.call_tool("console.list_approvals", {})
        async with _client(quick, agent.token) as c:
            out["no_task"] = await c.call_tool("demo.echo", {"text": "x"})
        async with _client(quick, agent.token, f"?task={theirs.pk}") as c:
            out["theirs"] = await c.call_tool("demo.echo", {"text": "x"})
        async with _client(quick, agent.token, f"?task={paused.pk}") as c:
            out["paused"] = await c.call_tool("demo.echo", {"text": "x"})
        async with _client(quick, agent.token, "?task_key=%20padded") as c:
            out["bad_key"] = await c.call_tool("demo.echo", {"text": "x"})
        return out

    out = _run(calls())

    def refused(name: str, code: str, field: str | None = None) -> None:
        answer = out[name]
        assert answer.is_error is True, name
        error = answer.structured_content["error"]
        assert error["code"] == code, (name, error)
        if field is not None:
            assert error["field"] == field, (name, error)
        assert "Traceback" not in answer.content[0].text

    refused("schema", "invalid_input", "params.amount_cents")
    refused("get_result", "invalid_input", "operation")
    refused("unknown_op", "not_found")
    refused("extra", "invalid_input", "more")
    refused("nul", "invalid_input", "arguments")
    refused("no_task", "invalid_input", "task")
    refused("theirs", "not_found")
    refused("paused", "task_paused")
    refused("bad_key", "invalid_input", "external_id")
    refused("approvals", "not_authorized")
    assert out["unknown_tool"] == types.INVALID_PARAMS
    assert not Operation.objects.exists()

    # Not JSON-RPC at all: the protocol's parse error, in JSON.
    answer = httpx.post(
        f"{quick.url}/mcp",
        content=b"{not json",
        headers={
            **agent.headers,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == types.PARSE_ERROR
    assert b"Traceback" not in quick.log.read_bytes()


def test_a_token_is_checked_from_the_head_before_any_body_is_read(quick):
    agent = factories.agent()
    # The head announces a megabyte the client never sends: the answer comes all the same.
    for token in ("not-a-token", None):
        headers = "Content-Type: application/json\r\nContent-Length: 1000000\r\n"
        if token is not None:
            headers += f"Authorization: Bearer {token}\r\n"
        head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode()
        status, _, answer_headers, body = raw_http(quick.url, head)
        assert status == 401
        assert answer_headers["www-authenticate"].startswith("Bearer")
        assert answer_headers["connection"] == "close"
        error = httpx.Response(401, content=body).json()["error"]
        assert error["code"] == types.INVALID_REQUEST  # JSON-RPC's, the contract's in its data
        assert error["data"]["code"] == "not_authenticated"

    async def listing(token: str) -> Any:
        async with _client(quick, token) as c:
            return await c.list_tools()

    assert _run(listing(agent.token)).tools
    token_revoke(ApiToken.objects.get(agent_id=agent.actor.agent_id).pk)
    with pytest.raises(Exception) as raised:  # the SDK's error, in the task groups it runs
        _run(listing(agent.token))
    refusal = raised.value
    while isinstance(refusal, BaseExceptionGroup):
        refusal = refusal.exceptions[0]
    assert isinstance(refusal, MCPError)
    assert refusal.error.data["code"] == "not_authenticated"
    # Other methods than POST: 405, as the spec has a stateless server answer.
    answer = httpx.get(f"{quick.url}/mcp", headers=agent.headers, timeout=30)
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"
