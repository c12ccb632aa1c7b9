"""Notification triggers: where a situation people must hear of becomes true (an approval
requested, a task failed, an operation unresolved), one ``NotificationEvent`` row is written in
that same transaction, and nothing else: no recipient is looked up and nothing is sent there.
After the commit a hint asks a worker to fan it out (runtime.notifications); the sweeper fans
out whatever a lost hint left. The row's ``dedupe`` is unique, so a situation is noted once."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from runtime.models import Approval, NotificationEvent
from runtime.models.notifications import NotificationKind
from runtime.publish import NOTIFY_DISPATCH, publish

log = logging.getLogger(__name__)

K = NotificationKind
# Tools whose operations never notify of themselves (a failing notification would notify).
NOTIFY_TOOL_PREFIX = "notify."


def notice_txn(
    kind: str,
    dedupe: str,
    *,
    task_id: str | None,
    actor: str,
    now: datetime,
    approval_id: str | None = None,
    operation_id: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Record that ``kind`` happened (once per ``dedupe``), in the caller's transaction, and
    hint the dispatch after it commits. Preconditions: inside the originating transaction."""
    NotificationEvent.objects.bulk_create(
        [
            NotificationEvent(
                kind=kind,
                dedupe=f"{kind}:{dedupe}"[:300],
                task_id=task_id,
                approval_id=approval_id,
                operation_id=operation_id,
                data=data or {},
                actor=actor or "system:runtime",
                created_at=now,
            )
        ],
        ignore_conflicts=True,
    )
    transaction.on_commit(notify_hint)


def notify_hint() -> None:
    """Ask a worker to fan out and send what is due; a lost hint waits for the sweeper."""
    try:
        publish(NOTIFY_DISPATCH)
    except Exception:
        log.warning("notification hint not published; the sweeper will send", exc_info=True)


def approval_noticed_txn(approval: Approval, *, actor: str, now: datetime) -> None:
    """A request waits for a decision (new, edited or reopened): its approvers should know."""
    notice_txn(
        K.APPROVAL_REQUESTED,
        f"{approval.pk}:{approval.state_version}",
        task_id=approval.task_id,
        approval_id=approval.pk,
        operation_id=approval.operation_id,
        actor=actor,
        now=now,
        data={
            "tool": approval.tool,
            "params_hash": approval.params_hash,
            "proposal_version": approval.proposal_version,
            "approver_role": approval.approver_role,
            "expires_at": approval.expires_at.isoformat(),
        },
    )


def unresolved_noticed_txn(
    *, operation_id: str, task_id: str, tool: str, state_version: int, actor: str, now: datetime
) -> None:
    """An operation's outcome needs a person (support staff)."""
    if tool.startswith(NOTIFY_TOOL_PREFIX):
        return
    notice_txn(
        K.OPERATION_UNRESOLVED,
        f"{operation_id}:{state_version}",
        task_id=task_id,
        operation_id=operation_id,
        actor=actor,
        now=now,
        data={"tool": tool},
    )


def task_failed_noticed_txn(*, task_id: str, reason: str, actor: str, now: datetime) -> None:
    notice_txn(
        K.TASK_FAILED,
        task_id,
        task_id=task_id,
        actor=actor,
        now=now,
        data={"reason": reason[:500]},
    )
