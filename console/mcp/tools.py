"""The MCP gateway's server: the tool catalogue as MCP tools, each call a proposal in the
caller's task (runtime.transitions.propose, as ``POST /api/v1/tasks/{id}/operations``),
answered with the operation's result once it settles; a gated call is answered at once with its
approval's link and state; people with a console role get tools to list and decide approvals
(through the release gate). Like the REST views: parse, authorise (runtime.policy), call one runtime
service, serialise. The transport (authentication, the task the request names) is
console.mcp.gateway.

Decisions (docs/mcp.md):
- The task: named by the request (``/mcp?task=ID`` or the ``Console-Task`` header), or got or
  created by the caller's key (``/mcp?task_key=KEY`` or ``Console-Task-Key``: the task under
  that ``external_id``, runtime.task_keys). Sessions are not used: the gateway is stateless, so
  any web process serves any request, and an agent restarted with the same URL finds its task.
- The step of a call is ``mcp:`` and the hash of its arguments (or ``_meta``'s
  ``agent-console/step``): calling a tool again with the same arguments in the same task is the
  same operation (its key), so a repeated or retried call never repeats an effect.
- A call waiting for a person: on protocol 2026-07-28 with a client that takes URL elicitation,
  an ``InputRequiredResult`` (SEP-2322) asking the person to open the approval's link, the
  operation's id as ``requestState``; the client's retry waits (bounded) for the decision and
  answers the result. Otherwise (handshake-era versions, or no URL elicitation) a tool result
  stating ``waiting_approval`` with the link; ``console.get_result`` fetches it once decided.
- Refusals (bad arguments, a paused task, an exhausted budget) are tool results with
  ``isError`` and the contract's error body, as the spec asks for errors a model can act on; an
  unknown tool is the protocol's invalid-params error. Never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from mcp import types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from console.api.errors import classify, error_body
from console.api.parsers import json_problem
from runtime import approvals, policy
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput
from runtime.events import TASK_GROUP
from runtime.hashing import params_hash
from runtime.models import Approval, Operation
from runtime.notifications.dispatch import approval_link
from runtime.rules.statuses import OperationStatus
from runtime.selectors.approvals import approval_current, approval_list, approved_by
from runtime.selectors.operations import operation_get
from runtime.selectors.tasks import task_get
from runtime.specs import OperationSpec
from runtime.task_keys import task_get_or_create
from runtime.tasks import TaskSpec
from runtime.tools.base import adapters, tool_catalogue
from runtime.transitions.propose import operation_propose

log = logging.getLogger(__name__)
S = OperationStatus
T = TypeVar("T")

# Where console.mcp.gateway leaves who asks and the task the request names, in the ASGI scope.
SCOPE_KEY = "console.mcp.caller"

GET_RESULT = "console.get_result"
LIST_APPROVALS = "console.list_approvals"
DECIDE_APPROVAL = "console.decide_approval"
OWN_TOOLS = (GET_RESULT, LIST_APPROVALS, DECIDE_APPROVAL)
# The caller's own step for a call (``_meta``): to make the same call twice on purpose.
STEP_META = "agent-console/step"
# SEP-986: the names MCP clients accept; a catalogue name outside it is not offered.
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
# Moving without a person: a call waits (bounded) for these to end.
MOVING = (S.PENDING, S.RUNNING, S.RETRY_SCHEDULED)
# Ended without the result asked for.
ENDED_OTHERWISE = (S.FAILED, S.CANCELLED, S.COMPENSATED, S.EXPIRED)

INSTRUCTIONS = (
    "Each tool call is proposed as an operation of your task in the agent console: name the "
    "task in the URL (/mcp?task=TASK_ID, or /mcp?task_key=YOUR_KEY to get or create your task "
    "by your own key). Calling a tool again with the same arguments is the same operation: its "
    "effect happens once. A call that needs a person's approval answers at once with the "
    "approval's link; fetch its result with console.get_result once it is decided."
)


@dataclass(frozen=True)
class Caller:
    """Who asks (authenticated by the gateway before any body was read) and the task the
    request names: ``task_id`` (an existing task) or ``task_key`` (the caller's external id)."""

    actor: Actor
    task_id: str | None = None
    task_key: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """An operation as a call answers it."""

    operation: str
    task: str
    tool: str
    status: str
    result: Any
    error: Any
    reason: str
    approval: dict[str, Any] | None


# --- the sync side: runtime services, each in a thread of its own ------------------------------


def _released(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` giving its database connection back when it returns: the calls run in a pool of
    threads, outside any request Django would close them after."""

    def run(*args: Any) -> T:
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return run


async def _sync(fn: Callable[..., T], *args: Any) -> T:
    return await sync_to_async(_released(fn), thread_sensitive=False)(*args)


def _offered(entry: dict[str, Any]) -> bool:
    """A catalogue tool a call may propose: one a worker runs (an agent-run step has nothing
    for the gateway to wait for), under a name MCP clients accept."""
    name = str(entry["name"])
    return (
        "worker" in entry.get("executors", ["worker"])
        and name not in OWN_TOOLS
        and 0 < len(name) <= 128
        and set(name) <= _NAME_CHARS
    )


def _catalogue_tool(entry: dict[str, Any]) -> types.Tool:
    schema = dict(entry.get("params_schema") or {})
    schema.setdefault("type", "object")
    approval = entry.get("approval") or {}
    gate = {
        "always": " Needs a person's approval.",
        "conditional": f" Needs a person's approval when {approval.get('when')}.",
    }.get(str(approval.get("required")), "")
    return types.Tool(
        name=entry["name"],
        description=(entry.get("description") or entry["name"]) + gate,
        input_schema=schema,
        annotations=types.ToolAnnotations(idempotent_hint=True),
    )


_GET_RESULT_TOOL = types.Tool(
    name=GET_RESULT,
    description="The state or result of an operation a call proposed (its id is in the call's "
    "answer): waits up to wait_seconds for it to settle.",
    input_schema={
        "type": "object",
        "properties": {
            "operation": {"type": "string", "maxLength": 64},
            "wait_seconds": {"type": "number", "minimum": 0},
        },
        "required": ["operation"],
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(read_only_hint=True),
)
_LIST_APPROVALS_TOOL = types.Tool(
    name=LIST_APPROVALS,
    description="Pending approvals you may see, oldest first, each with its parameters, their "
    "params_hash (approving needs it) and its link in the console.",
    input_schema={
        "type": "object",
        "properties": {
            "task": {"type": "string", "maxLength": 64},
            "tool": {"type": "string", "maxLength": 200},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(read_only_hint=True),
)
_DECIDE_APPROVAL_TOOL = types.Tool(
    name=DECIDE_APPROVAL,
    description="Approve (with the params_hash of the parameters you approve) or deny (with a "
    "reason) a pending approval, through the console's release gate. A request that needs "
    "more approvers (approvals_required) stays pending until that many people approved it "
    "(approved_by names them so far).",
    input_schema={
        "type": "object",
        "properties": {
            "approval": {"type": "string", "maxLength": 64},
            "decision": {"type": "string", "enum": list(approvals.DECISIONS)},
            "params_hash": {"type": "string", "maxLength": 80},
            "reason": {"type": "string", "maxLength": 2000},
        },
        "required": ["approval", "decision"],
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(destructive_hint=False, idempotent_hint=False),
)


def tools_for(actor: Actor) -> list[types.Tool]:
    """What ``actor`` is offered: the catalogue's tools a call may propose, ``get_result``, and
    for a person with a console role the approval tools (policy.can_review_approvals)."""
    policy.can_read_tool_catalogue(actor)
    tools = [_catalogue_tool(e) for e in tool_catalogue() if _offered(e)]
    tools.append(_GET_RESULT_TOOL)
    if policy.allowed(policy.can_review_approvals, actor):
        tools += [_LIST_APPROVALS_TOOL, _DECIDE_APPROVAL_TOOL]
    return tools


def input_schema(name: str) -> dict[str, Any] | None:
    """A tool's input schema by name (the SDK's header check asks it instead of listing the
    tools on every call)."""
    own = {t.name: t.input_schema for t in (_GET_RESULT_TOOL, _LIST_APPROVALS_TOOL)}
    own[DECIDE_APPROVAL] = _DECIDE_APPROVAL_TOOL.input_schema
    if name in own:
        return dict(own[name])
    adapter = adapters().get(name)
    return dict(adapter.params_schema) if adapter is not None else None


def _is_offered(actor: Actor, name: str) -> bool:
    """Whether a call may propose the catalogue tool ``name`` (the gateway's own tools are
    answered before this is asked)."""
    policy.can_read_tool_catalogue(actor)
    return any(e["name"] == name and _offered(e) for e in tool_catalogue())


def _task_of(caller: Caller) -> str:
    """The task the request names, or the caller's task under its key (created if none)."""
    if caller.task_id:
        return task_get(caller.actor, caller.task_id).pk
    if caller.task_key:
        task, _ = task_get_or_create(
            caller.actor, TaskSpec(name=f"mcp: {caller.task_key}", external_id=caller.task_key)
        )
        return task.pk
    raise InvalidInput(
        "name the task this call belongs to: /mcp?task=TASK_ID (or the Console-Task header), or "
        "/mcp?task_key=YOUR_KEY (or Console-Task-Key) for your task under that external_id",
        field="task",
    )


def _snapshot_of(op: Operation, approval: Approval | None) -> Snapshot:
    shown = None
    if approval is not None:
        shown = {
            "id": approval.pk,
            "state": approval.status,
            "link": approval_link(approval),
            "params_hash": approval.params_hash,
            "expires_at": approval.expires_at.isoformat(),
            "reason": approval.reason or None,
        }
    return Snapshot(
        operation=op.pk,
        task=op.task_id,
        tool=op.tool,
        status=op.status,
        result=op.result,
        error=op.error,
        reason=op.status_reason,
        approval=shown,
    )


def _snapshot(actor: Actor, operation_id: str) -> Snapshot:
    op = operation_get(actor, operation_id)
    return _snapshot_of(op, approval_current(op))


def _propose(caller: Caller, tool: str, arguments: dict[str, Any], step: str) -> Snapshot:
    task_id = _task_of(caller)
    op, _ = operation_propose(
        caller.actor, task_id, OperationSpec(tool=tool, params=arguments, step=step)
    )
    return _snapshot_of(op, approval_current(op))


def _pending_approvals(
    actor: Actor, task: str | None, tool: str | None, limit: int
) -> list[dict[str, Any]]:
    policy.can_review_approvals(actor)
    rows = approval_list(actor, status="pending", task_id=task, tool=tool, limit=limit)
    me = policy.fresh(actor)
    out = []
    for a in rows:
        refusal = policy.approval_decision_refusal(me, a)
        out.append(
            {
                "approval": a.pk,
                "operation": a.operation_id,
                "task": a.task_id,
                "tool": a.tool,
                "params": a.params,
                "params_hash": a.params_hash,
                "requested_by": a.requested_by,
                "expires_at": a.expires_at.isoformat(),
                "link": approval_link(a),
                "decidable": refusal is None,
                "refusal": refusal,
                # The two-person rule: how many must approve, and who did so far.
                "approvals_required": a.approvals_required,
                "approved_by": approved_by(a),
            }
        )
    return out


def _decide(
    actor: Actor, approval_id: str, decision: str, reason: str, params_hash_: str
) -> dict[str, Any]:
    policy.can_review_approvals(actor)
    approval = approvals.approval_decide(
        actor, approval_id, decision=decision, reason=reason, params_hash=params_hash_
    )
    return {
        "approval": approval.pk,
        "operation": approval.operation_id,
        "status": approval.status,
        "approvals_required": approval.approvals_required,
        "approved_by": approved_by(approval),
    }


# --- the async side: the MCP handlers --------------------------------------------------------


def _caller(ctx: Any) -> Caller:
    request = getattr(ctx, "request", None)
    caller = request.scope.get(SCOPE_KEY) if request is not None else None
    if not isinstance(caller, Caller):
        # Only the gateway serves this server, and it always says who asks.
        raise MCPError(code=types.INTERNAL_ERROR, message="the request names no caller")
    return caller


async def list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=await _sync(tools_for, _caller(ctx).actor))


async def call_tool(
    ctx: Any, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    caller = _caller(ctx)
    arguments = dict(params.arguments or {})
    try:
        # What the API's parser refuses in a body (NUL, lone surrogates, non-finite numbers,
        # nesting past 64 levels), refused here as it names the arguments.
        problem = json_problem(arguments)
        if problem:
            raise InvalidInput(f"arguments: {problem}", field="arguments")
        if params.name == GET_RESULT:
            return await _get_result(caller.actor, arguments)
        if params.name == LIST_APPROVALS:
            return await _list_approvals(caller.actor, arguments)
        if params.name == DECIDE_APPROVAL:
            return await _decide_approval(caller.actor, arguments)
        if not await _sync(_is_offered, caller.actor, params.name):
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        return await _call_catalogue_tool(ctx, caller, params, arguments)
    except MCPError:
        raise
    except Exception as exc:
        return _refusal(exc)


def _refusal(exc: BaseException) -> types.CallToolResult:
    """The contract's error body as a tool error (for the model to read and act on); anything
    that is not a refusal is logged and answered as ``internal_error``, never with its text."""
    known = classify(exc)
    if known is None:
        log.exception("MCP tool call failed")
        body = error_body("internal_error", "internal server error")
    else:
        _, code, message = known
        field = exc.details.get("field") if isinstance(exc, DomainError) else None
        body = error_body(code, message, field=field)
    return _answer(body, is_error=True)


def _answer(body: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=body,
        is_error=is_error,
    )


def _step(params: types.CallToolRequestParams, arguments: dict[str, Any]) -> str:
    given = dict(params.meta or {}).get(STEP_META)
    if isinstance(given, str):
        return given
    return "mcp:" + params_hash(arguments).removeprefix("sha256:")[:32]


def _asks_by_url(ctx: Any) -> bool:
    """Whether this request's protocol offers input-required results (2026-07-28) and the
    client said it takes URL elicitation."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


def _declined(params: types.CallToolRequestParams) -> bool:
    """The client's retry said the person declined or dismissed the approval's link."""
    responses = params.input_responses or {}
    answer = responses.get("approval")
    return answer is not None and getattr(answer, "action", "accept") != "accept"


async def _call_catalogue_tool(
    ctx: Any, caller: Caller, params: types.CallToolRequestParams, arguments: dict[str, Any]
) -> types.CallToolResult | types.InputRequiredResult:
    snap = await _sync(_propose, caller, params.name, arguments, _step(params, arguments))
    # A retry of an input-required answer (the person was sent to the link) waits for the
    # decision too; a first call that needs one answers at once.
    retried = params.input_responses is not None or params.request_state is not None
    declined = retried and _declined(params)
    waiting_on = (*MOVING, S.WAITING_APPROVAL) if retried and not declined else MOVING
    snap = await _settled(caller.actor, snap, waiting_on, _wait_limit())
    if snap.status == S.WAITING_APPROVAL and snap.approval and not declined and _asks_by_url(ctx):
        return _input_required(snap)
    return _answer(_body(snap), is_error=snap.status in ENDED_OTHERWISE)


def _wait_limit(asked: Any = None) -> float:
    limit = float(settings.MCP_CALL_WAIT_SECONDS)
    if asked is None:
        return limit
    if isinstance(asked, bool) or not isinstance(asked, int | float) or asked < 0:
        raise InvalidInput("wait_seconds must be a number from 0", field="wait_seconds")
    return min(float(asked), limit)


def _body(snap: Snapshot) -> dict[str, Any]:
    body: dict[str, Any] = {
        "operation": snap.operation,
        "task": snap.task,
        "tool": snap.tool,
        "status": snap.status,
    }
    if snap.status == S.SUCCEEDED:
        body["result"] = snap.result
    elif snap.status in ENDED_OTHERWISE:
        body["error"] = snap.error or {"message": snap.reason or snap.status}
    if snap.approval is not None:
        body["approval"] = snap.approval
    if snap.status == S.WAITING_APPROVAL:
        body["next"] = (
            f"a person decides at the approval's link; then call {GET_RESULT} with "
            f'{{"operation": "{snap.operation}"}}'
        )
    elif snap.status not in (S.SUCCEEDED, *ENDED_OTHERWISE):
        if snap.reason:
            body["reason"] = snap.reason
        body["next"] = (
            f'not settled yet: call {GET_RESULT} with {{"operation": "{snap.operation}"}}'
        )
    return body


def _input_required(snap: Snapshot) -> types.InputRequiredResult:
    assert snap.approval is not None  # the caller checked
    url = types.ElicitRequestURLParams(
        mode="url",
        message=f"Approve or deny {snap.tool} in the agent console (operation {snap.operation}).",
        url=snap.approval["link"],
        elicitation_id=snap.approval["id"],
    )
    return types.InputRequiredResult(
        input_requests={"approval": types.ElicitRequest(params=url)},
        request_state=snap.operation,
    )


async def _settled(
    actor: Actor, snap: Snapshot, waiting_on: tuple[str, ...], seconds: float
) -> Snapshot:
    """The operation once its status leaves ``waiting_on``, or as it is after ``seconds``.
    Woken by the task's journal hints (as the event stream is), read again on a slow timer as a
    safety net, and on a quick one where hints do not cross processes (embedded mode)."""
    if snap.status not in waiting_on or seconds <= 0:
        return snap
    layer = get_channel_layer()
    hinted = layer is not None and not isinstance(layer, InMemoryChannelLayer)
    group = TASK_GROUP.format(task_id=snap.task)
    channel = ""
    if hinted:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    idle = float(settings.SSE_SAFETY_POLL_SECONDS) if hinted else 0.25
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    try:
        while snap.status in waiting_on:
            left = end - loop.time()
            if left <= 0:
                break
            try:
                if hinted:
                    await asyncio.wait_for(layer.receive(channel), timeout=min(idle, left))
                else:
                    await asyncio.sleep(min(idle, left))
            except TimeoutError:
                pass
            snap = await _sync(_snapshot, actor, snap.operation)
    finally:
        if hinted:
            await layer.group_discard(group, channel)
    return snap


def _text(arguments: dict[str, Any], name: str, *, required: bool = False, limit: int) -> str:
    value = arguments.get(name)
    if value is None or value == "":
        if required:
            raise InvalidInput(f"{name} is required", field=name)
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise InvalidInput(f"{name} must be text of at most {limit} characters", field=name)
    return value


def _only(arguments: dict[str, Any], names: tuple[str, ...]) -> None:
    unknown = sorted(set(arguments) - set(names))
    if unknown:
        raise InvalidInput(f"unknown argument {unknown[0]!r}", field=unknown[0])


async def _get_result(actor: Actor, arguments: dict[str, Any]) -> types.CallToolResult:
    _only(arguments, ("operation", "wait_seconds"))
    operation = _text(arguments, "operation", required=True, limit=64)
    seconds = _wait_limit(arguments.get("wait_seconds", 0))
    snap = await _sync(_snapshot, actor, operation)
    snap = await _settled(actor, snap, (*MOVING, S.WAITING_APPROVAL), seconds)
    return _answer(_body(snap), is_error=snap.status in ENDED_OTHERWISE)


async def _list_approvals(actor: Actor, arguments: dict[str, Any]) -> types.CallToolResult:
    _only(arguments, ("task", "tool", "limit"))
    limit = arguments.get("limit", 50)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
        raise InvalidInput("limit must be a whole number from 1 to 100", field="limit")
    rows = await _sync(
        _pending_approvals,
        actor,
        _text(arguments, "task", limit=64) or None,
        _text(arguments, "tool", limit=200) or None,
        limit,
    )
    return _answer({"approvals": rows})


async def _decide_approval(actor: Actor, arguments: dict[str, Any]) -> types.CallToolResult:
    _only(arguments, ("approval", "decision", "params_hash", "reason"))
    decision = _text(arguments, "decision", required=True, limit=16)
    if decision not in approvals.DECISIONS:
        raise InvalidInput("decision must be approve or deny", field="decision")
    answer = await _sync(
        _decide,
        actor,
        _text(arguments, "approval", required=True, limit=64),
        decision,
        _text(arguments, "reason", limit=2000),
        _text(arguments, "params_hash", limit=80),
    )
    return _answer(answer)


def mcp_server() -> Server[Any]:
    """The gateway's MCP server (one per process; stateless: any process serves any call)."""
    return Server(
        "agent-console",
        version="1",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
