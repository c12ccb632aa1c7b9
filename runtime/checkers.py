"""Checkers and the declaration of a task's required checks: what each checker validates and
how it judges a subject. Below the task and the proposal in the layers (runtime.tasks validates
``required_checks`` with it); running and recording checks is runtime.checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime import artifact_store as store
from runtime.actors import Actor
from runtime.errors import InvalidInput, UnknownChecker
from runtime.jsonschemas import json_schema_validate, json_schema_verdict
from runtime.keys import key_check
from runtime.models import Artifact, CheckResult, Operation, RequiredCheck, Task
from runtime.rules.statuses import OperationStatus
from runtime.text import name_check
from runtime.tools import adapter_for

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
    # Proposes an operation of the task (the ``operation`` checker's run): handed in by
    # runtime.checks, which sits above the proposal, so this module stays below it.
    propose: Callable[[str, dict[str, Any], str, str], Operation]


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
        key = key_check(ctx.task.pk, ctx.name, hexdigest, attempt)
        op = ctx.propose(config["tool"], params, f"check:{ctx.name}", key)
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
        try:
            checker = checker_for(str(spec.get("checker") or ""))
        except InvalidInput as exc:
            raise type(exc)(exc.message, code=exc.code, field=f"{at}.checker") from None
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
