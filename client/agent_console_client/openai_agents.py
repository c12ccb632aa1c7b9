"""OpenAI Agents SDK adapter (``pip install ./client[openai-agents]``): the console decides what
an agent's function tools do, and its model turns are recorded so a restarted run repeats none.

- ``console_tool(stub, "demo.payments.charge", client=..., task_id=...)`` is a ``FunctionTool``
  with the stub's name, docstring and parameter schema (as ``function_tool`` makes them) whose
  call proposes an operation of the task (its step is the call's ``call_id``, so a call made
  again is the same operation), waits for its result, and returns it to the model; a call the
  console holds for a person's approval waits for the decision (made in the console), and a
  denial, a failure or a refusal of the parameters is returned as text the model reads.
- ``ConsoleModel(model, client=..., task_id=..., run_key="main")`` wraps the SDK's ``Model``: each
  request (``get_response`` or ``stream_response``) is a turn of a durable run, the console's
  ``model.call`` under the step ``run:<run_key>:turn:<n>``, completed with the tokens used and
  the response's output items. A restarted agent on the same task and run key gets each
  recorded response back instead of asking the model again, so its tool calls keep their
  ``call_id``s and propose the same operations: no effect happens twice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

from agents import FunctionTool, function_tool
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItem,
    ResponsePromptParam,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import TypeAdapter

from agent_console_client._async import AsyncClient, AsyncLease
from agent_console_client._turns import ModelCallDenied, ModelCallEnded, Turns
from agent_console_client.errors import REFUSALS, StaleLease
from agent_console_client.models import TERMINAL_STATUSES, Operation

# Where a tool call's wait ends: done, or handed to support staff.
SETTLED = TERMINAL_STATUSES | {"unresolved", "manual_intervention"}
_OUTPUT = TypeAdapter(list[ResponseOutputItem])


def _step(call_id: str) -> str:
    # The console's steps are names; a provider's call id may carry other characters.
    return "call-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in call_id)[:180]


def _answer(op: Operation) -> str:
    """The console's last word on a call, as the model reads it."""
    if op.status == "succeeded":
        return json.dumps(op.result, default=str)
    approval = op.approval
    if approval is not None and approval.status not in ("approved", "released", "pending"):
        return f"Denied by {approval.decided_by or 'the console'}: {approval.reason or op.status}"
    detail = op.error.get("message") if isinstance(op.error, dict) else op.error
    return f"the console's operation {op.id} ended {op.status}: {detail or 'no result'}"


def console_tool(
    stub: Callable[..., Any],
    tool: str,
    *,
    client: AsyncClient,
    task_id: str,
    wait_timeout: float | None = None,
    on_waiting: Callable[[Operation], None] | None = None,
) -> FunctionTool:
    """A function tool run by the console as ``tool``; ``stub`` gives its name, description
    and parameters and is never called. ``on_waiting`` is told when a call waits for a
    person."""
    shape = function_tool(stub)

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        try:
            op = await client.propose(
                task_id, tool, json.loads(arguments or "{}"), step=_step(ctx.tool_call_id)
            )
        except REFUSALS as exc:  # parameters, policy, budget: the model reads why
            return f"the console refused the call: {exc}"
        if op.status == "waiting_approval" and on_waiting is not None:
            on_waiting(op)
        if op.status not in SETTLED:
            op = await client.wait_operation(op.id, until=SETTLED, timeout=wait_timeout)
        return _answer(op)

    return FunctionTool(
        name=shape.name,
        description=shape.description,
        params_json_schema=shape.params_json_schema,
        on_invoke_tool=invoke,
        strict_json_schema=shape.strict_json_schema,
    )


def _usage(response: ModelResponse) -> tuple[int, int]:
    return response.usage.input_tokens, response.usage.output_tokens


def _dumped(response: ModelResponse) -> dict[str, Any]:
    return {
        "output": [item.model_dump(mode="json") for item in response.output],
        "response_id": response.response_id,
    }


def _replayed(recorded: dict[str, Any]) -> ModelResponse:
    response = recorded["response"]
    input_tokens, output_tokens = recorded["input_tokens"], recorded["output_tokens"]
    return ModelResponse(
        output=_OUTPUT.validate_python(response["output"]),
        usage=Usage(
            requests=1,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
        ),
        response_id=response.get("response_id"),
    )


def _completed(response: ModelResponse, model: str) -> ResponseCompletedEvent:
    """A recorded response as the one event a stream's consumer needs: ``response.completed``."""
    usage = response.usage
    return ResponseCompletedEvent(
        type="response.completed",
        sequence_number=0,
        response=Response(
            id=response.response_id or "replayed",
            created_at=0,
            model=model,
            object="response",
            output=response.output,
            tool_choice="auto",
            tools=[],
            top_p=None,
            parallel_tool_calls=False,
            status="completed",
            usage=ResponseUsage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                total_tokens=usage.input_tokens + usage.output_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            ),
        ),
    )


class ConsoleModel(Model):
    """The SDK's model whose every request is a turn of a durable run (see the module's
    docstring). One ConsoleModel per run; the same ``run_key`` for the run that restarts."""

    def __init__(
        self,
        wrapped: Model,
        *,
        client: AsyncClient,
        task_id: str,
        model_name: str = "model",
        run_key: str = "main",
        estimate_tokens: int = 1000,
        tool: str = "model.call",
        poll_seconds: float = 0.5,
        approval_timeout: float | None = None,
    ) -> None:
        self.wrapped = wrapped
        self.client = client
        self.model_name = model_name
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
        input_tokens, output_tokens = _usage(response)
        await self.turns.record(
            lease,
            model=self.model_name,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            response=_dumped(response),
        )

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        op = await self.turns.next(self.model_name)
        while True:
            async with AsyncExitStack() as stack:
                held = await self.turns.hold(op, stack)
                if isinstance(held, dict):
                    return _replayed(held)
                response = await self.wrapped.get_response(
                    system_instructions,
                    input,
                    model_settings,
                    tools,
                    output_schema,
                    handoffs,
                    tracing,
                    previous_response_id=previous_response_id,
                    conversation_id=conversation_id,
                    prompt=prompt,
                )
                try:
                    await self._record(held, response)
                except StaleLease:
                    pass  # taken over while the model answered: asked or replayed again
                else:
                    return response
            op = await self.client.get_operation(op.id)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        op = await self.turns.next(self.model_name)
        async with AsyncExitStack() as stack:
            held = await self.turns.hold(op, stack)
            if isinstance(held, dict):
                yield _completed(_replayed(held), self.model_name)
                return
            completed: Response | None = None
            async for event in self.wrapped.stream_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            ):
                if isinstance(event, ResponseCompletedEvent):
                    completed = event.response
                yield event
            if completed is None:
                raise ModelCallEnded("the model's stream ended without response.completed")
            usage = completed.usage
            # Recorded before the runner acts on the calls (it reads the stream to its end
            # first); a lease lost meanwhile raises StaleLease, so none of them runs.
            await self._record(
                held,
                ModelResponse(
                    output=list(completed.output),
                    usage=Usage(
                        requests=1,
                        input_tokens=usage.input_tokens if usage else 0,
                        output_tokens=usage.output_tokens if usage else 0,
                        total_tokens=usage.total_tokens if usage else 0,
                    ),
                    response_id=completed.id,
                ),
            )


__all__: Sequence[str] = ["ConsoleModel", "ModelCallDenied", "ModelCallEnded", "console_tool"]
