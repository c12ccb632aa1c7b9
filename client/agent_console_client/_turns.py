"""A durable agent run's model turns, as the adapters (Pydantic AI, OpenAI Agents, LangGraph)
record them: each model request is an agent-executed operation of the console's built-in
``model.call`` under the step ``run:<run_key>:turn:<n>`` (n counts the run's requests from 1;
LangGraph's is ``<graph step>.<node>``, where a checkpoint resumes it), proposed with an
estimate of ``model_tokens``, claimed, and completed with the tokens used and the response (in
the framework's own serialised form). A turn the console already holds a response for is
replayed instead of asked again, so a restarted run's tool calls keep their ids.

A turn a policy holds for a person's approval (the run's model tool declared with an approval
rule) waits for the decision as a tool call does, following the task's events: approved, it is
claimed and the model asked; denied (or expired, cancelled undecided), the run ends with
``ModelCallDenied`` carrying the operator's reason in the words a denied tool call gives the
model. A model request has no tool result to carry a refusal, so it is raised, as the console's
other refusals of a turn's proposal (budget, policy, parameters) are."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

from agent_console_client._async import AsyncClient, AsyncLease
from agent_console_client.errors import NotClaimable
from agent_console_client.models import ALL_STATUSES, Operation

# An agent-run operation it may claim (a retry once it is due).
CLAIMABLE = frozenset({"pending", "retry_scheduled"})
WAITING_APPROVAL = "waiting_approval"
# Where a turn's wait for a person ends: any status but the wait.
DECIDED = ALL_STATUSES - {WAITING_APPROVAL}


class ModelCallEnded(RuntimeError):
    """The console ended a turn's model call without a recorded response (failed, cancelled,
    expired, or handed to a person): the run cannot go on from it."""


class ModelCallDenied(ModelCallEnded):
    """A person denied a turn's model call (or its approval expired undecided); the message is
    the one a denied tool call gives the model: ``Denied by <who>: <reason>``."""


class Turns:
    def __init__(
        self,
        client: AsyncClient,
        task_id: str,
        *,
        run_key: str,
        tool: str,
        estimate_tokens: int,
        poll_seconds: float,
        approval_timeout: float | None = None,
    ) -> None:
        self.client = client
        self.task_id = task_id
        self.run_key = run_key
        self.tool = tool
        self.estimate_tokens = estimate_tokens
        self.poll_seconds = poll_seconds
        self.approval_timeout = approval_timeout
        self.count = 0
        self.replayed = 0

    def step(self, turn: int | str) -> str:
        return f"run:{self.run_key}:turn:{turn}"

    async def next(
        self, model_name: str, *, turn: str | None = None, call: int | None = None
    ) -> Operation:
        """The next turn's operation (the same one for the same run, turn and model). ``turn``
        (and ``call``, its number in the params) name it when the caller knows where the run
        is without counting (LangGraph: the graph's step and node, as a checkpoint restores
        them); otherwise it is the next of this run's requests."""
        self.count += 1
        return await self.client.propose(
            self.task_id,
            self.tool,
            {"model": model_name, "call": call or self.count},
            step=self.step(turn or self.count),
            executor="agent",
            estimate={"model_tokens": self.estimate_tokens},
        )

    async def hold(self, op: Operation, stack: AsyncExitStack) -> AsyncLease | dict[str, Any]:
        """A lease on the turn's operation (entered on ``stack``), or its recorded result. A
        turn whose last claimant died stays ``running`` until its lease lapses and the sweeper
        makes it claimable again: that wait is polled, as is a retry not due yet. A turn held
        for approval waits for the decision (OperationTimeout after ``approval_timeout``)."""
        while True:
            if op.status == WAITING_APPROVAL:
                op = await self.client.wait_operation(
                    op.id, until=DECIDED, timeout=self.approval_timeout
                )
                continue
            if op.status == "succeeded":
                self.replayed += 1
                if not isinstance(op.result, dict) or "response" not in op.result:
                    raise ModelCallEnded(f"model call {op.id} ({op.step}) recorded no response")
                return op.result
            if op.status in CLAIMABLE:
                try:
                    lease: AsyncLease = await stack.enter_async_context(self.client.claim(op.id))
                except NotClaimable:
                    pass  # another claimant won, or the retry is not due yet
                else:
                    return lease
            elif op.status != "running":
                approval = op.approval
                if approval is not None and approval.status not in ("approved", "released"):
                    who = approval.decided_by or "the console"
                    raise ModelCallDenied(f"Denied by {who}: {approval.reason or op.status}")
                raise ModelCallEnded(
                    f"model call {op.id} ({op.step}) is {op.status}: {op.status_reason}"
                )
            await asyncio.sleep(self.poll_seconds)
            op = await self.client.get_operation(op.id)

    async def record(
        self,
        lease: AsyncLease,
        *,
        model: str | None,
        input_tokens: int,
        output_tokens: int,
        response: Any,
    ) -> None:
        """Complete the turn with its usage (posted to the task's budget) and its response.
        StaleLease when the turn was taken over meanwhile: the response is not the recorded
        one, and the run must not act on it."""
        await lease.complete(
            result={
                "model": model,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "response": response,
            },
            usage={"model_tokens": input_tokens + output_tokens},
        )
