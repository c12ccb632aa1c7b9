"""Reads of artifacts (selectors): one or a task's list (scoped by the task's visibility), the
task's manifest, an artifact's bytes, how far they are verified, and their provenance as an
in-toto statement."""

from __future__ import annotations

from datetime import datetime
from typing import IO, Any

from runtime import artifact_store as store
from runtime.actors import Actor
from runtime.errors import NotFound
from runtime.models import Artifact, ArtifactStatus, CheckResult
from runtime.policy import task_scope
from runtime.selectors.tasks import task_get

A = ArtifactStatus


def artifact_get(actor: Actor, artifact_id: str) -> Artifact:
    """The artifact if its task is visible to the actor; NotFound otherwise."""
    artifact = (
        Artifact.objects.filter(task_scope(actor, "task__"), pk=artifact_id)
        .select_related("operation", "attempt")
        .first()
    )
    if artifact is None:
        raise NotFound("no such artifact")
    return artifact


def artifact_list(actor: Actor, task_id: str, limit: int = 200) -> list[Artifact]:
    task_get(actor, task_id)
    return list(
        Artifact.objects.filter(task_id=task_id)
        .select_related("operation", "attempt")
        .order_by("-created_at", "-id")[:limit]
    )


def artifacts_current(task_id: str) -> dict[str, Artifact]:
    """The task's manifest: the accepted artifact per name."""
    rows = Artifact.objects.filter(task_id=task_id, status=A.ACCEPTED)
    return {a.name: a for a in rows}


def artifact_content(actor: Actor, artifact_id: str) -> tuple[Artifact, IO[bytes]]:
    """The artifact and an open stream of its bytes (stored, accepted or superseded ones)."""
    artifact = artifact_get(actor, artifact_id)
    if artifact.status not in (A.STORED, A.ACCEPTED, A.SUPERSEDED):
        raise NotFound(f"artifact {artifact.pk} has no stored content ({artifact.status})")
    try:
        return artifact, store.content_open(artifact.storage_key)
    except store.ContentMissing:
        raise NotFound("the artifact's content is no longer stored") from None


def verification_of(artifact: Artifact, checks: list[CheckResult]) -> str:
    """How far the artifact's bytes are verified, for labelling partial artifacts:
    ``passed``/``failed`` from its newest current checks, else ``unverified``. Pure."""
    mine = [c for c in checks if c.subject_id == artifact.pk and not c.stale]
    if not mine:
        return "unverified"
    if any(c.result != CheckResult.PASSED for c in mine):
        return "failed"
    return "passed"


def provenance_statement(artifact: Artifact) -> dict[str, Any]:
    """An in-toto Statement (v1) with a SLSA provenance (v1) predicate for the artifact. Pure
    given the artifact and its related rows."""
    op = artifact.operation
    attempt = artifact.attempt
    external: dict[str, Any] = {"task": artifact.task_id, "name": artifact.name}
    if op is not None:
        external["operation"] = {
            "id": op.pk,
            "tool": op.tool,
            "tool_version": op.tool_version,
            "step": op.step,
            "idempotency_key": op.idempotency_key,
            "params_hash": op.params_hash,
        }
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": artifact.name, "digest": {"sha256": store.hex_of(artifact.digest)}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://agent-console.dev/artifact/v1",
                "externalParameters": external,
                "internalParameters": {
                    "attempt": {"id": attempt.pk, "number": attempt.number} if attempt else None,
                    "media_type": artifact.media_type,
                    "size": artifact.size,
                },
                "resolvedDependencies": [
                    {
                        "name": d.get("name") or d.get("artifact") or "input",
                        "digest": {"sha256": store.hex_of(d["digest"])},
                        **({"annotations": {"artifact": d["artifact"]}} if "artifact" in d else {}),
                    }
                    for d in artifact.input_digests
                ],
            },
            "runDetails": {
                "builder": {
                    "id": "https://agent-console.dev/runtime",
                    "version": {"agent-console": artifact.code_version},
                },
                "metadata": {
                    "invocationId": artifact.execution_id or (op.pk if op else artifact.pk),
                    "startedOn": _iso(artifact.created_at),
                    "finishedOn": _iso(artifact.updated_at),
                },
                "byproducts": [
                    {
                        "name": "artifact",
                        "annotations": {"id": artifact.pk, "stage": artifact.status},
                    }
                ],
            },
        },
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None
