"""When a one-statement form must leave the work to the general writer, as a table: the cases
whose side effects only the general writers carry (a compensation's exemptions, the budget
ledger, a person told of an unresolved call, the possible-effect rule's read of earlier calls,
an approval to create). Each form (the statements of runtime.transitions, and the callers choosing
between the two paths) asks ``general_writer_needed`` once, and its statement guards with
``general_writer_sql``, rendered from the same rows; so a new side effect in a general writer is
one more row here, and every form it concerns declines it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.rules.statuses import OperationStatus

S = OperationStatus

# The one-statement forms (runtime/sql/*.sql).
PROPOSE = "propose"
CLAIM = "claim"
CLAIM_BATCH = "claim_batch"
ACCEPT = "accept"
ACCEPT_BATCH = "accept_batch"
FORMS = (PROPOSE, CLAIM, CLAIM_BATCH, ACCEPT, ACCEPT_BATCH)


def _no_budget() -> Mapping[str, Any] | None:
    return None


@dataclass(frozen=True)
class FastFacts:
    """What a form knows before it writes. ``budget`` is asked only when a row needs it (the
    process keeps a task's budget once read: runtime.budgets.task_budget); ``target`` and
    ``ending_allowed`` are an acceptance's decision
    (runtime.transitions.status.fast_ending_allowed)."""

    compensates_id: str | None = None
    attempts_used: int = 0
    budget: Callable[[], Mapping[str, Any] | None] = field(default=_no_budget)
    gated: bool = False
    target: str | None = None
    ending_allowed: bool = True


@dataclass(frozen=True)
class GeneralCase:
    """One case for the general writer: the forms it concerns, the test in Python, and, where
    the statement checks it itself (``sql_forms``), the same test in SQL over the operation row
    ``o`` and its task row ``t``, true when the form may act."""

    code: str
    forms: frozenset[str]
    needed: Callable[[FastFacts], bool]
    sql: str = ""
    sql_forms: frozenset[str] = frozenset()


GENERAL_WRITER_CASES: tuple[GeneralCase, ...] = (
    # A compensation outlives its task's stop and its exhausted attempts go to a person
    # (rules.stop.stop_covers, rules.claim's cleanup_exempt rows): the general writers' cases.
    # (Written so that no index serves it: see runtime/sql/claim.sql.)
    GeneralCase(
        "compensation",
        frozenset({CLAIM, CLAIM_BATCH, ACCEPT, ACCEPT_BATCH}),
        lambda f: f.compensates_id is not None,
        "(o.compensates_id IS NULL) IS TRUE",
        frozenset({CLAIM, CLAIM_BATCH, ACCEPT, ACCEPT_BATCH}),
    ),
    # A budget's guarded meter UPDATEs hold and settle in the writer's transaction (runtime.
    # budgets): a proposal, an acceptance and a batch claim (which keeps no budget) of a
    # budgeted task decline.
    GeneralCase(
        "ledger",
        frozenset({PROPOSE, CLAIM_BATCH, ACCEPT}),
        lambda f: bool(f.budget()),
        "t.budget = '{}'::jsonb",
        frozenset({CLAIM_BATCH}),
    ),
    # A budgeted task's first dispatch is claimed in one statement; a re-dispatch may have to
    # hold its estimate again (after a lost call): the general claim's re-hold.
    GeneralCase(
        "ledger_redispatch",
        frozenset({CLAIM}),
        lambda f: f.attempts_used > 0 and bool(f.budget()),
        "(o.attempts_used = 0 OR t.budget = '{}'::jsonb)",
        frozenset({CLAIM}),
    ),
    # Gated work is created waiting for a person, with its pending approval.
    GeneralCase("gated", frozenset({PROPOSE}), lambda f: f.gated),
    # Support staff hear of an unresolved call (runtime.notify_events), from the writer.
    GeneralCase(
        "unresolved",
        frozenset({ACCEPT, ACCEPT_BATCH}),
        lambda f: f.target == S.UNRESOLVED,
    ),
    # An ending after an earlier call, or over an unconfirmed one, is the writer's to decide
    # (runtime.transitions.status's possible-effect rule reads the calls).
    GeneralCase(
        "possible_effect",
        frozenset({ACCEPT, ACCEPT_BATCH}),
        lambda f: not f.ending_allowed,
    ),
)


def general_writer_needed(form: str, facts: FastFacts) -> str | None:
    """The code of the first case that leaves ``form``'s work to the general writer, or None:
    the one-statement form may act (its statement still guards the cases it checks itself).
    Pure, apart from ``facts.budget``."""
    if form not in FORMS:
        raise ValueError(f"no one-statement form {form!r}")
    for case in GENERAL_WRITER_CASES:
        if form in case.forms and case.needed(facts):
            return case.code
    return None


def general_writer_sql(form: str) -> str:
    """The guards ``form``'s statement checks itself, joined by AND (true when it may act)."""
    if form not in FORMS:
        raise ValueError(f"no one-statement form {form!r}")
    return "\nAND ".join(c.sql for c in GENERAL_WRITER_CASES if form in c.sql_forms)
