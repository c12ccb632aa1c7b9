"""When an operation may be claimed, as a table: each row a code, a Python predicate over the
claim's facts, the same predicate in SQL over the operation row ``o`` and its task row ``t``,
and what a refusal settles to. The general claim (``runtime.transitions.claim._claim_txn``)
evaluates the rows in order and acts on the first that refuses; the one-statement claims
(runtime/sql/claim.sql) guard with every row's SQL (``claim_guards_sql``, filled in once at
import). tests/runtime/test_claim_rules.py evaluates both forms of each row over a grid of real
rows and finds them equal.

A compensation outlives its task's stop: the rows marked ``cleanup_exempt`` do not refuse it,
and its exhausted attempts go to a person. The one-statement claims leave compensations to the
general claim (``rules.general_writer``), so their SQL needs no exemption."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol

from runtime.models import Operation
from runtime.rules.statuses import OPERATION, OperationStatus
from runtime.rules.stop import not_stopping_sql, stopping

S = OperationStatus

# The statuses a claim moves to running, from the tables.
CLAIM_SOURCES = tuple(sorted(OPERATION.sources_of(S.RUNNING) & set(S.CLAIMABLE)))


class Settles:
    """What a refused claim settles to (``ClaimRule.outcome``)."""

    REFUSE = "refuse"  # nothing written: a Refusal with the row's reason
    STOP = "stop"  # settled for the task's stop: cancelled, or unresolved (runtime.stoprule)
    REFUSE_PAUSED = "refuse paused"  # nothing claimed, the announcement spent (runtime.control)
    EXPIRED = "settle expired"
    MANUAL_INTERVENTION = "settle manual_intervention"
    # Failed; unresolved for a compensation (and for work whose earlier call is unconfirmed:
    # the writer's possible-effect rule).
    EXHAUSTED = "settle failed"
    # The general claim rechecks the covering approval and releases it, or settles as it says
    # (runtime.approval_gate); the one-statement claims never take such work.
    RELEASE = "release recheck"


class ToolSupport(NamedTuple):
    """What the claimant's adapter of the tool answers for the recorded version: the version it
    runs and whether it supports the recorded one (the claimant asks; the rule only reads)."""

    version: str
    supports: bool


@dataclass(frozen=True)
class ClaimFacts:
    """What a claim reads: the operation row, its task's row, the claimant and the clock."""

    status: str
    executor: str
    claimant: str  # the executor claiming (worker or agent)
    next_attempt_at: datetime | None
    attempts_used: int
    max_attempts: int
    approval_required: bool
    deadline: datetime | None  # the operation's, else its task's
    cancellation: str
    condition: str
    paused: bool
    tool: str
    tool_version: str
    now: datetime
    # What the claimant's adapter of the tool answers (None: it has no such tool); asked only
    # by the row that needs it, as a worker's claim reaches it (the catalogue may read declared
    # tools).
    adapter: Callable[[], ToolSupport | None]


class TaskState(Protocol):
    """What the rows re-read under the task's lock look at: a Task, or the task row a statement
    returned (``runtime.transitions.fast.TaskRow``)."""

    @property
    def cancellation(self) -> str: ...

    @property
    def condition(self) -> str: ...

    @property
    def paused(self) -> bool: ...


def _task_not_stopping(t: TaskState) -> bool:
    return not stopping(t.cancellation, t.condition)


def _task_not_paused(t: TaskState) -> bool:
    return not t.paused


def _supported(f: ClaimFacts) -> bool:
    answer = f.adapter()
    return answer is not None and answer.supports


def _unsupported(f: ClaimFacts) -> str:
    answer = f.adapter()
    return (
        f"recorded under {f.tool} version {f.tool_version or '?'}, which this "
        f"worker does not support"
        + (f" (it runs version {answer.version})" if answer else " (tool missing)")
    )


@dataclass(frozen=True)
class ClaimRule:
    """One condition of a claim. ``admits`` and ``sql`` are the same test (true when the claim
    may go on); ``sql`` is over ``o`` and ``t`` with the slots ``{executor}``, ``{supported}``
    (the ``tool:version`` list) and ``{now}``. ``reason`` is the refusal's message (a function of
    the facts, or empty where the outcome's own step says why)."""

    code: str
    admits: Callable[[ClaimFacts], bool]
    sql: str
    outcome: str
    reason: Callable[[ClaimFacts], str]
    cleanup_exempt: bool = False


def _in(statuses: tuple[str, ...]) -> str:
    # Literals from the transition tables' constants only (never from input).
    return "(" + ", ".join(f"'{s}'" for s in statuses) + ")"


# In the order the general claim checks them (the first that refuses decides).
CLAIM_RULES: tuple[ClaimRule, ...] = (
    ClaimRule(
        "claimable",
        lambda f: f.status in CLAIM_SOURCES,
        # (Written so that no index serves it: see runtime/sql/claim.sql.)
        f"(o.status IN {_in(CLAIM_SOURCES)}) IS TRUE",
        Settles.REFUSE,
        lambda f: f"operation is {f.status} (duplicate or late delivery)",
    ),
    ClaimRule(
        "executor",
        lambda f: f.executor == f.claimant,
        "o.executor = {executor}",
        Settles.REFUSE,
        lambda f: f"operation is executed by the {f.executor}",
    ),
    ClaimRule(
        "due",
        lambda f: f.next_attempt_at is None or f.next_attempt_at <= f.now,
        "(o.next_attempt_at IS NULL OR o.next_attempt_at <= {now})",
        Settles.REFUSE,
        lambda f: "the retry is not due yet",
    ),
    ClaimRule(
        "stopping",
        _task_not_stopping,
        not_stopping_sql("t"),
        Settles.STOP,
        lambda f: "",  # rules.stop.stop_reason of the task
        cleanup_exempt=True,
    ),
    ClaimRule(
        "paused",
        _task_not_paused,
        "NOT t.paused",
        Settles.REFUSE_PAUSED,
        lambda f: "",  # runtime.control's pause hook
        cleanup_exempt=True,
    ),
    ClaimRule(
        "deadline",
        lambda f: f.deadline is None or f.now < f.deadline,
        "(COALESCE(o.deadline, t.deadline) IS NULL OR COALESCE(o.deadline, t.deadline) > {now})",
        Settles.EXPIRED,
        lambda f: "the deadline passed before the work could start",
        cleanup_exempt=True,
    ),
    ClaimRule(
        "version",
        lambda f: f.claimant != Operation.EXECUTOR_WORKER or _supported(f),
        f"({{executor}} <> '{Operation.EXECUTOR_WORKER}'"
        " OR (o.tool || ':' || o.tool_version) = ANY({supported}))",
        Settles.MANUAL_INTERVENTION,
        _unsupported,
    ),
    ClaimRule(
        "attempts",
        lambda f: f.attempts_used < f.max_attempts,
        "o.attempts_used < o.max_attempts",
        Settles.EXHAUSTED,
        lambda f: "attempts exhausted",
    ),
    ClaimRule(
        "approval",
        lambda f: not f.approval_required,
        "NOT o.approval_required",
        Settles.RELEASE,
        lambda f: "",  # runtime.approval_gate's release recheck
    ),
)


def claim_refusal(facts: ClaimFacts, *, cleanup: bool) -> ClaimRule | None:
    """The first row that refuses a claim with these facts (None: it may go on). ``cleanup``:
    the operation is a compensation, which the ``cleanup_exempt`` rows do not refuse. Pure."""
    for rule in CLAIM_RULES:
        if not rule.admits(facts) and not (cleanup and rule.cleanup_exempt):
            return rule
    return None


# The rows whose facts are the task's alone, by code: a claim reads them again once it holds
# the task's row lock, since a stop or a pause may have committed while it waited for the row.
UNDER_TASK_LOCK: dict[str, Callable[[TaskState], bool]] = {
    "stopping": _task_not_stopping,
    "paused": _task_not_paused,
}


def task_lock_refusal(task: TaskState, *, cleanup: bool) -> ClaimRule | None:
    """The first of the ``UNDER_TASK_LOCK`` rows, in the table's order, that refuses the task
    row as read under its lock (None: the claim stands). Pure."""
    for rule in CLAIM_RULES:
        admits = UNDER_TASK_LOCK.get(rule.code)
        if admits is not None and not admits(task) and not (cleanup and rule.cleanup_exempt):
            return rule
    return None


def claim_guards_sql(executor: str, supported: str, now: str = "%(now)s") -> str:
    """Every row's SQL, joined by AND: when operation ``o`` of task ``t`` may be claimed by
    ``executor`` with ``supported`` (SQL expressions: bound parameters or literals)."""
    return "\nAND ".join(
        rule.sql.format(executor=executor, supported=supported, now=now) for rule in CLAIM_RULES
    )
