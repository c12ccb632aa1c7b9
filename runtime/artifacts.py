"""Artifacts: the bytes a task retains, through three stages.

``staged``: the row (intent, provenance, and, before any byte is written, the content address)
commits first, so a crash at any later point leaves something the reconciler can find.
``stored``: the bytes were written under their sha256 address and read back, streamed, with the
same size and digest. ``accepted``: the task's manifest entry for the name, committed only if the
task's ``state_version`` is the one the caller expected; accepting a name again supersedes the
previous entry and makes the checks made on it stale.

Storage calls never run inside a database transaction: each stage commits on its own. Here:
names, upload and acceptance; the reads are in runtime.selectors.artifacts, the sweeper's
reconciliation in runtime.artifact_reconciliation."""

from __future__ import annotations

import re
import time
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runtime import artifact_store as store
from runtime.actors import Actor
from runtime.crashpoints import crash_point
from runtime.errors import (
    Conflict,
    InvalidInput,
    PayloadTooLarge,
    StorageUnavailable,
    TaskRefused,
    TransitionRejected,
    UnsupportedMediaType,
)
from runtime.events import event_append_txn
from runtime.models import Artifact, ArtifactStatus, CheckResult, ContentKey, Operation, Task
from runtime.policy import allowed, can_write_outcomes
from runtime.rules.statuses import TaskCondition
from runtime.selectors.artifacts import artifact_get
from runtime.selectors.tasks import task_get
from runtime.text import name_check
from runtime.transitions.status import task_transition_txn

A = ArtifactStatus


_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def artifact_name_clean(raw: str) -> str:
    """A name is a label, never a path (bytes live under their digest). Refuse what could trick a
    person or a file system later: control and bidi-override characters, path separators,
    ``.``/``..``, leading dots or dashes. Pure."""
    name = unicodedata.normalize("NFC", raw.strip())
    if not name:
        raise InvalidInput("name must not be empty")
    if len(name) > 200:
        raise InvalidInput("name is longer than 200 characters")
    name_check(name, "name")
    if "/" in name or "\\" in name:
        raise InvalidInput("name must not contain path separators")
    if name in (".", "..") or name.startswith((".", "-")):
        raise InvalidInput("name must not start with a dot or a dash")
    return name


def media_type_clean(raw: str) -> str:
    """The base media type, lower case, if the configuration allows it. Pure."""
    base = raw.split(";", 1)[0].strip().lower()
    if not base:
        raise InvalidInput("media_type is required")
    allowed = [m.lower() for m in settings.ARTIFACT_MEDIA_TYPES]
    if base not in allowed:
        raise UnsupportedMediaType(f"media type {base!r} is not allowed here")
    return base


def may_write(actor: Actor, task: Task) -> bool:
    return allowed(can_write_outcomes, actor, task)


def _authorize_write(actor: Actor, task: Task) -> None:
    can_write_outcomes(actor, task)


@dataclass
class UploadSpec:
    name: str
    media_type: str
    operation_id: str | None = None
    # Provenance: artifacts of this task the content was made from, and other input digests.
    inputs: list[str] = field(default_factory=list)
    input_digests: list[str] = field(default_factory=list)


def _provenance(task: Task, spec: UploadSpec) -> dict[str, Any]:
    operation = None
    if spec.operation_id:
        operation = Operation.objects.filter(pk=spec.operation_id, task=task).first()
        if operation is None:
            raise InvalidInput("operation is not an operation of this task")
    inputs: list[dict[str, str]] = []
    for artifact_id in spec.inputs:
        source = Artifact.objects.filter(pk=artifact_id, task=task).exclude(digest="").first()
        if source is None:
            raise InvalidInput(f"input {artifact_id} is not a stored artifact of this task")
        inputs.append({"name": source.name, "artifact": source.pk, "digest": source.digest})
    for digest in spec.input_digests:
        if not _DIGEST.match(digest):
            raise InvalidInput("input digests are written sha256:<64 hex digits>")
        inputs.append({"digest": digest})
    return {
        "operation": operation,
        "attempt_id": operation.attempt_id if operation else task.current_attempt_id,
        "execution_id": operation.execution_id if operation else None,
        "input_digests": inputs,
    }


def artifact_upload(actor: Actor, task_id: str, spec: UploadSpec, content: IO[bytes]) -> Artifact:
    """Stage, store and verify an artifact of the task; returns it ``stored``.

    Preconditions: the actor is the task's agent or an admin; the task has not ended;
    ``content`` is a seekable binary file (Django's upload: on disk when large). Raises
    ``PayloadTooLarge``/``UnsupportedMediaType``/``InvalidInput`` before anything is written,
    ``StorageUnavailable`` when the bytes could not be stored and verified (the row is then
    ``failed`` and the reconciler reclaims whatever reached the storage)."""
    artifact = _stage(actor, task_id, spec)
    _store(artifact, content, actor.label)
    return artifact_mark_stored(artifact.pk, actor.label, reason="")


def _stage(actor: Actor, task_id: str, spec: UploadSpec) -> Artifact:
    """The ``staged`` row (intent and provenance), committed before any byte is read."""
    task = task_get(actor, task_id)
    _authorize_write(actor, task)
    if task.condition == TaskCondition.TERMINAL:
        raise TaskRefused("the task has ended", code="task_terminal")
    name = artifact_name_clean(spec.name)
    media_type = media_type_clean(spec.media_type)
    provenance = _provenance(task, spec)
    now = timezone.now()
    with transaction.atomic():
        artifact = Artifact.objects.create(
            task=task,
            name=name,
            media_type=media_type,
            operation=provenance["operation"],
            attempt_id=provenance["attempt_id"],
            execution_id=provenance["execution_id"],
            code_version=settings.CODE_VERSION,
            input_digests=provenance["input_digests"],
            created_by=actor.label,
        )
        artifact_event_txn(artifact, "artifact.staged", now, actor.label)
    return artifact


def _store(artifact: Artifact, content: IO[bytes], actor: str) -> None:
    """Measure the bytes, claim their address, write and read them back; a failure marks the
    row ``failed`` (or leaves it staged for the reconciler when only the read-back failed)."""
    try:
        measured = store.measure(store.file_chunks(content), limit=settings.ARTIFACT_MAX_BYTES)
    except store.TooLarge:
        artifact_fail(artifact, "larger than ARTIFACT_MAX_BYTES", actor)
        raise PayloadTooLarge(
            f"the artifact is larger than {settings.ARTIFACT_MAX_BYTES} bytes"
        ) from None
    # The content address is recorded before any byte is written: a crash after the write
    # leaves a staged row naming the key, which the reconciler verifies and recovers.
    key = store.content_key(measured.hexdigest)
    try:
        _content_claim(artifact.pk, key, measured)
    except StorageUnavailable as exc:
        artifact_fail(artifact, str(exc), actor)
        raise
    try:
        store.content_put(key, content, measured=measured, media_type=artifact.media_type)
    except Exception as exc:
        artifact_fail(artifact, f"storage error: {type(exc).__name__}", actor)
        raise StorageUnavailable("the artifact storage did not take the bytes") from exc
    try:
        crash_point("artifact.after_put")
        problem = store.content_verify(key, measured)
    except Exception as exc:
        # The storage took the bytes but could not read them back just now: the row stays
        # staged, and the reconciler verifies and recovers it after the staging grace, as it
        # does for an upload whose process died here.
        raise StorageUnavailable(
            "the bytes were stored but could not be read back yet; the artifact is recovered "
            f"once they verify (id {artifact.pk})"
        ) from exc
    if problem is not None:
        artifact_fail(artifact, problem, actor)
        raise StorageUnavailable(f"the stored bytes did not verify: {problem}")


def content_lock_txn(key: str) -> ContentKey:
    """Lock the key's ContentKey row (created on first use) inside the caller's transaction. The
    lock is taken by a write, so it also serialises on SQLite, where SELECT ... FOR UPDATE does
    nothing."""
    ContentKey.objects.bulk_create([ContentKey(key=key)], ignore_conflicts=True)
    ContentKey.objects.filter(key=key).update(key=key)
    return ContentKey.objects.get(key=key)


def _content_claim(artifact_id: str, key: str, measured: store.Measured) -> None:
    """Record on the staged row that it needs the bytes under ``key``, under the key's lock.

    Either this commits first, and the reconciler (which decides under the same lock) sees a
    holding row and keeps the bytes; or the reconciler marked the key as being deleted first,
    and this waits until the deletion is done, so the bytes are then written anew. Never both:
    an upload is never told its bytes are stored while a deletion of them is under way."""
    deadline = time.monotonic() + settings.ARTIFACT_DELETION_WAIT_SECONDS
    while True:
        with transaction.atomic():
            if content_lock_txn(key).deleting_since is None:
                Artifact.objects.filter(pk=artifact_id, status=A.STAGED).update(
                    digest=measured.digest,
                    size=measured.size,
                    storage_key=key,
                    updated_at=timezone.now(),
                )
                # The row is only a lock anchor: the staged row now says the bytes are needed.
                ContentKey.objects.filter(key=key).delete()
                return
        if time.monotonic() >= deadline:
            raise StorageUnavailable("these bytes are being reclaimed from storage; retry")
        crash_point("artifact.awaiting_deletion")
        time.sleep(0.1)


def artifact_mark_stored(artifact_id: str, actor: str, *, reason: str) -> Artifact:
    now = timezone.now()
    with transaction.atomic():
        touched = Artifact.objects.filter(pk=artifact_id, status=A.STAGED).update(
            status=A.STORED, status_reason=reason, updated_at=now
        )
        artifact = Artifact.objects.get(pk=artifact_id)
        if touched != 1:
            raise Conflict(f"artifact {artifact_id} is {artifact.status}, not staged")
        artifact_event_txn(artifact, "artifact.stored", now, actor, reason=reason or None)
    return artifact


def artifact_fail(artifact: Artifact, reason: str, actor: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        touched = Artifact.objects.filter(pk=artifact.pk, status=A.STAGED).update(
            status=A.FAILED, status_reason=reason[:2000], updated_at=now
        )
        if touched:
            artifact.status = A.FAILED
            artifact_event_txn(artifact, "artifact.failed", now, actor, reason=reason)


def artifact_event_txn(
    artifact: Artifact, type: str, now: datetime, actor: str, **extra: Any
) -> None:
    data: dict[str, Any] = {
        "artifact": artifact.pk,
        "name": artifact.name,
        "status": artifact.status if type != "artifact.stored" else A.STORED,
    }
    if artifact.digest:
        data["digest"] = artifact.digest
    data.update({k: v for k, v in extra.items() if v is not None})
    event_append_txn(
        task_id=artifact.task_id,
        type=type,
        state_version=None,  # the task's: an artifact's stage changes no version of its own
        now=now,
        operation_id=artifact.operation_id,
        actor=actor,
        data=data,
    )


def artifact_accept(actor: Actor, artifact_id: str, *, expected_state_version: int) -> Artifact:
    """Make a stored artifact the task's manifest entry for its name, only if the task is still
    at ``expected_state_version``. Raises ``TransitionRejected`` (409 state_version_mismatch)
    otherwise, with nothing changed.

    Preconditions: the actor is the task's agent or an admin. In one transaction: the task's
    guarded version bump (its row lock serialises every acceptance and completion of the task),
    the previous entry of the name superseded and its checks marked stale, the new entry."""
    artifact = artifact_get(actor, artifact_id)
    task = task_get(actor, artifact.task_id)
    _authorize_write(actor, task)
    if task.condition == TaskCondition.TERMINAL:
        raise TaskRefused("the task has ended", code="task_terminal")
    if artifact.status != A.STORED:
        raise Conflict(f"artifact {artifact.pk} is {artifact.status}; only stored can be accepted")
    if task.state_version != expected_state_version:
        raise TransitionRejected(
            f"the task is at version {task.state_version}, not {expected_state_version}"
        )
    now = timezone.now()
    with transaction.atomic():
        # A zero-row guarded UPDATE here is the refusal: a concurrent change won.
        moved = task_transition_txn(
            task,
            now=now,
            fields={},
            event_type="artifact.accepted",
            actor=actor.label,
            data={"artifact": artifact.pk, "name": artifact.name, "digest": artifact.digest},
        )
        previous = list(
            Artifact.objects.filter(task_id=task.pk, name=artifact.name, status=A.ACCEPTED)
        )
        if previous:
            Artifact.objects.filter(pk__in=[p.pk for p in previous]).update(
                status=A.SUPERSEDED, status_reason=f"replaced by {artifact.pk}", updated_at=now
            )
            CheckResult.objects.filter(subject__in=previous).update(stale=True)
        touched = Artifact.objects.filter(pk=artifact.pk, status=A.STORED).update(
            status=A.ACCEPTED,
            accepted_by=actor.label,
            accepted_state_version=moved.state_version,
            accepted_at=now,
            updated_at=now,
        )
        if touched != 1:
            raise Conflict(f"artifact {artifact.pk} is no longer stored")
        crash_point("artifact.accept_before_commit")
    artifact.refresh_from_db()
    return artifact
