"""LangGraph adapter (``pip install ./client[langgraph]``): the console decides what a graph's
tool calls do, and a person's approval is a LangGraph ``interrupt`` the console's decision resumes.

- One console task per ``thread_id``: ``ConsoleThreads.task(thread_id)`` gets or creates it under
  the external id ``langgraph:<thread_id>`` (a restarted process finds the same task).
- ``ConsoleThreads.tool_node(tools)`` is a graph node (in place of LangGraph's ``ToolNode``): it
  proposes each tool call of the last AI message whose tool is mapped as an operation of the
  thread's task (its step is the call's ``id``, so a call the graph runs again is the same
  operation) and answers a ``ToolMessage`` with the result the console accepted, or the failure
  or the operator's denial. While the console holds calls for a person's approval, the node calls
  ``interrupt`` with their approvals (``{"console_approvals": [...]}``).
- ``ConsoleThreads.chat_model(model)`` wraps the chat model a model node asks (tools bound, if
  any): each ``ainvoke`` is a turn of the thread's durable run, an agent-executed operation of
  the console's ``model.call`` under the step ``run:<run_key>:turn:<step>.<node>`` (the graph's
  step and the asking node, which a checkpoint restores and a thread run again from its start
  reaches again), proposed with an estimate of ``model_tokens`` (refused with BudgetExhausted
  when the task's budget cannot cover it), claimed, and completed with the message's
  ``usage_metadata`` tokens and the message itself (``messages_to_dict``). A turn the console
  already holds is replayed, tool call ids and all, instead of asking the model again; a turn
  held for a person's approval waits for the decision (``ModelCallDenied`` when denied).
- ``ConsoleThreads.run(graph, input, thread_id)`` runs the thread to its end: at each console
  interrupt it waits (on the task's events) for the decisions, then resumes with
  ``Command(resume=...)``; the node, run again, asks the console what became of each call.

Durability is LangGraph's own: compile the graph with a persistent checkpointer (the example
uses ``langgraph-checkpoint-sqlite``). ``run`` writes each checkpoint before the next step starts
(``durability="sync"``), starts the thread from ``input`` only when it has no checkpoint, and
otherwise continues it where it stopped; the AI message whose calls the tool node proposed is in
a checkpoint before any is proposed, so a restarted process proposes the same ids again and the
console gives back the same operations: no effect happens twice. The model's turns make a thread
whose checkpoints are lost (or never kept) durable too: run again from its input, it gets each
recorded answer back, with the same call ids, and neither pays for nor repeats a model call (but
a subgraph's, named after a parent task a new run does not have again: see ``_position``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command, interrupt

from agent_console_client._async import AsyncClient, AsyncLease
from agent_console_client._turns import ModelCallDenied, ModelCallEnded, Turns
from agent_console_client.errors import REFUSALS, StaleLease
from agent_console_client.models import ALL_STATUSES, TERMINAL_STATUSES, Operation

# How LangGraph's metadata names a node's task: a Send's path starts with PUSH; a subgraph's
# checkpoint namespace is its parents' "<node>:<task id>", joined by "|".
PUSH, NS_SEP, NS_END = "__pregel_push", "|", ":"
WAITING_APPROVAL = "waiting_approval"
DECIDED = ALL_STATUSES - {WAITING_APPROVAL}
# Where a tool call's wait ends: done, or handed to support staff.
SETTLED = TERMINAL_STATUSES | {"unresolved", "manual_intervention"}
INTERRUPT_KEY = "console_approvals"


def thread_key(thread_id: str) -> str:
    """The console task's external id for a LangGraph thread."""
    return f"langgraph:{thread_id}"


def _step(call_id: str) -> str:
    # The console's steps are names; a provider's call id may carry other characters.
    return "call-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in call_id)[:180]


def _content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _answer(op: Operation, call_id: str) -> ToolMessage:
    """The console's last word on a call, as the model reads it."""
    approval = op.approval
    if op.status == "succeeded":
        return ToolMessage(_content(op.result), tool_call_id=call_id)
    if approval is not None and approval.status not in ("approved", "released", "pending"):
        who = approval.decided_by or "the console"
        reason = approval.reason or op.status
        return ToolMessage(f"Denied by {who}: {reason}", tool_call_id=call_id, status="error")
    detail = op.error.get("message") if isinstance(op.error, dict) else op.error
    return ToolMessage(
        f"the console's operation {op.id} ended {op.status}: {detail or 'no result'}",
        tool_call_id=call_id,
        status="error",
    )


@dataclass
class ConsoleThreads:
    """The console side of a graph's threads: their tasks, a tool node, a runner. ``name``,
    ``input`` and ``budget`` are what each thread's task is created with (the same every time:
    the task is got or created by its key)."""

    client: AsyncClient
    name: str = "langgraph thread"
    input: dict[str, Any] | None = None
    budget: dict[str, float] | None = None
    wait_timeout: float | None = None
    _tasks: dict[str, str] = field(default_factory=dict, repr=False)

    async def task(self, thread_id: str) -> str:
        """The id of the thread's console task, created on first use."""
        if thread_id not in self._tasks:
            task = await self.client.get_or_create_task(
                thread_key(thread_id),
                self.name,
                {**(self.input or {}), "thread_id": thread_id},
                budget=self.budget,
            )
            self._tasks[thread_id] = task.id
        return self._tasks[thread_id]

    def chat_model(
        self,
        model: Runnable[Any, BaseMessage],
        *,
        run_key: str = "main",
        thread_id: str | None = None,
        model_name: str | None = None,
        estimate_tokens: int = 1000,
        tool: str = "model.call",
        poll_seconds: float = 0.5,
        approval_timeout: float | None = None,
    ) -> ConsoleChatModel:
        """``model`` (a chat model, or one with its tools bound) whose every ``ainvoke`` is a
        turn of the thread's task (see the module's docstring). The thread is the graph's
        (``configurable.thread_id``) unless ``thread_id`` names one; ``model_name`` goes in
        each turn's params (by default the model's own name: keep it the same across
        restarts, a turn proposed again with other params is a conflict)."""
        return ConsoleChatModel(
            self,
            model,
            run_key=run_key,
            thread_id=thread_id,
            model_name=model_name or _model_name(model),
            estimate_tokens=estimate_tokens,
            tool=tool,
            poll_seconds=poll_seconds,
            approval_timeout=approval_timeout,
        )

    def tool_node(self, tools: Mapping[str, str], *, messages_key: str = "messages") -> ToolNode:
        """A node running the last AI message's tool calls through the console; ``tools`` maps
        the tool names the model calls to the console's tool names."""
        return ToolNode(self, tools, messages_key)

    async def decisions(self, pending: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Wait for the console to decide each pending approval; what each became."""
        decided = []
        for item in pending:
            op = await self.client.wait_operation(
                str(item["operation"]), until=DECIDED, timeout=self.wait_timeout
            )
            approval = op.approval
            decided.append(
                {
                    "operation": op.id,
                    "approval": approval.id if approval else None,
                    "status": str(approval.status) if approval else None,
                    "decided_by": approval.decided_by if approval else None,
                    "reason": approval.reason if approval else None,
                }
            )
        return decided

    async def run(
        self,
        graph: Pregel[Any, Any, Any, Any],
        input: Any,
        thread_id: str,
        *,
        on_approval: Callable[[list[Mapping[str, Any]]], None] | None = None,
        max_rounds: int = 20,
        config: RunnableConfig | None = None,
    ) -> Any:
        """Run the thread to its end and answer its final state's values: from ``input`` when
        it has no checkpoint; otherwise on from where it stopped (a finished thread is not run
        again). At each console interrupt, wait for the decisions and resume."""
        config = {**(config or {})}
        config["configurable"] = {**config.get("configurable", {}), "thread_id": thread_id}
        await self.task(thread_id)
        state = await graph.aget_state(config)
        if state.created_at is None:
            payload: Any = input
        elif state.interrupts:
            payload = await self._resume(state.interrupts, on_approval)
        elif state.next:
            payload = None  # killed between steps: go on from the last checkpoint
        else:
            return state.values
        for _ in range(max_rounds):
            await graph.ainvoke(payload, config, durability="sync")
            state = await graph.aget_state(config)
            if not state.interrupts:
                return state.values
            payload = await self._resume(state.interrupts, on_approval)
        raise RuntimeError(f"the thread still waited for approvals after {max_rounds} rounds")

    async def _resume(
        self,
        interrupts: Sequence[Any],
        on_approval: Callable[[list[Mapping[str, Any]]], None] | None,
    ) -> Command[Any]:
        resume: dict[str, Any] = {}
        for pending in interrupts:
            value = pending.value
            if not isinstance(value, dict) or INTERRUPT_KEY not in value:
                raise RuntimeError(f"the graph waits for something else than the console: {value}")
            if on_approval is not None:
                on_approval(value[INTERRUPT_KEY])
            resume[pending.id] = await self.decisions(value[INTERRUPT_KEY])
        return Command(resume=resume)


@dataclass
class ToolNode:
    """The console's tool node (``ConsoleThreads.tool_node``)."""

    threads: ConsoleThreads
    tools: Mapping[str, str]
    messages_key: str = "messages"

    async def __call__(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        client = self.threads.client
        thread_id = str(config.get("configurable", {})["thread_id"])
        task_id = await self.threads.task(thread_id)
        message = state[self.messages_key][-1]
        calls = message.tool_calls if isinstance(message, AIMessage) else []
        ops: dict[str, Operation] = {}
        answers: dict[str, ToolMessage] = {}
        for call in calls:
            call_id = str(call["id"])
            console_tool = self.tools.get(call["name"])
            if console_tool is None:
                answers[call_id] = ToolMessage(
                    f"no such tool: {call['name']}", tool_call_id=call_id, status="error"
                )
                continue
            try:
                ops[call_id] = await client.propose(
                    task_id, console_tool, dict(call["args"]), step=_step(call_id)
                )
            except REFUSALS as exc:  # parameters, policy, budget: the model reads why
                answers[call_id] = ToolMessage(
                    f"the console refused the call: {exc}", tool_call_id=call_id, status="error"
                )
        waiting = [op for op in ops.values() if op.status == WAITING_APPROVAL]
        if waiting:
            # Resumed, the node runs again from the start: each proposal then gives back the
            # same operation, as the person left it.
            interrupt({INTERRUPT_KEY: [_pending(op, task_id) for op in waiting]})
        for call_id, op in ops.items():
            if op.status not in SETTLED:
                op = await client.wait_operation(
                    op.id, until=SETTLED, timeout=self.threads.wait_timeout
                )
            answers[call_id] = _answer(op, call_id)
        return {self.messages_key: [answers[str(call["id"])] for call in calls]}


def _model_name(model: Runnable[Any, Any]) -> str:
    for attribute in ("model_name", "model"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value[:200]
    return model.get_name()[:200]


def _position(config: RunnableConfig) -> tuple[str, int] | None:
    """Where in the graph a request is made, as LangGraph's metadata for the running node says:
    the turn's name and number (the graph's step); None outside a node. The name is
    ``<step>.<node>``, ``.<i>`` added for the i-th ``Send`` to the node in that step, and, in a
    subgraph, ``<parent node>@<digest>/`` before it. The step, not a count kept in this process,
    so that a thread resumed from a checkpoint (which does not run the nodes before it again)
    names its next turn as the first run did, and one run again from its input too. A
    subgraph's steps start again each time it runs, so its turns are told apart by the parent
    task's id (in ``langgraph_checkpoint_ns``): the same when a checkpoint resumes the thread,
    another when the thread runs again from its input, whose subgraph turns are asked again."""
    metadata = config.get("metadata") or {}
    step, node = metadata.get("langgraph_step"), metadata.get("langgraph_node")
    if not isinstance(step, int) or not node:
        return None
    name = f"{step}.{str(node)[:80]}"
    path: Sequence[Any] = metadata.get("langgraph_path") or ()
    if len(path) > 1 and path[0] == PUSH and isinstance(path[1], int):
        name += f".{path[1]}"
    parents = str(metadata.get("langgraph_checkpoint_ns") or "").split(NS_SEP)[:-1]
    if parents:
        digest = hashlib.blake2s(NS_SEP.join(parents).encode(), digest_size=6).hexdigest()
        names = "/".join(parent.split(NS_END)[0][:30] for parent in parents)
        name = f"{names}@{digest}/{name}"
    return name, max(step, 1)


def _dumped(message: BaseMessage) -> Any:
    """The message as LangChain's ``messages_to_dict`` gives it, in JSON for the console: a
    value JSON has no form for (a provider's metadata may hold a datetime) is kept as text."""
    return json.loads(json.dumps(messages_to_dict([message])[0], default=str))


def _replayed(recorded: dict[str, Any]) -> BaseMessage:
    (message,) = messages_from_dict([recorded["response"]])
    return message


class ConsoleChatModel(Runnable[LanguageModelInput, BaseMessage]):
    """A chat model whose every ``ainvoke`` is a turn of its thread's durable run
    (``ConsoleThreads.chat_model``). Asked from a graph's node, the turn is named after the
    graph's step and the node (``_position``): one request per node and step under a run key
    (a node asking more than once gives each request a model of its own ``run_key``: a second
    request under the same name would get the first one's recorded response back).
    Asked outside a graph, turns are counted from 1 for each thread, as the other adapters
    count them."""

    def __init__(
        self,
        threads: ConsoleThreads,
        model: Runnable[Any, BaseMessage],
        *,
        run_key: str,
        thread_id: str | None,
        model_name: str,
        estimate_tokens: int,
        tool: str,
        poll_seconds: float,
        approval_timeout: float | None,
    ) -> None:
        self.threads = threads
        self.model = model
        self.thread_id = thread_id
        self.model_name = model_name
        self.run_key = run_key
        self.tool = tool
        self.estimate_tokens = estimate_tokens
        self.poll_seconds = poll_seconds
        self.approval_timeout = approval_timeout
        self._turns: dict[str, Turns] = {}
        # The (task, turn) pairs being asked now, to refuse a second request under one name.
        self._asking: set[tuple[str, str]] = set()

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> BaseMessage:
        # The console's client here is an AsyncClient, bound to the graph's event loop.
        raise NotImplementedError("a console turn is asynchronous: use ainvoke (graph.ainvoke)")

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> BaseMessage:
        # The turn runs as a child run of the caller's (LangGraph's node), so the wrapped
        # model's callbacks (LangGraph's "messages" stream, tracing) see it as usual.
        turn = partial(self._turn, kwargs=kwargs)
        message: BaseMessage = await self._acall_with_config(turn, input, config)
        return message

    async def _turns_for(self, config: RunnableConfig) -> Turns:
        thread_id = self.thread_id or config.get("configurable", {}).get("thread_id")
        if not thread_id:
            raise ValueError("no thread: run the graph with a thread_id, or give chat_model one")
        task_id = await self.threads.task(str(thread_id))
        if task_id not in self._turns:
            self._turns[task_id] = Turns(
                self.threads.client,
                task_id,
                run_key=self.run_key,
                tool=self.tool,
                estimate_tokens=self.estimate_tokens,
                poll_seconds=self.poll_seconds,
                approval_timeout=self.approval_timeout,
            )
        return self._turns[task_id]

    async def _turn(
        self,
        input: LanguageModelInput,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        kwargs: dict[str, Any],
    ) -> BaseMessage:
        turns = await self._turns_for(config)
        turn, call = _position(config) or (None, None)
        if turn is not None:
            asking = (turns.task_id, turn)
            if asking in self._asking:
                # Two requests at once under one name (abatch, gather): the second would be
                # handed the first one's answer, so it is refused instead.
                raise ValueError(
                    f"turn {turns.step(turn)} is already being asked: a node making several "
                    "requests at once gives each a chat_model of its own run_key"
                )
            self._asking.add(asking)
        try:
            op = await turns.next(self.model_name, turn=turn, call=call)
            return await self._answer(turns, op, input, config, kwargs)
        finally:
            if turn is not None:
                self._asking.discard((turns.task_id, turn))

    async def _answer(
        self,
        turns: Turns,
        op: Operation,
        input: LanguageModelInput,
        config: RunnableConfig,
        kwargs: dict[str, Any],
    ) -> BaseMessage:
        """The turn's recorded answer, or the model's, recorded."""
        while True:
            async with AsyncExitStack() as stack:
                held = await turns.hold(op, stack)
                if isinstance(held, dict):
                    return _replayed(held)
                message = await self.model.ainvoke(input, config, **kwargs)
                try:
                    await self._record(turns, held, message)
                except StaleLease:
                    # Taken over while the model answered: this answer is not the recorded
                    # one, so the graph does not act on it; the turn is claimed or replayed.
                    pass
                else:
                    return message
            op = await self.threads.client.get_operation(op.id)

    async def _record(self, turns: Turns, lease: AsyncLease, message: BaseMessage) -> None:
        usage = message.usage_metadata if isinstance(message, AIMessage) else None
        model = message.response_metadata.get("model_name") or self.model_name
        await turns.record(
            lease,
            model=str(model),
            input_tokens=usage["input_tokens"] if usage else 0,
            output_tokens=usage["output_tokens"] if usage else 0,
            response=_dumped(message),
        )


def _pending(op: Operation, task_id: str) -> dict[str, Any]:
    return {
        "operation": op.id,
        "approval": op.approval.id if op.approval else None,
        "task": task_id,
        "tool": op.tool,
        "params": op.params,
    }


__all__: Sequence[str] = [
    "ConsoleChatModel",
    "ConsoleThreads",
    "ModelCallDenied",
    "ModelCallEnded",
    "ToolNode",
    "thread_key",
]
