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
from django.db import transaction
from django.utils import timezone

from runtime import artifact_store as store
from runtime.actors import Actor
from runtime.artifacts import artifacts_current, may_write
from runtime.errors import InvalidInput, NotAuthorized, UnknownChecker
from runtime.events import event_append_txn
from runtime.jsonschemas import json_schema_validate, json_schema_verdict
from runtime.models import Artifact, CheckResult, Operation, RequiredCheck, Task
from runtime.tasks import task_get
from runtime.text import name_check
from runtime.tools import adapter_for
from runtime.transitions import OperationStatus

R = CheckResult


@dataclass(frozen=True)
class Verdict:
    result: str
    reason: str = ""
    subject: Artifact | None = None


class Pending(Exception):
    """The check is running elsewhere (as an operation) and has no result yet."""

    def __init__(self, operation_id: str) -> None:
        super().__init__(operation_id)
        self.operation_id = operation_id


@dataclass(frozen=True)
class CheckContext:
    actor: Actor
    task: Task
    name: str
    manifest: dict[str, Artifact]


class Checker:
    name: str = ""
    version: str = "1"
    # Checkers that touch the database run in the caller's thread (their own work is bounded
    # elsewhere); the others run in a thread of their own under CHECK_TIMEOUT_SECONDS.
    uses_database: bool = False

    def validate(self, config: dict[str, Any]) -> None:
        """Raise InvalidInput for a configuration this checker can never run."""

    def run(self, ctx: CheckContext, config: dict[str, Any]) -> Verdict:
        raise NotImplementedError


_REGISTRY: dict[str, Checker] = {}


def checker_register(checker: Checker) -> Checker:
    if not checker.name:
        raise ValueError("a checker needs a name")
    _REGISTRY[checker.name] = checker
    return checker


def checker_for(name: str) -> Checker:
    checker = _REGISTRY.get(name)
    if checker is None:
        raise UnknownChecker(f"no checker named {name!r}")
    return checker


def checkers() -> dict[str, Checker]:
    return dict(_REGISTRY)


def _artifact_name(config: dict[str, Any]) -> str:
    name = config.get("artifact")
    if not isinstance(name, str) or not name:
        raise InvalidInput("config.artifact must name an artifact", field="config.artifact")
    return name_check(name, "config.artifact")


def _nested(exc: InvalidInput, prefix: str, default: str) -> InvalidInput:
    """The same refusal, its field named from ``prefix`` (a field inside a nested object)."""
    inner = str(exc.details.get("field") or default)
    message = exc.message if exc.message.startswith(inner) else f"{inner}: {exc.message}"
    return type(exc)(f"{prefix}.{message}", code=exc.code, field=f"{prefix}.{inner}")


def _subject(ctx: CheckContext, config: dict[str, Any]) -> Artifact | None:
    return ctx.manifest.get(str(config.get("artifact")))


class ArtifactPresent(Checker):
    """Passes when an accepted artifact of that name exists and its bytes are still stored."""

    name = "artifact_present"
    version = "1"

    def validate(self, config: dict[str, Any]) -> None:
        _artifact_name(config)

    def run(self, ctx: CheckContext, config: dict[str, Any]) -> Verdict:
        subject = _subject(ctx, config)
        if subject is None:
            return Verdict(R.FAILED, f"no accepted artifact named {config['artifact']!r}")
        problem = store.content_verify(
            subject.storage_key, store.Measured(store.hex_of(subject.digest), subject.size or 0)
        )
        if problem:
            return Verdict(R.FAILED, problem, subject)
        return Verdict(R.PASSED, "", subject)


class JsonSchema(Checker):
    """Passes when the accepted artifact is JSON valid against ``config.schema``."""

    name = "json_schema"
    version = "1"

    def validate(self, config: dict[str, Any]) -> None:
        _artifact_name(config)
        json_schema_validate(config.get("schema"), "config.schema")

    def run(self, ctx: CheckContext, config: dict[str, Any]) -> Verdict:
        subject = _subject(ctx, config)
        if subject is None:
            return Verdict(R.FAILED, f"no accepted artifact named {config['artifact']!r}")
        try:
            result, reason = json_schema_verdict(
                store.content_chunks(subject.storage_key), config["schema"]
            )
        except store.ContentMissing:
            return Verdict(R.UNAVAILABLE, "the artifact's bytes are not in storage", subject)
        return Verdict(result, reason, subject)


class OperationCheck(Checker):
    """Runs ``config.tool`` as an operation of the task on the workers, once per subject digest
    (the digest is in the operation's idempotency key). The tool returns ``{"passed": bool,
    "reason": str}``; a failed or cancelled operation is ``unavailable``, an expired one
    ``timed_out``; until it ends the check is pending."""

    name = "operation"
    version = "1"
    uses_database = True

    def validate(self, config: dict[str, Any]) -> None:
        _artifact_name(config)
        tool = config.get("tool")
        if not isinstance(tool, str) or not tool:
            raise InvalidInput("config.tool must name a check tool", field="config.tool")
        params = config.get("params", {})
        if not isinstance(params, dict):
            raise InvalidInput("config.params must be an object", field="config.params")
        try:
            adapter_for(tool).validate({**params, "artifact": {}})
        except InvalidInput as exc:
            raise _nested(exc, "config", "params") from None

    def run(self, ctx: CheckContext, config: dict[str, Any]) -> Verdict:
        from runtime.operations import OperationSpec, operation_propose

        subject = _subject(ctx, config)
        if subject is None:
            return Verdict(R.FAILED, f"no accepted artifact named {config['artifact']!r}")
        hexdigest = store.hex_of(subject.digest)
        params = {
            **config.get("params", {}),
            "artifact": {
                "id": subject.pk,
                "digest": subject.digest,
                "size": subject.size,
                "key": subject.storage_key,
            },
        }
        # One check run per bytes and attempt: a run that failed or timed out stays the answer
        # for these bytes in this attempt, and a new attempt (a new pursuit) checks them anew.
        attempt = ctx.task.current_attempt.number if ctx.task.current_attempt else 1
        key = f"{ctx.task.pk}:check:{ctx.name}:{hexdigest}" + (
            f":a{attempt}" if attempt > 1 else ""
        )
        op, _ = operation_propose(
            ctx.actor,
            ctx.task.pk,
            OperationSpec(
                tool=config["tool"], params=params, step=f"check:{ctx.name}", idempotency_key=key
            ),
        )
        return operation_verdict(op, subject)


def operation_verdict(op: Operation, subject: Artifact) -> Verdict:
    S = OperationStatus
    if op.status == S.SUCCEEDED:
        body = op.result if isinstance(op.result, dict) else {}
        if body.get("passed") is True:
            return Verdict(R.PASSED, str(body.get("reason") or ""), subject)
        return Verdict(R.FAILED, str(body.get("reason") or "the check tool said no"), subject)
    if op.status == S.EXPIRED:
        return Verdict(R.TIMED_OUT, f"operation {op.pk} expired", subject)
    if op.status in (S.FAILED, S.CANCELLED, S.UNRESOLVED, S.MANUAL_INTERVENTION):
        return Verdict(R.UNAVAILABLE, f"operation {op.pk} ended {op.status}", subject)
    raise Pending(op.pk)


for _checker in (ArtifactPresent(), JsonSchema(), OperationCheck()):
    checker_register(_checker)


# --- declaring ------------------------------------------------------------------------------


def required_checks_validate(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parse a task's ``required_checks``: unique names, known checkers, valid configs. Pure."""
    seen: set[str] = set()
    parsed = []
    for index, spec in enumerate(specs):
        at = f"required_checks[{index}]"
        name = str(spec.get("name") or "").strip()
        if not name:
            raise InvalidInput("every required check needs a name", field=f"{at}.name")
        name_check(name, f"{at}.name")
        if name in seen:
            raise InvalidInput(f"required check {name!r} is declared twice", field=f"{at}.name")
        seen.add(name)
        checker = checker_for(str(spec.get("checker") or ""))
        config = spec.get("config") or {}
        if not isinstance(config, dict):
            raise InvalidInput(f"{at}.config must be an object", field=f"{at}.config")
        try:
            checker.validate(config)
        except InvalidInput as exc:
            # The checker names the field inside its config; the caller needs the whole path.
            raise _nested(exc, at, "config") from None
        parsed.append({"name": name, "checker": checker.name, "config": config})
    return parsed


def required_checks_create_txn(task: Task, parsed: list[dict[str, Any]]) -> None:
    """Inside the task's creating transaction."""
    RequiredCheck.objects.bulk_create(
        [
            RequiredCheck(task=task, name=p["name"], checker=p["checker"], config=p["config"])
            for p in parsed
        ]
    )


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
        from django.db import connection

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
        ctx = CheckContext(actor, task, state.name, manifest)
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
