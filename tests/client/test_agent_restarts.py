"""Issue 38: an agent killed at any point and started again on the same task makes each effect
once. Each adapter's example agent runs as a real process against the real web server (2-second
leases), a worker and the sweeper; it is killed with SIGKILL at a random moment and at chosen
points (while its model answers, while it waits for a person, after the effect), restarted with
the same arguments (the task found again by its key), and the demo receiver's records are read
at the end: one charge."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_console_client import AsyncClient, Client
from agent_console_client.pydantic_ai import ConsoleModel
from django.db import connection
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.models import Operation, Task
from runtime.sandbox.models import Charge
from tests import factories
from tests.client.agent_process import AgentProcess
from tests.conftest import Server, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.workers]

WAITING = r"waiting for a person to decide approval (\S+) \(operation (\S+)\)"


@pytest.fixture
def stack(short_lease_server: Server, workers) -> Server:
    """The server (2-second leases), one worker for the charges, and the sweeper every second
    (it returns a dead agent's lapsed lease to the pending work a restart claims)."""
    workers.start(count=1, concurrency=1)
    workers.start_beat(SWEEP_SECONDS=1)
    return short_lease_server


@pytest.fixture
def sweeper(short_lease_server: Server, workers) -> Server:
    """The server (2-second leases) and the sweeper every second; no worker."""
    workers.start_beat(SWEEP_SECONDS=1)
    return short_lease_server


@pytest.fixture
def runs() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for run in started:
        run.kill()


def _turn(key: str, run_key: str, n: int) -> Operation | None:
    return Operation.objects.filter(
        task__external_id=key, tool="model.call", step=f"run:{run_key}:turn:{n}"
    ).first()


def _asked(key: str, run_key: str, n: int, after_generation: int) -> bool:
    """Whether turn ``n`` is being asked of the model now by a run that claimed it after
    ``after_generation``."""
    op = _turn(key, run_key, n)
    return op is not None and op.status == "running" and op.lease_generation > after_generation


def _recorded(key: str, run_key: str, n: int) -> bool:
    op = _turn(key, run_key, n)
    return op is not None and op.status == "succeeded"


def _generation(key: str, run_key: str, n: int) -> int:
    op = _turn(key, run_key, n)
    return op.lease_generation if op else 0


def _approve(server: Server, approval_id: str) -> None:
    operator = factories.console_user("operator")
    with Client(base_url=server.url, token=operator.token) as console:
        approval = console.get_approval(approval_id)
        console.decide(approval_id, "approve", params_hash=approval.params_hash)


def _killed_at_random(run: AgentProcess) -> int:
    """Kill the run at a random moment of its first second of work once it has its task (in
    the first model turn, its recording, the first proposal, or the wait after it); the seed."""
    seed = random.randrange(10**6)
    run.wait_line(r"(?m)^task ")
    time.sleep(random.Random(seed).uniform(0.0, 1.0))  # the kill point itself, not a wait
    run.kill()
    return seed


def _assert_one_charge(key: str, amount: int) -> None:
    task = Task.objects.get(external_id=key)
    charges = Operation.objects.filter(task=task, tool="demo.payments.charge")
    assert [op.status for op in charges] == ["succeeded"]
    # The receiver's own records: one payout, whatever the agent's restarts did.
    assert list(Charge.objects.values_list("key", "amount_cents")) == [
        (charges[0].idempotency_key, amount)
    ]


def test_a_pydantic_ai_agent_killed_anywhere_and_restarted_refunds_once(
    stack: Server, runs: list[AgentProcess]
) -> None:
    agent = factories.agent()
    key, amount = "refund-restarts", 25000
    args = [
        "--base-url", stack.url, "--token", agent.token, "--amount-cents", str(amount),
        "--task-key", key, "--model-delay", "0.5", "--timeout", "60",
    ]  # fmt: skip

    def start() -> AgentProcess:
        runs.append(AgentProcess("refund", args))
        return runs[-1]

    seed = _killed_at_random(start())

    # While the model answers the first turn (its lease then lapses; the next run claims it),
    # unless the random kill came after that turn was recorded.
    before = _generation(key, "refund", 1)
    run = start()
    wait_for(
        lambda: _asked(key, "refund", 1, before) or _recorded(key, "refund", 1),
        what=f"turn 1 (seed {seed}):\n{run.text}",
    )
    run.kill()

    # While it waits for a person to approve the refund the first turn asked for.
    run = start()
    approval_id, op_id = run.wait_line(WAITING).groups()
    run.kill()

    # Restarted, it waits for the same refund (the first turn replayed, its call's id kept);
    # approved, the charge runs, and the agent is killed while the model answers turn 2.
    run = start()
    assert run.wait_line(WAITING).groups() == (approval_id, op_id), run.text
    _approve(stack, approval_id)
    wait_for(lambda: _asked(key, "refund", 2, 0), what=f"turn 2 (seed {seed}):\n{run.text}")
    run.kill()

    # The last run replays the first turn and the charge's result, and finishes.
    run = start()
    assert run.finish() == 0, run.text
    assert "refund success" in run.text, run.text

    _assert_one_charge(key, amount)
    turns = Operation.objects.filter(task__external_id=key, tool="model.call")
    assert sorted(op.step for op in turns) == ["run:refund:turn:1", "run:refund:turn:2"]
    assert all(op.status == "succeeded" for op in turns)
    # The turn killed mid-answer was asked again by a restarted run, never replaced.
    assert turns.get(step="run:refund:turn:2").attempts_used >= 2
    assert Task.objects.filter(external_id=key).count() == 1


def test_a_langgraph_agent_killed_anywhere_and_restarted_refunds_once(
    stack: Server, runs: list[AgentProcess], tmp_path: Path
) -> None:
    agent = factories.agent()
    thread, amount = "refund-restarts", 25000
    args = [
        "--base-url", stack.url, "--token", agent.token, "--amount-cents", str(amount),
        "--thread", thread, "--model-delay", "0.5", "--timeout", "60",
    ]  # fmt: skip

    def start(checkpoints: str = "checkpoints.sqlite") -> AgentProcess:
        where = ["--checkpoints", str(tmp_path / checkpoints)]
        runs.append(AgentProcess("langgraph_refund", [*args, *where]))
        return runs[-1]

    seed = _killed_at_random(start())

    # While the model answers (its first answer, unless the first run got past it).
    run = start()
    run.wait_line(rf"model asked with 1 messages|{WAITING}")
    run.kill()

    # While it waits for a person to approve the refund.
    run = start()
    approval_id, op_id = run.wait_line(WAITING).groups()
    run.kill()

    # Restarted from its checkpoint, it waits for the same refund (the same call id); approved,
    # the charge runs, and the agent is killed while the model reads the result.
    run = start()
    assert run.wait_line(WAITING).groups() == (approval_id, op_id), f"seed {seed}:\n{run.text}"
    _approve(stack, approval_id)
    run.wait_line(r"model asked with 3 messages")
    run.kill()

    run = start()
    assert run.finish() == 0, run.text
    assert "refund success" in run.text, run.text
    # Run once more after the end: the finished thread answers its outcome, asking nothing.
    again = start()
    assert again.finish() == 0, again.text
    assert "refund success" in again.text and "model asked" not in again.text, again.text
    # Its checkpoints lost, the thread runs again from its input: the console replays both of
    # the model's recorded answers (the refund's call id kept), asking the model nothing.
    lost = start("lost.sqlite")
    assert lost.finish() == 0, lost.text
    assert "refund success" in lost.text and "model asked" not in lost.text, lost.text
    _assert_one_charge(f"langgraph:{thread}", amount)
    assert Task.objects.filter(external_id=f"langgraph:{thread}").count() == 1
    turns = Operation.objects.filter(task__external_id=f"langgraph:{thread}", tool="model.call")
    assert sorted((op.step, op.status) for op in turns) == [
        ("run:main:turn:1.model", "succeeded"),
        ("run:main:turn:3.model", "succeeded"),
    ]


def test_an_openai_agents_agent_killed_anywhere_and_restarted_refunds_once(
    stack: Server, runs: list[AgentProcess]
) -> None:
    agent = factories.agent()
    key, amount = "oa-refund-restarts", 25000
    args = [
        "--base-url", stack.url, "--token", agent.token, "--amount-cents", str(amount),
        "--task-key", key, "--model-delay", "0.5", "--timeout", "60",
    ]  # fmt: skip

    def start() -> AgentProcess:
        runs.append(AgentProcess("openai_agents_refund", args))
        return runs[-1]

    seed = _killed_at_random(start())

    before = _generation(key, "refund", 1)
    run = start()
    wait_for(
        lambda: _asked(key, "refund", 1, before) or _recorded(key, "refund", 1),
        what=f"turn 1 (seed {seed}):\n{run.text}",
    )
    run.kill()

    run = start()
    approval_id, op_id = run.wait_line(WAITING).groups()
    run.kill()

    run = start()
    assert run.wait_line(WAITING).groups() == (approval_id, op_id), f"seed {seed}:\n{run.text}"
    _approve(stack, approval_id)
    wait_for(lambda: _asked(key, "refund", 2, 0), what=f"turn 2 (seed {seed}):\n{run.text}")
    run.kill()

    run = start()
    assert run.finish() == 0, run.text
    assert "refund done" in run.text and '"amount_cents": 25000' in run.text, run.text
    _assert_one_charge(key, amount)
    turns = Operation.objects.filter(task__external_id=key, tool="model.call")
    assert sorted(op.step for op in turns) == ["run:refund:turn:1", "run:refund:turn:2"]
    assert all(op.status == "succeeded" for op in turns)


def _taken_over(key: str) -> None:
    turn = Operation.objects.filter(task__external_id=key, tool="model.call")
    try:
        wait_for(lambda: turn.filter(status="pending").exists(), timeout=30)
    finally:
        connection.close()


def test_a_turn_taken_over_while_the_model_answers_is_asked_again(sweeper: Server) -> None:
    """The model's first answer outlasts the turn's lease (the agent's loop is blocked, so no
    heartbeat goes out) and the sweeper takes the turn over: that answer is never recorded nor
    used; the turn is claimed again and the model asked again."""
    principal = factories.agent()
    answers: list[str] = []

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answers.append(f"answer {len(answers) + 1}")
        if len(answers) == 1:
            # Blocks the loop (no heartbeat) until the sweeper took the lapsed lease over,
            # polled from a thread (the ORM refuses an event loop's thread).
            poller = threading.Thread(target=_taken_over, args=("slow",))
            poller.start()
            poller.join()
        return ModelResponse(parts=[TextPart(answers[-1])])

    async def scenario() -> str:
        async with AsyncClient(base_url=sweeper.url, token=principal.token) as console:
            task = await console.get_or_create_task("slow", "slow model")
            model = ConsoleModel(FunctionModel(answer), client=console, task_id=task.id)
            result = await PydanticAgent(model, output_type=str).run("go")
            return result.output

    assert asyncio.run(scenario()) == "answer 2"
    (turn,) = Operation.objects.filter(task__external_id="slow", tool="model.call")
    assert turn.status == "succeeded" and turn.attempts_used == 2
    assert isinstance(turn.result, dict)
    assert turn.result["response"]["parts"][0]["content"] == "answer 2"
