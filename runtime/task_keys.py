"""Get-or-create a task by the caller's own key (``external_id``): an agent restarted after a
crash creates its task again under the same key and finds the one it had, as an operation
proposed again under its key finds the operation.

The key is unique per owner (an agent, or the user who created the task): the database's
unique constraints (runtime.models.Task) arbitrate between concurrent first creations, never a
read before the write. The creation input is bound to the key by its canonical hash, compared
as an operation's parameters are: the same input returns the task as it is now, other input is
refused with 422 ``idempotency_key_reused`` naming ``external_id`` (the key was used for
another request: the ``Idempotency-Key`` header's refusal, and a proposal's)."""

from __future__ import annotations

from dataclasses import asdict

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.crashpoints import crash_point
from runtime.errors import IdempotencyKeyReused, InvalidInput
from runtime.hashing import params_hash
from runtime.models import Task
from runtime.policy import can_create_task
from runtime.tasks import CheckedTaskSpec, TaskSpec, task_create_txn, task_spec_check


def task_spec_hash(spec: CheckedTaskSpec) -> str:
    """The canonical hash of what a task is created from (name, input, deadline, budget,
    parent, required checks, compensations), its key left out. Pure."""
    fields = asdict(spec)
    fields.pop("external_id")
    return params_hash(fields)


def task_get_or_create(actor: Actor, spec: TaskSpec) -> tuple[Task, bool]:
    """Create a task, or, for an ``external_id`` the actor already created a task under, find
    that task; returns (task, created).

    Preconditions: ``spec`` was parsed by the transport (types checked); the domain limits are
    checked here (task_spec_check). Raises IdempotencyKeyReused (422) when the key's task was
    created from other input, InvalidInput for a key without an owner to hold it (the runtime's
    own tasks), and what task_create raises. Safe under any concurrency: of concurrent first
    creations under one key, one inserts and the others find its task once it committed."""
    can_create_task(actor)
    checked = task_spec_check(spec)
    now = timezone.now()
    if checked.external_id is None:
        with transaction.atomic():
            return task_create_txn(actor, checked, now=now), True
    if actor.kind not in ("agent", "user"):
        raise InvalidInput("external_id needs an agent or a user to own it", field="external_id")
    digest = task_spec_hash(checked)
    with transaction.atomic():
        existing = _keyed(actor, checked.external_id)
        if existing is None:
            crash_point("task_key.after_lookup")
            try:
                # A savepoint: on PostgreSQL a concurrent creation under the key makes this
                # insert wait for its commit and then fail; the transaction goes on to read it.
                with transaction.atomic():
                    return task_create_txn(actor, checked, now=now, spec_hash=digest), True
            except IntegrityError:
                existing = _keyed(actor, checked.external_id)
                if existing is None:
                    raise
        if existing.spec_hash != digest:
            raise IdempotencyKeyReused(
                "this external_id names a task created with other input", field="external_id"
            )
        return existing, False


def _keyed(actor: Actor, external_id: str) -> Task | None:
    """The actor's own task under ``external_id`` (read through the key's unique index)."""
    if actor.kind == "agent":
        owned = Task.objects.filter(agent_id=actor.agent_id)
    else:
        owned = Task.objects.filter(agent_id__isnull=True, created_by_id=actor.user_id)
    return owned.filter(external_id=external_id).select_related("current_attempt").first()
