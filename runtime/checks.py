"""Completion checks: required properties of a task's accepted artifacts.

A task declares its checks at creation (``required_checks``). Each run of a check is recorded
with the checker's name and version, the digest of its subject, the task version it saw, and a
result: ``passed``, ``failed``, ``unavailable`` (the checker could not run: unknown, crashed,
input unreadable) or ``timed_out``. Only ``passed`` on the artifact that is *still* the accepted
one counts: a check on a replaced artifact is stale, and no other result authorises success.

Checkers live in a registry. Inline checkers run in the calling process under a time limit
(``CHECK_TIMEOUT_SECONDS``) with no database transaction open (they read storage). The
``operation`` checker runs a check tool as an ordinary operation on the workers (leased, fenced,
retried like any other) and maps that operation's ending to a result."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.artifacts import may_write
from runtime.checkers import (
    CheckContext,
    Checker,
    Pending,
    R,
    Verdict,
    checker_for,
    checker_register,
    checkers,
    required_checks_create_txn,
    required_checks_validate,
)
from runtime.errors import NotAuthorized, UnknownChecker
from runtime.events import event_append_txn
from runtime.models import Artifact, CheckResult, Operation, RequiredCheck, Task
from runtime.selectors.artifacts import artifacts_current
from runtime.selectors.tasks import task_get
from runtime.specs import OperationSpec
from runtime.transitions.propose import operation_propose

# Re-exported: callers and tests register and declare checkers through this module too.
__all__ = [
    "CheckContext",
    "CheckState",
    "Checker",
    "Pending",
    "Verdict",
    "check_history",
    "check_record",
    "check_states",
    "checker_for",
    "checker_register",
    "checkers",
    "required_checks_create_txn",
    "required_checks_validate",
    "task_checks",
    "task_checks_run",
]


def _proposer(actor: Actor, task: Task) -> Any:
    """How the ``operation`` checker proposes its check run: an ordinary operation of the task,
    under the key the checker derived."""

    def propose(tool: str, params: dict[str, Any], step: str, key: str) -> Operation:
        op, _ = operation_propose(
            actor,
            task.pk,
            OperationSpec(
                tool=tool, params=params, step=step, idempotency_key=key, key_derived=True
            ),
        )
        return op

    return propose


# --- running --------------------------------------------------------------------------------


def _run_limited(checker: Checker, ctx: CheckContext, config: dict[str, Any]) -> Verdict:
    """Run a checker under CHECK_TIMEOUT_SECONDS. A checker that raises is unavailable; one
    that does not answer in time is timed out (its thread is abandoned, never awaited)."""
    if checker.uses_database:
        try:
            return checker.run(ctx, config)
        except Pending:
            raise
        except Exception as exc:
            return Verdict(R.UNAVAILABLE, f"the checker failed: {type(exc).__name__}: {exc}"[:2000])
    box: dict[str, Any] = {}

    def target() -> None:

        try:
            box["verdict"] = checker.run(ctx, config)
        except Exception as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            connection.close()

    thread = threading.Thread(target=target, name=f"check-{ctx.name}", daemon=True)
    thread.start()
    thread.join(settings.CHECK_TIMEOUT_SECONDS)
    if thread.is_alive():
        return Verdict(R.TIMED_OUT, f"no answer within {settings.CHECK_TIMEOUT_SECONDS} s")
    if "error" in box:
        return Verdict(R.UNAVAILABLE, f"the checker failed: {box['error']}")
    verdict: Verdict = box["verdict"]
    return verdict


@dataclass(frozen=True)
class CheckState:
    """A required check and where it stands on the current manifest."""

    name: str
    checker: str
    config: dict[str, Any]
    latest: CheckResult | None
    counts: bool  # passed, not stale, and its subject is still the accepted artifact
    pending_operation: str | None = None

    @property
    def reason(self) -> str:
        if self.pending_operation:
            return f"running as operation {self.pending_operation}"
        if self.latest is None:
            return "not run yet"
        if self.latest.stale or (not self.counts and self.latest.result == R.PASSED):
            return "stale: the artifact it checked was replaced"
        return f"{self.latest.result}: {self.latest.reason}".rstrip(": ")


def _latest(task_id: str) -> dict[str, CheckResult]:
    latest: dict[str, CheckResult] = {}
    for row in CheckResult.objects.filter(task_id=task_id).order_by("name", "-at", "-id"):
        latest.setdefault(row.name, row)
    return latest


def _counts(row: CheckResult | None, manifest: dict[str, Artifact], config: dict[str, Any]) -> bool:
    if row is None or row.result != R.PASSED or row.stale:
        return False
    if "artifact" not in config:
        return True
    current = manifest.get(str(config["artifact"]))
    return (
        current is not None
        and current.pk == row.subject_id
        and current.digest == row.subject_digest
    )


def check_states(task_id: str) -> list[CheckState]:
    """Each required check of the task with its newest result and whether it counts now."""
    manifest = artifacts_current(task_id)
    latest = _latest(task_id)
    return [
        CheckState(
            rc.name,
            rc.checker,
            rc.config,
            latest.get(rc.name),
            _counts(latest.get(rc.name), manifest, rc.config),
        )
        for rc in RequiredCheck.objects.filter(task_id=task_id).order_by("id")
    ]


def task_checks_run(actor: Actor, task_id: str, *, only_missing: bool = False) -> list[CheckState]:
    """Run the task's required checks on its current manifest and record each result; with
    ``only_missing``, checks that already count are not run again.

    Preconditions: the actor is the task's agent or an admin (running a check writes results
    and may propose an operation). No transaction may be open (checkers read storage); each
    result commits on its own with its journal event."""
    task = task_get(actor, task_id)
    if not may_write(actor, task):
        raise NotAuthorized("only the task's agent or an admin may run its checks")
    manifest = artifacts_current(task_id)
    states: list[CheckState] = []
    for state in check_states(task_id):
        if only_missing and state.counts:
            states.append(state)
            continue
        ctx = CheckContext(actor, task, state.name, manifest, _proposer(actor, task))
        try:
            checker = checker_for(state.checker)
        except UnknownChecker:
            verdict = Verdict(R.UNAVAILABLE, f"no checker named {state.checker!r} in this version")
            version = "?"
        else:
            version = checker.version
            try:
                verdict = _run_limited(checker, ctx, state.config)
            except Pending as pending:
                states.append(
                    CheckState(
                        state.name,
                        state.checker,
                        state.config,
                        state.latest,
                        False,
                        pending.operation_id,
                    )
                )
                continue
        row = check_record(
            task_id=task_id,
            name=state.name,
            checker=state.checker,
            checker_version=version,
            verdict=verdict,
            task_state_version=task.state_version,
            actor=actor.label,
        )
        states.append(
            CheckState(
                state.name,
                state.checker,
                state.config,
                row,
                _counts(row, artifacts_current(task_id), state.config),
            )
        )
    return states


def check_record(
    *,
    task_id: str,
    name: str,
    checker: str,
    checker_version: str,
    verdict: Verdict,
    task_state_version: int,
    actor: str,
) -> CheckResult:
    """Record one result with its journal event (its own transaction). A result for a subject
    that was replaced while the checker ran is stale from the start."""
    now = timezone.now()
    subject = verdict.subject
    with transaction.atomic():
        stale = (
            subject is not None
            and not Artifact.objects.filter(pk=subject.pk, status="accepted").exists()
        )
        row = CheckResult.objects.create(
            task_id=task_id,
            name=name,
            checker=checker,
            checker_version=checker_version,
            subject=subject,
            subject_digest=subject.digest if subject else "",
            task_state_version=task_state_version,
            result=verdict.result,
            reason=verdict.reason[:2000],
            stale=stale,
            actor=actor,
            at=now,
        )
        event_append_txn(
            task_id=task_id,
            type="check.recorded",
            state_version=task_state_version,
            now=now,
            actor=actor,
            data={
                "check": name,
                "result": verdict.result,
                "reason": verdict.reason[:300] or None,
                "subject_digest": row.subject_digest or None,
            },
        )
    return row


def task_checks(actor: Actor, task_id: str) -> list[CheckState]:
    """Selector: the task's required checks and their standing."""
    task_get(actor, task_id)
    return check_states(task_id)


def check_history(actor: Actor, task_id: str, limit: int = 200) -> list[CheckResult]:
    task_get(actor, task_id)
    return list(CheckResult.objects.filter(task_id=task_id).order_by("-at", "-id")[:limit])
