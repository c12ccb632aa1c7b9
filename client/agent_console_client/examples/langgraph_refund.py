"""A LangGraph agent asks the console for a refund that needs a person's approval.

    python -m agent_console_client.examples.langgraph_refund --base-url URL --token TOKEN \\
        --thread refund-1001 --checkpoints refunds.sqlite

The graph is a model node and a console tool node. The model node asks a scripted chat model
(no hosted model is needed) through ``ConsoleThreads.chat_model``, so each answer is a turn of
the thread's console task, its tokens posted to the task's budget: the model asks for the
``issue_refund`` tool once, with a fresh call id each time it is really asked (as a model's
are), and reports what came back. The tool runs in the console as the sandbox's
``demo.payments.charge``, which needs approval above 10000 cents: the tool node interrupts, and
the run resumes when a person approves or denies it on /approvals/.

The thread's console task is got or created by the thread id, and its checkpoints are kept in
the SQLite file: kill the agent at any point and run the same command again, and it goes on
where it stopped and refunds once. Lose the checkpoints (another file) and it still refunds
once: the console replays each recorded model answer, call ids and all, without asking the
model again. Prints the outcome and exits 0 once decided; 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.runnables import Runnable, RunnableLambda
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agent_console_client import AsyncClient, ConsoleError
from agent_console_client.langgraph import ConsoleThreads


def refund_chat(
    account: str, amount_cents: int, delay: float
) -> Runnable[Sequence[BaseMessage], BaseMessage]:
    """The scripted chat model: ask for the refund, then say what the tool answered; it reports
    its usage as a hosted model does (``usage_metadata``)."""

    async def answer(messages: Sequence[BaseMessage]) -> BaseMessage:
        print(f"model asked with {len(messages)} messages", flush=True)
        await asyncio.sleep(delay)  # a hosted model's answer takes time
        usage = UsageMetadata(
            input_tokens=20 * len(messages), output_tokens=10, total_tokens=20 * len(messages) + 10
        )
        last = messages[-1]
        if isinstance(last, ToolMessage):
            outcome = "error" if last.status == "error" else "success"
            return AIMessage(f"refund {outcome}: {last.content}", usage_metadata=usage)
        call = {
            "name": "issue_refund",
            "args": {"account": account, "amount_cents": amount_cents},
            "id": f"call_{uuid.uuid4().hex}",
        }
        return AIMessage("", tool_calls=[call], usage_metadata=usage)

    return RunnableLambda(answer, name="scripted-refund-model")


def after_model(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def refund_graph(
    threads: ConsoleThreads,
    model: Runnable[LanguageModelInput, BaseMessage],
    checkpointer: BaseCheckpointSaver[Any],
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The model node asks ``model`` (a ``threads.chat_model``: each answer a console turn);
    the tool node runs the refund in the console."""

    async def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", ask)
    builder.add_node("tools", threads.tool_node({"issue_refund": "demo.payments.charge"}))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", after_model, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--thread", required=True, help="the LangGraph thread (one console task)")
    parser.add_argument("--checkpoints", required=True, help="the SQLite file of checkpoints")
    parser.add_argument("--account", default="cust-1001")
    parser.add_argument("--amount-cents", type=int, default=25000)
    parser.add_argument("--model-delay", type=float, default=0.0, help="seconds per model answer")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for a person"
    )
    args = parser.parse_args(argv)

    async with (
        AsyncClient(base_url=args.base_url, token=args.token) as console,
        AsyncSqliteSaver.from_conn_string(args.checkpoints) as checkpoints,
    ):
        threads = ConsoleThreads(console, name="refund a customer", wait_timeout=args.timeout)
        chat = refund_chat(args.account, args.amount_cents, args.model_delay)
        graph = refund_graph(threads, threads.chat_model(chat), checkpoints)

        def waiting(pending: list[Any]) -> None:
            for item in pending:
                print(
                    f"waiting for a person to decide approval {item['approval']} "
                    f"(operation {item['operation']}) at {args.base_url}/approvals/",
                    flush=True,
                )

        try:
            print(f"task {await threads.task(args.thread)}", flush=True)
            prompt = f"Refund {args.amount_cents} cents to {args.account}."
            values = await threads.run(
                graph,
                {"messages": [HumanMessage(prompt)]},
                args.thread,
                on_approval=waiting,
            )
        except ConsoleError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    output = values["messages"][-1].content
    print(f"outcome: {output}")
    print("RESULT " + json.dumps({"thread": args.thread, "output": output}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
