"""A Pydantic AI agent asks the console for a refund that needs a person's approval.

    python -m agent_console_client.examples.refund --base-url URL --token TOKEN

The model is Pydantic AI's ``FunctionModel`` (no hosted model is needed): it calls the agent's
``issue_refund`` tool once and reports what came back. The tool runs in the console as the
sandbox's ``demo.payments.charge`` (a payout to the customer's account), which needs approval
above 10000 cents, so the run waits until a person approves or denies it on /approvals/ (or
over the API). Each model call is an operation too, with its tokens posted to the task's budget.
Prints the outcome and exits 0 once decided; 1 on an error.

With ``--task-key KEY`` the run is durable: the task is got or created under KEY, so the same
command started again after the agent died (killed at any point) finds the same task, replays the
model's recorded answers, and waits for the same refund instead of making a second one.
``--model-delay`` makes each model answer take that many seconds, as a hosted model's would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import FunctionToolset

from agent_console_client import AsyncClient, ConsoleError
from agent_console_client.pydantic_ai import ConsoleModel, ConsoleToolset, run_with_console


def issue_refund(account: str, amount_cents: int) -> dict[str, Any]:
    """Refund ``amount_cents`` to the customer's ``account``."""
    raise RuntimeError("runs in the console, never here")  # ConsoleToolset proposes it


def refund_script(account: str, amount_cents: int, delay: float = 0.0) -> FunctionModel:
    """The model's side: ask for the refund, then say what the tool answered."""

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(delay)
        for message in reversed(messages):
            if not isinstance(message, ModelRequest):
                continue
            for part in message.parts:
                if part.part_kind == "tool-return":
                    outcome = getattr(part, "outcome", "success")
                    content = part.model_response_str()
                    return ModelResponse(parts=[TextPart(f"refund {outcome}: {content}")])
            break
        call = ToolCallPart("issue_refund", {"account": account, "amount_cents": amount_cents})
        return ModelResponse(parts=[call])

    return FunctionModel(respond, model_name="refund-script")


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--account", default="cust-1001")
    parser.add_argument("--amount-cents", type=int, default=25000)
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for a person"
    )
    parser.add_argument("--task-key", help="get or create the task under this key (durable run)")
    parser.add_argument("--model-delay", type=float, default=0.0, help="seconds per model answer")
    args = parser.parse_args(argv)

    async with AsyncClient(base_url=args.base_url, token=args.token) as console:
        try:
            input = {"account": args.account, "amount_cents": args.amount_cents}
            budget = {"model_tokens": 100_000.0}
            if args.task_key:
                task = await console.get_or_create_task(
                    args.task_key, "refund a customer", input, budget=budget
                )
            else:
                task = await console.create_task("refund a customer", input, budget=budget)
            print(f"task {task.id}", flush=True)
            tools = FunctionToolset([issue_refund])
            agent = Agent(
                ConsoleModel(
                    refund_script(args.account, args.amount_cents, args.model_delay),
                    client=console,
                    task_id=task.id,
                    run_key="refund",
                ),
                toolsets=[
                    ConsoleToolset(
                        tools,
                        client=console,
                        task_id=task.id,
                        tools={"issue_refund": "demo.payments.charge"},
                    )
                ],
                output_type=str,
            )

            def waiting(requests: DeferredToolRequests) -> None:
                for call in requests.approvals:
                    meta = requests.metadata.get(call.tool_call_id, {})
                    print(
                        f"waiting for a person to decide approval {meta.get('approval')} "
                        f"(operation {meta.get('operation')}) at {args.base_url}/approvals/",
                        flush=True,
                    )

            result = await run_with_console(
                agent,
                f"Refund {args.amount_cents} cents to {args.account}.",
                console,
                decision_timeout=args.timeout,
                on_approval=waiting,
            )
            spent = await console.get_budget(task.id)
        except ConsoleError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    tokens = spent.meters.get("model_tokens")
    print(f"model_tokens posted: {tokens.posted if tokens else 0}")
    print(f"outcome: {result.output}")
    print("RESULT " + json.dumps({"task": task.id, "output": str(result.output)}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
