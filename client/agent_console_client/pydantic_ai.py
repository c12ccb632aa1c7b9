"""Pydantic AI adapter (``pip install ./client[pydantic-ai]``): the console decides what an
agent's tools do.

- ``ConsoleToolset`` wraps a toolset. Its ``call_tool`` proposes each call of a mapped tool as
  an operation of the task (its step is the call's stable ``tool_call_id``, so a repeated call
  is the same operation), and returns the operation's accepted result, or a ``ToolFailed`` the
  model sees. While the console keeps the operation in ``waiting_approval`` it raises
  ``ApprovalRequired``: the run ends with ``DeferredToolRequests``.
- ``run_with_console`` runs the agent, and while it stops on approvals waits (following the
  task's server-sent events) for the console's decision, then resumes the run with
  ``DeferredToolResults``: ``ToolApproved()`` (never ``override_args``: an operator's edit goes
  through ``/approvals/{id}/edit`` and the console runs the edited proposal; the tool's result is
  what the console accepted) or ``ToolDenied`` with the operator's reason.
- ``ConsoleModel`` wraps a model (Pydantic AI's ``WrapperModel``, as its Temporal and DBOS
  integrations do): every model request, streamed or not, is a turn of a durable run, an
  agent-executed operation of the console's built-in ``model.call`` under the step
  ``run:<run_key>:turn:<n>``, proposed with an estimate of ``model_tokens`` (refused with
  BudgetExhausted when the budget cannot cover it), claimed, and completed with the tokens the
  model reported and the response itself. A restarted agent on the same task replays each
  recorded response instead of asking the model again, so its tool calls keep their ids, the
  toolset proposes the same operations, and no effect happens twice.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.exceptions import ApprovalRequired, ToolFailed
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from agent_console_client._async import AsyncClient, AsyncLease
from agent_console_client._turns import ModelCallDenied, ModelCallEnded, Turns
from agent_console_client.errors import REFUSALS, StaleLease
from agent_console_client.models import ALL_STATUSES, TERMINAL_STATUSES, Operation

# The operation waits for a person (an approval) in this status; any other means decided.
WAITING_APPROVAL = "waiting_approval"
DECIDED = ALL_STATUSES - {WAITING_APPROVAL}
# Where a tool call's wait ends: done, or handed to support staff.
SETTLED = TERMINAL_STATUSES | {"unresolved", "manual_intervention"}


def _step(tool_call_id: str | None) -> str:
    # The console's steps are names; a provider's call id may carry other characters.
    raw = tool_call_id or uuid.uuid4().hex
    return "call-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)[:180]


def _outcome(op: Operation) -> Any:
    """The operation's accepted result, or a ToolFailed naming why there is none."""
    if op.status == "succeeded":
        return op.result
    detail = op.error.get("message") if isinstance(op.error, dict) else op.error
    raise ToolFailed(f"the console's operation {op.id} ended {op.status}: {detail or 'no result'}")


@dataclass
class ConsoleToolset(WrapperToolset[Any]):
    """Runs the mapped tools through the console. ``tools`` maps the agent's tool names to the
    console's tool names; tools not in it run locally, as the wrapped toolset runs them."""

    client: AsyncClient = field(kw_only=True)
    task_id: str = field(kw_only=True)
    tools: Mapping[str, str] = field(kw_only=True)
    wait_timeout: float | None = field(default=None, kw_only=True)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        console_tool = self.tools.get(name)
        if console_tool is None:
            return await super().call_tool(name, tool_args, ctx, tool)
        metadata = ctx.tool_call_metadata if isinstance(ctx.tool_call_metadata, dict) else {}
        if ctx.tool_call_approved and metadata.get("operation"):
            # Resumed after the console's approval: the operation (as the console approved it,
            # edits included) is the one to wait for; it is never proposed again with the
            # model's original arguments.
            op = await self.client.get_operation(str(metadata["operation"]))
        else:
            try:
                op = await self.client.propose(
                    self.task_id, console_tool, tool_args, step=_step(ctx.tool_call_id)
                )
            except REFUSALS as exc:  # parameters, policy, budget: the model reads why
                raise ToolFailed(f"the console refused the call: {exc}") from exc
        decided_against = (
            op.approval is not None
            and op.approval.status not in ("approved", "released")
            and op.status != "succeeded"
        )
        if op.status == WAITING_APPROVAL or (decided_against and not ctx.tool_call_approved):
            # (A restarted run meets an approval already denied here: decisions_for turns it
            # into the same ToolDenied, with the operator's reason, the first run gave.)
            raise ApprovalRequired(
                metadata={
                    "operation": op.id,
                    "approval": op.approval.id if op.approval else None,
                    "task": self.task_id,
                }
            )
        op = await self.client.wait_operation(op.id, until=SETTLED, timeout=self.wait_timeout)
        return _outcome(op)


async def decisions_for(
    client: AsyncClient, requests: DeferredToolRequests, *, timeout: float | None = None
) -> DeferredToolResults:
    """Wait for the console's decision on each approval the run stopped on (the operation
    leaves ``waiting_approval``; an edit keeps it there under a new proposal), and translate
    it: approved is ``ToolApproved()`` with the operation's id as the call's metadata, denied
    (or expired, cancelled) is ``ToolDenied`` with the operator's reason."""
    results = DeferredToolResults()
    for call in requests.approvals:
        metadata = requests.metadata.get(call.tool_call_id, {})
        op = await client.wait_operation(str(metadata["operation"]), until=DECIDED, timeout=timeout)
        approval = op.approval
        if approval is not None and approval.status in ("approved", "released"):
            results.approvals[call.tool_call_id] = ToolApproved()
            results.metadata[call.tool_call_id] = {**metadata, "operation": op.id}
        else:
            who = approval.decided_by if approval and approval.decided_by else "the console"
            reason = approval.reason if approval and approval.reason else op.status
            results.approvals[call.tool_call_id] = ToolDenied(f"Denied by {who}: {reason}")
        results.answered_by[call.tool_call_id] = (approval.decided_by if approval else None) or ""
    return results


async def run_with_console(
    agent: Agent[Any, Any],
    prompt: str,
    client: AsyncClient,
    *,
    decision_timeout: float | None = None,
    max_rounds: int = 20,
    on_approval: Callable[[DeferredToolRequests], None] | None = None,
    **run_kwargs: Any,
) -> AgentRunResult[Any]:
    """Run ``agent`` (whose output types include ``DeferredToolRequests``) until its output is
    not a request for approvals, holding the run while the console decides each one."""
    result: AgentRunResult[Any] = await agent.run(
        prompt, output_type=[agent.output_type, DeferredToolRequests], **run_kwargs
    )
    for _ in range(max_rounds):
        if not isinstance(result.output, DeferredToolRequests):
            return result
        if on_approval is not None:
            on_approval(result.output)
        results = await decisions_for(client, result.output, timeout=decision_timeout)
        result = await agent.run(
            message_history=result.all_messages(),
            deferred_tool_results=results,
            output_type=[agent.output_type, DeferredToolRequests],
            **run_kwargs,
        )
    raise RuntimeError(f"the run still waited for approvals after {max_rounds} rounds")


def _dumped(response: ModelResponse) -> Any:
    """The response as Pydantic AI's message adapter dumps it, for a restarted run to replay."""
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def _replayed(recorded: dict[str, Any]) -> ModelResponse:
    (message,) = ModelMessagesTypeAdapter.validate_python([recorded["response"]])
    if not isinstance(message, ModelResponse):
        raise ModelCallEnded(f"a model call recorded a {message.kind}, not a response")
    return message


class ConsoleModel(WrapperModel):
    """A model whose every request is a turn of a durable run: an agent-executed operation of
    the console's ``model.call`` under the step ``run:<run_key>:turn:<n>`` (n counts this
    model's requests, from 1), proposed with an estimate of ``model_tokens``, claimed, and
    completed with the tokens used and the response itself.

    A turn the console already holds a response for is not asked again: the recorded response
    is replayed, with its tool calls' ids, so the tools' operations (steps named after those
    ids) are the same ones and a restarted agent repeats no effect. Give the same ``run_key``
    to the run that restarts (one ConsoleModel per run of the task); a turn whose earlier
    claimant died is claimed again once its lease lapses. Streamed requests (``run_stream``,
    ``iter``) are turns too: the live stream is passed through and recorded when it ends."""

    def __init__(
        self,
        wrapped: Model,
        *,
        client: AsyncClient,
        task_id: str,
        estimate_tokens: int = 1000,
        tool: str = "model.call",
        run_key: str = "main",
        poll_seconds: float = 0.5,
        approval_timeout: float | None = None,
    ) -> None:
        super().__init__(wrapped)
        self.client = client
        self.task_id = task_id
        # ``tool``: the console's model-call tool (agent-run, present with the demo tools off);
        # another agent-run tool may be named instead (a declared one), taking the same params.
        self.turns = Turns(
            client,
            task_id,
            run_key=run_key,
            tool=tool,
            estimate_tokens=estimate_tokens,
            poll_seconds=poll_seconds,
            approval_timeout=approval_timeout,
        )

    async def _record(self, lease: AsyncLease, response: ModelResponse) -> None:
        usage = response.usage
        await self.turns.record(
            lease,
            model=response.model_name,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            response=_dumped(response),
        )

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        op = await self.turns.next(self.wrapped.model_name)
        while True:
            async with AsyncExitStack() as stack:
                held = await self.turns.hold(op, stack)
                if isinstance(held, dict):
                    return _replayed(held)
                response = await self.wrapped.request(
                    messages, model_settings, model_request_parameters
                )
                try:
                    await self._record(held, response)
                except StaleLease:
                    # Taken over while the model answered: this answer is not the recorded
                    # one, so the run does not act on it; the turn is claimed or replayed again.
                    pass
                else:
                    return response
            op = await self.client.get_operation(op.id)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        op = await self.turns.next(self.wrapped.model_name)
        async with AsyncExitStack() as stack:
            held = await self.turns.hold(op, stack)
            if isinstance(held, dict):
                # Replayed as stream events, so a streaming consumer sees the recorded answer.
                yield CompletedStreamedResponse(
                    _replayed(held),
                    model_request_parameters=model_request_parameters,
                    replay_events=True,
                )
                return
            async with self.wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as streamed:
                yield streamed
                async for _ in streamed:
                    pass  # what the caller left unread: the recorded response is the whole one
            # A lease lost meanwhile raises StaleLease here, before the run acts on the
            # response's tool calls: unrecorded, they must not run (a restart asks again).
            await self._record(held, streamed.get())


def console_toolset(
    wrapped: AbstractToolset[Any],
    client: AsyncClient,
    task_id: str,
    tools: Mapping[str, str],
    *,
    wait_timeout: float | None = None,
) -> ConsoleToolset:
    """``ConsoleToolset(wrapped, client=..., task_id=..., tools=...)``."""
    return ConsoleToolset(
        wrapped, client=client, task_id=task_id, tools=tools, wait_timeout=wait_timeout
    )


__all__: Sequence[str] = [
    "ConsoleModel",
    "ConsoleToolset",
    "ModelCallDenied",
    "ModelCallEnded",
    "console_toolset",
    "decisions_for",
    "run_with_console",
]
