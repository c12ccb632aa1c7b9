"""Who is working on what, in the people's queues: a person takes an item (an approval request on
/approvals/, an unresolved operation or work stopped for a person on /unresolved/) so the others
leave it to them, hands it to someone who may act on it, or releases it; and anyone who works
the queue comments on it.

Each change is journalled on the item's task with its actor (``claim.taken``, ``claim.given``,
``claim.released``, ``comment.added``): the journal's hint after commit is what moves every open
queue page within a second (runtime.events, console FeedConsumer). A claim is coordination, not
a lock: it decides what leaves the others' "to do", never who may decide (the release gate and
the resolutions keep their own rules). One holder per item is the database's unique key; a
claim returns to everyone ``CLAIM_RETURN_MINUTES`` after it was taken, decided at read time
(runtime.selectors.worklist)."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor, actor_for_user
from runtime.crashpoints import crash_point
from runtime.errors import Conflict, InvalidInput, NotAuthorized, NotFound
from runtime.events import event_append_txn
from runtime.models import Claim, Event, Operation
from runtime.models.worklist import QUEUE_APPROVALS, QUEUE_UNRESOLVED, QUEUES
from runtime.policy import can_work_on
from runtime.rules.statuses import OperationStatus
from runtime.selectors.operations import operation_get
from runtime.selectors.worklist import COMMENTED, returned

S = OperationStatus

TAKEN = "claim.taken"
GIVEN = "claim.given"
RELEASED = "claim.released"
MAX_COMMENT = 4000

# The statuses in which an operation waits in each queue (what may be taken there).
_WAITING = {
    QUEUE_APPROVALS: (S.WAITING_APPROVAL,),
    QUEUE_UNRESOLVED: (S.UNRESOLVED, S.MANUAL_INTERVENTION),
}


class ItemTaken(Conflict):
    """Someone else holds the item."""

    code = "item_taken"


class NotHolder(Conflict):
    """The item is not the actor's to release."""

    code = "not_holder"


def _checked(actor: Actor, queue: str) -> None:
    if queue not in QUEUES:
        raise InvalidInput(f"queue must be one of {', '.join(QUEUES)}")
    can_work_on(actor, queue)


def _waiting_item(actor: Actor, queue: str, operation_id: str) -> Operation:
    """The operation behind the item, if the actor sees it (NotFound) and it waits in ``queue``
    now (Conflict ``item_settled``: someone settled it meanwhile)."""
    op = operation_get(actor, operation_id)
    if op.status not in _WAITING[queue]:
        raise Conflict(
            f"operation {op.pk} no longer waits in the {queue} queue (it is {op.status})",
            code="item_settled",
        )
    return op


def _journal_txn(op: Operation, actor: Actor, type: str, now: datetime, **data: object) -> Event:
    event, _ = event_append_txn(
        task_id=op.task_id,
        type=type,
        state_version=None,
        now=now,
        operation_id=op.pk,
        actor=actor.label,
        data=dict(data),
    )
    return event


def _held_refusal(claim: Claim) -> ItemTaken:
    return ItemTaken(
        f"{claim.holder.get_username()} has it since {claim.taken_at:%H:%M:%S %Z}: ask them to "
        "hand it over or release it"
    )


def _hold_txn(op: Operation, queue: str, by: Actor, holder_id: int, now: datetime) -> Claim:
    """Make ``holder_id`` the item's holder as of ``now``, on behalf of ``by``: allowed when
    nobody holds it (a returned claim counts as nobody) or ``by`` does. Two takers racing on an
    unheld item both insert; the unique key lets one commit and fails the other (ItemTaken)."""
    Claim.objects.filter(returned(now), operation=op, queue=queue).delete()
    given_by = "" if holder_id == by.user_id else by.label
    current = Claim.objects.select_for_update().filter(operation=op, queue=queue).first()
    if current is not None:
        if current.holder_id != by.user_id:
            raise _held_refusal(current)
        current.holder_id, current.taken_at, current.given_by = holder_id, now, given_by
        current.save(update_fields=["holder", "taken_at", "given_by"])
        return current
    crash_point("worklist.unheld")
    try:
        with transaction.atomic():
            return Claim.objects.create(
                operation=op, queue=queue, holder_id=holder_id, taken_at=now, given_by=given_by
            )
    except IntegrityError:
        winner = Claim.objects.select_related("holder").get(operation=op, queue=queue)
        raise _held_refusal(winner) from None


def claim_take(actor: Actor, queue: str, operation_id: str) -> Claim:
    """``claim_take_txn`` in a transaction of its own."""
    with transaction.atomic(durable=True):
        return claim_take_txn(actor, queue, operation_id)


def claim_take_txn(actor: Actor, queue: str, operation_id: str) -> Claim:
    """Take an item: it leaves the others' "to do" until it is released, handed over or
    returns. Taking one's own item again renews it (its return clock starts again).

    Preconditions: ``actor`` works ``queue`` (runtime.policy.can_work_on, 403), sees the
    operation (404) and it waits in ``queue`` (409 ``item_settled``); nobody else holds it
    (409 ``item_taken``, naming the holder). Runs in the caller's transaction."""
    _checked(actor, queue)
    now = timezone.now()
    op = _waiting_item(actor, queue, operation_id)
    claim = _hold_txn(op, queue, actor, actor.user_id or 0, now)
    _journal_txn(op, actor, TAKEN, now, queue=queue, holder=actor.name)
    return claim


def claim_give(actor: Actor, queue: str, operation_id: str, *, to: str) -> Claim:
    """``claim_give_txn`` in a transaction of its own."""
    with transaction.atomic(durable=True):
        return claim_give_txn(actor, queue, operation_id, to=to)


def claim_give_txn(actor: Actor, queue: str, operation_id: str, *, to: str) -> Claim:
    """Hand an item to the person named ``to`` (a username), who must work ``queue`` too
    (InvalidInput, 400, naming why not). The holder hands it over; an item nobody holds may be
    handed by anyone who works the queue.

    Preconditions: as ``claim_take_txn``. Runs in the caller's transaction."""
    _checked(actor, queue)
    person = get_user_model().objects.filter(username=to, is_active=True).first()
    if person is None:
        raise InvalidInput(f"there is no active person named {to!r}")
    receiver = actor_for_user(person.pk, person.get_username())
    try:
        can_work_on(receiver, queue)
    except NotAuthorized as exc:
        raise InvalidInput(f"{to} may not work this item: {exc}") from None
    now = timezone.now()
    op = _waiting_item(actor, queue, operation_id)
    claim = _hold_txn(op, queue, actor, person.pk, now)
    _journal_txn(op, actor, GIVEN, now, queue=queue, holder=receiver.name)
    return claim


def claim_release(actor: Actor, queue: str, operation_id: str) -> None:
    """``claim_release_txn`` in a transaction of its own."""
    with transaction.atomic(durable=True):
        claim_release_txn(actor, queue, operation_id)


def claim_release_txn(actor: Actor, queue: str, operation_id: str) -> None:
    """Give an item back to everyone's "to do".

    Preconditions: ``actor`` works ``queue`` (403) and sees the operation (404); ``actor``
    holds the item now (409 ``not_holder``: someone else's, nobody's, or returned). Runs in the
    caller's transaction."""
    _checked(actor, queue)
    now = timezone.now()
    op = operation_get(actor, operation_id)
    claim = (
        Claim.objects.select_for_update()
        .filter(operation=op, queue=queue)
        .exclude(returned(now))
        .first()
    )
    if claim is None or claim.holder_id != actor.user_id:
        raise NotHolder("you do not hold this item: nothing was released")
    claim.delete()
    _journal_txn(op, actor, RELEASED, now, queue=queue)


def _comment_text(text: str) -> str:
    """The comment as stored (a textarea's CRLF kept as LF, trimmed), or InvalidInput."""
    text = (text or "").replace("\r\n", "\n").strip()
    if not text:
        raise InvalidInput("write the comment first: it is empty")
    if len(text) > MAX_COMMENT:
        raise InvalidInput(f"a comment has at most {MAX_COMMENT} characters")
    # What PostgreSQL's jsonb cannot hold is refused here, never a 500 from the insert.
    if "\x00" in text:
        raise InvalidInput("a comment may not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("a comment may not contain unpaired surrogates") from None
    return text


def comment_add(actor: Actor, queue: str, operation_id: str, *, text: str) -> Event:
    """``comment_add_txn`` in a transaction of its own."""
    with transaction.atomic(durable=True):
        return comment_add_txn(actor, queue, operation_id, text=text)


def comment_add_txn(actor: Actor, queue: str, operation_id: str, *, text: str) -> Event:
    """Comment on an item: a journal event of its task, naming the actor, shown on the item in
    the queue (as text, never markup). Allowed on an item settled meanwhile: a note on what was
    decided is still worth keeping.

    Preconditions: ``actor`` works ``queue`` (403) and sees the operation (404), which belongs
    to the queue (an approval request's operation needs approval; 404 otherwise); ``text`` is
    not blank and at most MAX_COMMENT characters (400). Runs in the caller's transaction."""
    _checked(actor, queue)
    text = _comment_text(text)
    now = timezone.now()
    op = operation_get(actor, operation_id)
    if queue == QUEUE_APPROVALS and not op.approval_required:
        raise NotFound("no such approval request")
    return _journal_txn(op, actor, COMMENTED, now, queue=queue, text=text)
