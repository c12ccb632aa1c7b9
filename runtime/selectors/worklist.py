"""Reads of who is working on what (runtime.worklist writes it): the live holder of each item of
a people's queue, the comments on them, the people an item may be handed to, and the views a
queue is filtered by ("to do", "mine", "all").

A claim returns at read time: it counts as held while it is younger than
``CLAIM_RETURN_MINUTES``. Nothing has to run for a forgotten item to come back, no sweeper pass
can be late or race a holder renewing it, and a reader at any moment sees exactly the rule."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q

from runtime.actors import ROLE_ADMIN, ROLE_OPERATOR, ROLE_SUPPORT, Actor
from runtime.errors import InvalidInput
from runtime.models import Claim, Event, Operation
from runtime.models.worklist import QUEUE_APPROVALS, QUEUES
from runtime.policy import can_read_worklist
from runtime.selectors.operations import operation_get

COMMENTED = "comment.added"

VIEW_TODO = "todo"
VIEW_MINE = "mine"
VIEW_ALL = "all"
# The views a queue page offers, as it names them; the first is the default.
VIEWS = {VIEW_TODO: "To do", VIEW_MINE: "Mine", VIEW_ALL: "All"}


def claim_return_after() -> timedelta:
    return timedelta(minutes=int(settings.CLAIM_RETURN_MINUTES))


def claim_cutoff(now: datetime) -> datetime:
    """Claims taken before this have returned to everyone."""
    return now - claim_return_after()


def returned(now: datetime) -> Q:
    """The claims that no longer hold: taken before the cutoff, or held by an account that
    was deactivated (someone who left cannot come back for it)."""
    return Q(taken_at__lt=claim_cutoff(now)) | Q(holder__is_active=False)


def claims_live(queue: str, operation_ids: Iterable[str], now: datetime) -> dict[str, Claim]:
    """The live claim of each item of ``queue`` (by operation id) that has one, with its holder."""
    found = (
        Claim.objects.filter(queue=queue, operation_id__in=list(operation_ids))
        .exclude(returned(now))
        .select_related("holder")
    )
    return {claim.operation_id: claim for claim in found}


def comments_of(operation_ids: Iterable[str]) -> dict[str, list[Event]]:
    """The comments on each operation (journal events, oldest first), in one query."""
    ids = list(operation_ids)
    found: dict[str, list[Event]] = {op_id: [] for op_id in ids}
    rows = Event.objects.filter(operation_id__in=ids, type=COMMENTED).order_by("at", "id")
    for event in rows:
        found[str(event.operation_id)].append(event)
    return found


def work_item(
    actor: Actor, queue: str, operation_id: str, now: datetime
) -> tuple[Operation, Claim | None, list[Event]]:
    """An item of ``queue`` as the API reads it: the operation (NotFound when unseen), its live
    claim (None: nobody holds it) and its comments. Needs a console role (``can_read_worklist``).
    """
    can_read_worklist(actor)
    if queue not in QUEUES:
        raise InvalidInput(f"queue must be one of {', '.join(QUEUES)}")
    op = operation_get(actor, operation_id)
    return op, claims_live(queue, [op.pk], now).get(op.pk), comments_of([op.pk])[op.pk]


def people_for(queue: str) -> list[tuple[int, str]]:
    """Active people an item of ``queue`` may be handed to (runtime.policy.can_work_on's rule on
    their roles), as (user id, username), by name."""
    role = ROLE_OPERATOR if queue == QUEUE_APPROVALS else ROLE_SUPPORT
    users = get_user_model().objects.filter(
        Q(groups__name__in=(role, ROLE_ADMIN)) | Q(is_superuser=True), is_active=True
    )
    return sorted(set(users.values_list("pk", "username")), key=lambda p: p[1])


def in_view(view: str, claim: Claim | None, actor: Actor) -> bool:
    """Whether an item with this live claim (None: nobody holds it) is in ``view`` for
    ``actor``: "to do" is what nobody holds and what is the actor's; "mine" only the actor's."""
    mine = claim is not None and claim.holder_id == actor.user_id
    if view == VIEW_MINE:
        return mine
    if view == VIEW_TODO:
        return claim is None or mine
    return True
