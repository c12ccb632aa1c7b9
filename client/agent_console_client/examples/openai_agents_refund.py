"""An OpenAI Agents SDK agent asks the console for a refund that needs a person's approval.

    python -m agent_console_client.examples.openai_agents_refund --base-url URL --token TOKEN \\
        --task-key refund-1001

The model is a scripted implementation of the SDK's ``Model`` (no hosted model, no network): it
calls the agent's ``issue_refund`` tool once, with a fresh call id each time it is asked (as a
model's are), and reports what came back. The tool runs in the console as the sandbox's
``demo.payments.charge``, which needs approval above 10000 cents, so the call waits until a
person approves or denies it on /approvals/ (or over the API). Each model turn is recorded in
the console (``ConsoleModel``), with its tokens posted to the task's budget.

With ``--task-key`` the task is got or created under that key: kill the agent at any point and
run the same command again, and it replays the recorded turns, waits for the same refund, and
refunds once. Prints the outcome and exits 0 once decided; 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    AgentOutputSchemaBase,
    Handoff,
    ModelResponse,
    ModelSettings,
    Runner,
    Tool,
    TResponseInputItem,
    Usage,
    set_tracing_disabled,
)
from agents.items import TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponsePromptParam,
)

from agent_console_client import AsyncClient, ConsoleError
from agent_console_client.models import Operation
from agent_console_client.openai_agents import ConsoleModel, console_tool


def issue_refund(account: str, amount_cents: int) -> dict[str, Any]:
    """Refund ``amount_cents`` to the customer's ``account``."""
    raise RuntimeError("runs in the console, never here")  # console_tool proposes it


class RefundModel(Model):
    """The model's side: ask for the refund, then say what the tool answered."""

    def __init__(self, account: str, amount_cents: int, delay: float) -> None:
        self.account, self.amount_cents, self.delay = account, amount_cents, delay

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
        await asyncio.sleep(self.delay)  # a hosted model's answer takes time
        items: list[dict[str, Any]] = [dict(i) for i in input] if isinstance(input, list) else []
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        usage = Usage(requests=1, input_tokens=40, output_tokens=12, total_tokens=52)
        if outputs:
            text = f"refund done: {outputs[-1]['output']}"
            message = ResponseOutputMessage(
                id=f"msg_{uuid.uuid4().hex}",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
            return ModelResponse(output=[message], usage=usage, response_id=None)
        call_id = f"call_{uuid.uuid4().hex}"
        call = ResponseFunctionToolCall(
            id=call_id,
            call_id=call_id,
            type="function_call",
            name="issue_refund",
            arguments=json.dumps({"account": self.account, "amount_cents": self.amount_cents}),
        )
        return ModelResponse(output=[call], usage=usage, response_id=None)

    def stream_response(
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
        raise NotImplementedError("this example runs without streaming")


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--task-key", required=True, help="get or create the task under this key")
    parser.add_argument("--account", default="cust-1001")
    parser.add_argument("--amount-cents", type=int, default=25000)
    parser.add_argument("--model-delay", type=float, default=0.0, help="seconds per model answer")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for a person"
    )
    args = parser.parse_args(argv)
    set_tracing_disabled(True)  # no trace export: nothing leaves for OpenAI

    def waiting(op: Operation) -> None:
        approval = op.approval.id if op.approval else None
        print(
            f"waiting for a person to decide approval {approval} (operation {op.id}) "
            f"at {args.base_url}/approvals/",
            flush=True,
        )

    async with AsyncClient(base_url=args.base_url, token=args.token) as console:
        try:
            task = await console.get_or_create_task(
                args.task_key,
                "refund a customer",
                {"account": args.account, "amount_cents": args.amount_cents},
                budget={"model_tokens": 100_000.0},
            )
            print(f"task {task.id}", flush=True)
            model = RefundModel(args.account, args.amount_cents, args.model_delay)
            agent = Agent(
                name="refunds",
                instructions="Refund customers with the issue_refund tool.",
                model=ConsoleModel(
                    model,
                    client=console,
                    task_id=task.id,
                    model_name="refund-script",
                    run_key="refund",
                ),
                tools=[
                    console_tool(
                        issue_refund,
                        "demo.payments.charge",
                        client=console,
                        task_id=task.id,
                        wait_timeout=args.timeout,
                        on_waiting=waiting,
                    )
                ],
            )
            prompt = f"Refund {args.amount_cents} cents to {args.account}."
            result = await Runner.run(agent, prompt)
        except ConsoleError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(f"outcome: {result.final_output}")
    print("RESULT " + json.dumps({"task": task.id, "output": str(result.final_output)}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
