"""The agent adapters against the real web server, in this process: an operator's denial in the
console reaches the model with its reason (LangGraph: through the interrupt the runner resumes;
OpenAI Agents: the function tool's wait); parameters the console refuses reach the model as a
failed tool result, never a traceback (each adapter); and an OpenAI Agents streamed run is a
recorded turn that a restarted run replays without asking the model, as is a Pydantic AI one
(``run_stream``, then ``iter``); a model turn a policy holds for approval waits for the decision
(approved: asked, recorded, replayed; denied: ModelCallDenied with the reason). A LangGraph
model node's chat model (``ConsoleThreads.chat_model``) makes the same turns: tokens posted to
the task's budget, a thread run again replays them, a budget too small refuses them, a gated
one waits for the operator; Sends and subgraph runs are turns of their own.

(Here, not beside the Pydantic AI example's tests: the browser those use keeps an event loop
running in this thread, and these run their agents with ``asyncio.run``.)"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

import pytest
from agent_console_client import AsyncClient
from agent_console_client.errors import BudgetExhausted
from agent_console_client.examples.langgraph_refund import refund_chat, refund_graph
from agent_console_client.examples.refund import issue_refund, refund_script
from agent_console_client.langgraph import ConsoleThreads
from agent_console_client.openai_agents import ConsoleModel, ModelCallDenied, console_tool
from agent_console_client.pydantic_ai import ConsoleModel as PydanticConsoleModel
from agent_console_client.pydantic_ai import ConsoleToolset, run_with_console
from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.testing.model import ScriptedModel, assistant_message, function_call
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from runtime.models import Operation
from runtime.tool_declarations import tool_declare
from runtime.tools.declared import declarations_forget
from tests import factories
from tests.conftest import Server

pytestmark = pytest.mark.postgres

REASON = "already refunded by hand"


async def _deny_first_approval(server: Server, token: str, task_key: str) -> str:
    """As an operator: wait for the task's first pending approval and deny it."""
    async with AsyncClient(base_url=server.url, token=token) as operator:
        while True:
            task = await operator.find_task(task_key)
            pending = await operator.list_approvals(task=task.id) if task else []
            if pending:
                await operator.decide(pending[0].id, "deny", reason=REASON)
                return pending[0].id
            await asyncio.sleep(0.05)  # polling the API for the approval to appear


async def _decide_first_approval(server: Server, token: str, task_key: str, decision: str) -> str:
    """As an operator: wait for the task's first pending approval and decide it."""
    async with AsyncClient(base_url=server.url, token=token) as operator:
        while True:
            task = await operator.find_task(task_key)
            pending = await operator.list_approvals(task=task.id) if task else []
            if pending:
                approval = pending[0]
                await operator.decide(
                    approval.id, decision, reason=REASON, params_hash=approval.params_hash
                )
                return approval.id
            await asyncio.sleep(0.05)  # polling the API for the approval to appear


def refund(account: str, amount_cents: int) -> dict[str, Any]:
    """Refund ``amount_cents`` to the customer's ``account``."""
    raise AssertionError("runs in the console")


def _graph(threads: ConsoleThreads, amount_cents: int, **turns: Any) -> Any:
    """The example's refund graph, its model's answers turns of the thread (``turns``: the
    chat model's settings), on checkpoints kept in memory (a new graph has none)."""
    chat = threads.chat_model(refund_chat("cust-9", amount_cents, 0.0), **turns)
    return refund_graph(threads, chat, InMemorySaver())


def _counted(asked: list[int], amount_cents: int) -> Any:
    """The example's scripted model, counting what it is really asked (the messages it reads)."""

    def count(messages: list[BaseMessage]) -> list[BaseMessage]:
        asked.append(len(messages))
        return messages

    return RunnableLambda(count) | refund_chat("cust-9", amount_cents, 0.0)


def test_a_langgraph_thread_resumes_with_the_operators_denial(server: Server) -> None:
    agent, operator = factories.agent(), factories.console_user("operator")
    asked: list[list[Any]] = []

    async def scenario() -> tuple[Any, str]:
        async with AsyncClient(base_url=server.url, token=agent.token) as console:
            threads = ConsoleThreads(console, name="refunds", wait_timeout=30)
            graph = _graph(threads, 25000)
            denied = asyncio.create_task(
                _deny_first_approval(server, operator.token, "langgraph:t-1")
            )
            values = await threads.run(
                graph, {"messages": [HumanMessage("refund")]}, "t-1", on_approval=asked.append
            )
            return values, await denied

    values, approval_id = asyncio.run(scenario())
    last = values["messages"][-1].content
    assert "refund error" in last and REASON in last, last
    assert [[item["approval"] for item in pending] for pending in asked] == [[approval_id]]
    (op,) = Operation.objects.filter(task__external_id="langgraph:t-1").exclude(tool="model.call")
    assert op.tool == "demo.payments.charge" and op.status == "failed"


def test_an_openai_agents_tool_returns_the_operators_denial(server: Server) -> None:
    set_tracing_disabled(True)
    agent, operator = factories.agent(), factories.console_user("operator")
    scripted = ScriptedModel(
        [
            [function_call("refund", {"account": "cust-9", "amount_cents": 25000}, call_id="c1")],
            [assistant_message("told the customer")],
        ]
    )

    async def scenario() -> str:
        async with AsyncClient(base_url=server.url, token=agent.token) as console:
            task = await console.get_or_create_task("oa-deny", "refunds")
            runner_agent = Agent(
                name="refunds",
                model=ConsoleModel(scripted, client=console, task_id=task.id),
                tools=[
                    console_tool(
                        refund,
                        "demo.payments.charge",
                        client=console,
                        task_id=task.id,
                        wait_timeout=30,
                    )
                ],
            )
            denied = asyncio.create_task(_deny_first_approval(server, operator.token, "oa-deny"))
            result = await Runner.run(runner_agent, "refund")
            await denied
            return str(result.final_output)

    assert asyncio.run(scenario()) == "told the customer"
    last = scripted.last_call
    assert last is not None
    (output,) = [i for i in last.input if i.get("type") == "function_call_output"]
    assert output["call_id"] == "c1" and REASON in output["output"], output
    op = Operation.objects.get(task__external_id="oa-deny", tool="demo.payments.charge")
    assert op.step == "call-c1" and op.status == "failed"


def test_an_openai_agents_streamed_run_is_recorded_and_replayed(server: Server) -> None:
    set_tracing_disabled(True)
    principal = factories.agent()
    usage = Usage(requests=1, input_tokens=10, output_tokens=3, total_tokens=13)
    # One scripted answer: a second request of the model would raise UnexpectedModelCall.
    scripted = ScriptedModel(
        [ModelResponse(output=[assistant_message("refund sent")], usage=usage, response_id=None)]
    )

    async def scenario() -> tuple[str, str, float]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            task = await console.get_or_create_task(
                "oa-stream", "streamed", budget={"model_tokens": 10_000}
            )
            outputs = []
            for _ in range(2):  # the second is the restarted run
                agent = Agent(
                    name="s", model=ConsoleModel(scripted, client=console, task_id=task.id)
                )
                streamed = Runner.run_streamed(agent, "go")
                async for _event in streamed.stream_events():
                    pass
                outputs.append(str(streamed.final_output))
            budget = await console.get_budget(task.id)
            meter = budget.meters.get("model_tokens")
            return outputs[0], outputs[1], meter.posted if meter else 0.0

    first, replayed, posted = asyncio.run(scenario())
    assert first == replayed == "refund sent"
    assert len(scripted.calls) == 1 and scripted.calls[0].streamed
    (turn,) = Operation.objects.filter(task__external_id="oa-stream", tool="model.call")
    assert (turn.step, turn.status) == ("run:main:turn:1", "succeeded")
    assert posted == 13


def test_refused_parameters_reach_each_adapters_model_as_a_failed_call(server: Server) -> None:
    """A refund of -5 cents: the console answers 400 invalid_params, and the model of each
    adapter reads it as the call's failure; the run ends normally, with no operation."""
    set_tracing_disabled(True)
    principal = factories.agent()
    scripted = ScriptedModel(
        [
            [function_call("refund", {"account": "cust-9", "amount_cents": -5}, call_id="c1")],
            [assistant_message("could not refund")],
        ]
    )

    async def scenario() -> tuple[str, str, str]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            threads = ConsoleThreads(console, name="refunds", wait_timeout=30)
            values = await threads.run(
                _graph(threads, -5), {"messages": [HumanMessage("refund")]}, "t-bad"
            )
            task = await console.get_or_create_task("bad-params", "refunds")
            pydantic_agent = PydanticAgent(
                refund_script("cust-9", -5),
                toolsets=[
                    ConsoleToolset(
                        FunctionToolset([issue_refund]),
                        client=console,
                        task_id=task.id,
                        tools={"issue_refund": "demo.payments.charge"},
                    )
                ],
                output_type=str,
            )
            pydantic_result = await pydantic_agent.run("refund")
            openai_agent = Agent(
                name="refunds",
                model=scripted,
                tools=[
                    console_tool(refund, "demo.payments.charge", client=console, task_id=task.id)
                ],
            )
            await Runner.run(openai_agent, "refund")
            last = scripted.last_call
            assert last is not None
            (output,) = [i for i in last.input if i.get("type") == "function_call_output"]
            return values["messages"][-1].content, pydantic_result.output, output["output"]

    langgraph_said, pydantic_said, openai_said = asyncio.run(scenario())
    assert langgraph_said.startswith("refund error: the console refused the call"), langgraph_said
    assert "refused the call" in pydantic_said and "amount_cents" in pydantic_said, pydantic_said
    assert openai_said.startswith("the console refused the call"), openai_said
    assert not Operation.objects.filter(tool="demo.payments.charge").exists()


def test_a_restarted_pydantic_ai_run_hears_the_same_denial(server: Server) -> None:
    """Denied in the console, then run again on the same task (a restart after the model heard
    the denial): every turn is replayed, and the refund's call is answered with the same
    ToolDenied and reason, not as a failed call."""
    principal, operator = factories.agent(), factories.console_user("operator")

    def tool_results(messages: list[Any]) -> list[tuple[str, str]]:
        return [
            (part.outcome, part.model_response_str())
            for message in messages
            for part in getattr(message, "parts", [])
            if part.part_kind == "tool-return"
        ]

    async def scenario() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            task = await console.get_or_create_task("pa-deny", "refunds")
            heard = []
            for run in range(2):
                agent = PydanticAgent(
                    PydanticConsoleModel(
                        refund_script("cust-9", 25000), client=console, task_id=task.id
                    ),
                    toolsets=[
                        ConsoleToolset(
                            FunctionToolset([issue_refund]),
                            client=console,
                            task_id=task.id,
                            tools={"issue_refund": "demo.payments.charge"},
                        )
                    ],
                    output_type=str,
                )
                denied = None
                if run == 0:
                    denied = asyncio.create_task(
                        _deny_first_approval(server, operator.token, "pa-deny")
                    )
                result = await run_with_console(agent, "refund", console, decision_timeout=30)
                if denied is not None:
                    await denied
                heard.append(tool_results(result.all_messages()))
            return heard[0], heard[1]

    first, restarted = asyncio.run(scenario())
    assert first == restarted, (first, restarted)
    assert first[0][0] == "denied" and REASON in first[0][1], first
    turns = Operation.objects.filter(task__external_id="pa-deny", tool="model.call")
    assert turns.count() == 2 and all(op.attempts_used == 1 for op in turns)


def test_a_pydantic_ai_streamed_run_is_a_recorded_turn_a_restart_replays(server: Server) -> None:
    """``run_stream`` and ``iter`` go through ConsoleModel: the streamed answer is a model.call
    operation with its tokens posted, and a restarted run (a new agent on the same task and run
    key) streams the recorded answer without asking the model again."""
    principal = factories.agent()
    asked: list[int] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        asked.append(len(messages))
        yield "refund "
        yield "sent"

    async def runs() -> tuple[str, list[str], str, float]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            task = await console.get_or_create_task(
                "stream-1", "streamed", budget={"model_tokens": 10_000}
            )

            def agent() -> PydanticAgent[None, str]:
                model = FunctionModel(stream_function=stream, model_name="streamer")
                return PydanticAgent(
                    PydanticConsoleModel(model, client=console, task_id=task.id), output_type=str
                )

            async with agent().run_stream("go") as first:
                live = [delta async for delta in first.stream_text(delta=True)]
            replayed = ""
            async with agent().iter("go") as run:
                async for node in run:
                    if PydanticAgent.is_model_request_node(node):
                        async with node.stream(run.ctx) as events:
                            replayed = "".join([t async for t in events.stream_text(delta=True)])
            budget = await console.get_budget(task.id)
            meter = budget.meters.get("model_tokens")
            return task.id, live, replayed, meter.posted if meter else 0.0

    task_id, live, replayed, posted = asyncio.run(runs())
    assert "".join(live) == replayed == "refund sent"
    assert len(asked) == 1  # the restart replayed the turn
    (turn,) = Operation.objects.filter(task_id=task_id, tool="model.call")
    assert (turn.step, turn.status, turn.executor) == ("run:main:turn:1", "succeeded", "agent")
    assert isinstance(turn.result, dict)
    assert turn.result["response"]["parts"][0]["content"] == "refund sent"
    assert posted > 0


def test_a_model_turn_held_for_approval_waits_for_the_decision(server: Server) -> None:
    """A run whose model tool a policy gates (an agent-run tool declared with ``always``): the
    turn waits for the operator; approved, the model is asked and its answer recorded (a
    restarted run replays it without asking); denied, the run ends with ModelCallDenied naming
    the operator's reason, the model never asked."""
    set_tracing_disabled(True)
    admin, operator = factories.console_user("admin"), factories.console_user("operator")
    tool_declare(
        admin.actor,
        {
            "name": "acme.llm.gated",
            "kind": "agent",
            "contract": "pure",
            "description": "A model call an operator must allow.",
            "params_schema": {"type": "object"},
            "approval": {"required": "always"},
        },
    )
    principal = factories.agent()
    usage = Usage(requests=1, input_tokens=4, output_tokens=2, total_tokens=6)
    # One scripted answer: a second request of the model would raise UnexpectedModelCall.
    scripted = ScriptedModel(
        [ModelResponse(output=[assistant_message("allowed")], usage=usage, response_id=None)]
    )

    async def run(console: AsyncClient, task_id: str) -> str:
        model = ConsoleModel(
            scripted, client=console, task_id=task_id, tool="acme.llm.gated", approval_timeout=30
        )
        return str((await Runner.run(Agent(name="g", model=model), "go")).final_output)

    async def scenario() -> tuple[list[str], str]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            allowed = await console.get_or_create_task("gated-yes", "gated model")
            decided = asyncio.create_task(
                _decide_first_approval(server, operator.token, "gated-yes", "approve")
            )
            outputs = [(await asyncio.gather(run(console, allowed.id), decided))[0]]
            outputs.append(await run(console, allowed.id))  # the restarted run
            refused = await console.get_or_create_task("gated-no", "gated model")
            decided = asyncio.create_task(
                _decide_first_approval(server, operator.token, "gated-no", "deny")
            )
            with pytest.raises(ModelCallDenied) as denial:
                await asyncio.gather(run(console, refused.id), decided)
            return outputs, str(denial.value)

    try:
        outputs, denial = asyncio.run(scenario())
    finally:
        declarations_forget()
    assert outputs == ["allowed", "allowed"]
    assert len(scripted.calls) == 1
    assert REASON in denial and operator.actor.name in denial, denial
    yes = Operation.objects.get(task__external_id="gated-yes", tool="acme.llm.gated")
    assert (yes.step, yes.status) == ("run:main:turn:1", "succeeded")
    assert yes.result is not None
    assert yes.result["response"]["output"][0]["content"][0]["text"] == "allowed"
    no = Operation.objects.get(task__external_id="gated-no", tool="acme.llm.gated")
    assert no.status != "succeeded" and no.approvals.get().status == "denied"


def test_a_langgraph_threads_model_answers_are_turns_a_rerun_replays(server: Server) -> None:
    """The model node's chat model is a ``threads.chat_model``: each answer is a model.call
    operation of the thread's task (step ``run:main:turn:<graph step>.<node>``), its usage
    posted to the task's model_tokens budget. Run again from its input (its checkpoints lost:
    a new graph, kept in memory), the thread replays both recorded answers without asking the
    model: the first one's call id is kept, so the tool node finds the operation the operator
    denied, and no approval is asked for again."""
    agent, operator = factories.agent(), factories.console_user("operator")
    asked: list[int] = []
    approvals: list[list[Any]] = []

    async def run(console: AsyncClient) -> tuple[Any, str]:
        threads = ConsoleThreads(
            console, name="refunds", budget={"model_tokens": 10_000}, wait_timeout=30
        )
        chat = threads.chat_model(_counted(asked, 25000), model_name="scripted")
        graph = refund_graph(threads, chat, InMemorySaver())
        values = await threads.run(
            graph, {"messages": [HumanMessage("refund")]}, "t-turns", on_approval=approvals.append
        )
        return values, await threads.task("t-turns")

    async def scenario() -> tuple[list[Any], float]:
        async with AsyncClient(base_url=server.url, token=agent.token) as console:
            denied = asyncio.create_task(
                _deny_first_approval(server, operator.token, "langgraph:t-turns")
            )
            first, task_id = await run(console)
            await denied
            again, _ = await run(console)  # the restarted agent, without checkpoints
            budget = await console.get_budget(task_id)
            meter = budget.meters.get("model_tokens")
            return [first, again], meter.posted if meter else 0.0

    (first, again), posted = asyncio.run(scenario())
    assert asked == [1, 3]  # the rerun asked nothing
    assert len(approvals) == 1
    said = [[m.content for m in values["messages"]] for values in (first, again)]
    assert said[0] == said[1] and REASON in said[0][-1], said
    calls = [values["messages"][1].tool_calls[0]["id"] for values in (first, again)]
    assert calls[0] == calls[1]
    turns = Operation.objects.filter(task__external_id="langgraph:t-turns", tool="model.call")
    assert sorted((op.step, op.status, op.executor, op.attempts_used) for op in turns) == [
        ("run:main:turn:1.model", "succeeded", "agent", 1),
        ("run:main:turn:3.model", "succeeded", "agent", 1),
    ]
    # The scripted model's usage: 20 tokens per message read and 10 written, for 1 then 3.
    assert posted == (20 * 1 + 10) + (20 * 3 + 10)
    (charge,) = Operation.objects.filter(
        task__external_id="langgraph:t-turns", tool="demo.payments.charge"
    )
    assert (charge.step, charge.status) == (f"call-{calls[0]}", "failed")


def test_a_langgraph_turn_the_budget_cannot_cover_is_refused(server: Server) -> None:
    """A turn proposed with an estimate above what the task's model_tokens budget has left is
    refused before the model is asked: the run ends with BudgetExhausted, as the other
    adapters' runs do. A smaller ``estimate_tokens`` fits the same budget."""
    principal = factories.agent()
    asked: list[int] = []

    async def scenario() -> Any:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            threads = ConsoleThreads(console, name="refunds", budget={"model_tokens": 500})
            start = {"messages": [HumanMessage("refund")]}
            chat = threads.chat_model(_counted(asked, -5))  # estimates 1000 tokens a turn
            with pytest.raises(BudgetExhausted):
                await threads.run(refund_graph(threads, chat, InMemorySaver()), start, "t-poor")
            assert asked == []
            frugal = threads.chat_model(_counted(asked, -5), estimate_tokens=400)
            return await threads.run(refund_graph(threads, frugal, InMemorySaver()), start, "t-ok")

    values = asyncio.run(scenario())
    assert values["messages"][-1].content.startswith("refund error: the console refused")
    assert asked == [1, 3]
    assert not Operation.objects.filter(task__external_id="langgraph:t-poor").exists()
    assert (
        Operation.objects.filter(task__external_id="langgraph:t-ok", tool="model.call").count() == 2
    )


class _Fan(TypedDict):
    items: list[str]
    answers: Annotated[list[str], operator.add]


def _echo(asked: list[str]) -> Any:
    """A scripted chat model answering what the last message said, counting what it is asked;
    its metadata holds a datetime, as some providers' do (recorded as text)."""

    def answer(messages: list[BaseMessage]) -> BaseMessage:
        asked.append(str(messages[-1].content))
        created = {"created_at": datetime(2026, 1, 2, tzinfo=UTC)}
        return AIMessage(f"echo {messages[-1].content}", response_metadata=created)

    return RunnableLambda(answer, name="echo")


def _fan_graph(threads: ConsoleThreads, asked: list[str]) -> Any:
    """Each item goes to the ``ask`` node by a ``Send`` (the same node, twice in one step), then
    a subgraph asking the same model runs twice, from a private state of one message each time
    (its own steps start again at 1)."""
    chat = threads.chat_model(_echo(asked))

    async def ask(item: dict[str, str]) -> dict[str, Any]:
        answer = await chat.ainvoke([HumanMessage(item["item"])])
        return {"answers": [answer.content]}

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await chat.ainvoke(state["messages"])]}

    inner = StateGraph(MessagesState)
    inner.add_node("agent", agent)
    inner.add_edge(START, "agent")
    sub = inner.compile()

    async def delegate(state: _Fan) -> dict[str, Any]:
        done = len(state["answers"])
        values = await sub.ainvoke({"messages": [HumanMessage(f"task {done}")]})
        return {"answers": [values["messages"][-1].content]}

    def more(state: _Fan) -> str:
        return "delegate" if len(state["answers"]) < 4 else END

    builder = StateGraph(_Fan)
    builder.add_node("ask", ask)
    builder.add_node("delegate", delegate)
    fan = [Send("ask", {"item": item}) for item in ("a", "b")]
    builder.add_conditional_edges(START, lambda state: fan, ["ask"])
    builder.add_edge("ask", "delegate")
    builder.add_conditional_edges("delegate", more, ["delegate", END])
    return builder.compile(checkpointer=InMemorySaver())


def test_langgraph_turns_of_sends_and_subgraphs_are_told_apart(server: Server) -> None:
    """Two ``Send``s to one node in one step, and a subgraph run twice whose inner step is the
    same both times: each request is a turn of its own, answered for what it asked (a shared
    name would hand the second request the first one's recorded answer). Run again from its
    input, the thread replays the Sends' turns."""
    principal = factories.agent()
    asked: list[str] = []

    async def scenario() -> list[Any]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            threads = ConsoleThreads(console, name="fan")
            start = {"items": ["a", "b"], "answers": []}
            first = await threads.run(_fan_graph(threads, asked), start, "t-fan")
            again = await threads.run(_fan_graph(threads, asked), start, "t-fan")
            return [first, again]

    first, again = asyncio.run(scenario())
    assert first["answers"] == ["echo a", "echo b", "echo task 2", "echo task 3"]
    assert again["answers"] == first["answers"]
    assert asked.count("a") == asked.count("b") == 1  # replayed by the second run
    steps = Operation.objects.filter(task__external_id="langgraph:t-fan", tool="model.call")
    sends = sorted(step for step in steps.values_list("step", flat=True) if ".ask." in step)
    assert sends == ["run:main:turn:1.ask.0", "run:main:turn:1.ask.1"]


def test_a_langgraph_node_asking_twice_at_once_under_one_name_is_refused(server: Server) -> None:
    """A node making two requests at once through one chat model (``abatch``) would name both
    turns alike, and one would get the other's answer: the second is refused with ValueError,
    the model asked once."""
    principal = factories.agent()
    asked: list[str] = []

    async def scenario() -> list[Any]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            threads = ConsoleThreads(console, name="twice")
            chat = threads.chat_model(_echo(asked))

            async def both(state: _Fan) -> dict[str, Any]:
                prompts = [[HumanMessage(item)] for item in state["items"]]
                results = await chat.abatch(prompts, return_exceptions=True)
                return {"answers": [getattr(r, "content", repr(r)) for r in results]}

            builder = StateGraph(_Fan)
            builder.add_node("both", both)
            builder.add_edge(START, "both")
            graph = builder.compile(checkpointer=InMemorySaver())
            values = await threads.run(graph, {"items": ["a", "b"], "answers": []}, "t-twice")
            return list(values["answers"])

    answers = asyncio.run(scenario())
    assert len(asked) == 1
    answered, refused = sorted(answers, key=lambda said: said.startswith("ValueError"))
    assert answered == f"echo {asked[0]}", answers
    assert refused.startswith("ValueError") and "already being asked" in refused, answers
    (turn,) = Operation.objects.filter(task__external_id="langgraph:t-twice", tool="model.call")
    assert (turn.step, turn.status) == ("run:main:turn:1.both", "succeeded")


def test_a_langgraph_turn_held_for_approval_waits_for_the_decision(server: Server) -> None:
    """A chat model whose turns a policy gates (``tool=`` an agent-run tool declared with
    ``always``): the node waits for the operator; approved, the model is asked and answers;
    denied, the run ends with ModelCallDenied naming the operator's reason, the model never
    asked."""
    admin, operator = factories.console_user("admin"), factories.console_user("operator")
    tool_declare(
        admin.actor,
        {
            "name": "acme.llm.gated",
            "kind": "agent",
            "contract": "pure",
            "description": "A model call an operator must allow.",
            "params_schema": {"type": "object"},
            "approval": {"required": "always"},
        },
    )
    principal = factories.agent()
    asked: list[str] = []

    async def run(threads: ConsoleThreads, thread_id: str, decision: str) -> Any:
        chat = threads.chat_model(_echo(asked), tool="acme.llm.gated", approval_timeout=30)

        async def model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await chat.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", model)
        builder.add_edge(START, "model")
        graph = builder.compile(checkpointer=InMemorySaver())
        decided = _decide_first_approval(server, operator.token, f"langgraph:{thread_id}", decision)
        start = {"messages": [HumanMessage(thread_id)]}
        values, _ = await asyncio.gather(threads.run(graph, start, thread_id), decided)
        return values["messages"][-1].content

    async def scenario() -> tuple[str, str]:
        async with AsyncClient(base_url=server.url, token=principal.token) as console:
            threads = ConsoleThreads(console, name="gated model")
            allowed = await run(threads, "gated-yes", "approve")
            with pytest.raises(ModelCallDenied) as denial:
                await run(threads, "gated-no", "deny")
            return allowed, str(denial.value)

    try:
        allowed, denial = asyncio.run(scenario())
    finally:
        declarations_forget()
    assert allowed == "echo gated-yes" and asked == ["gated-yes"]
    assert REASON in denial and operator.actor.name in denial, denial
    no = Operation.objects.get(task__external_id="langgraph:gated-no", tool="acme.llm.gated")
    assert no.status != "succeeded" and no.approvals.get().status == "denied"
